"""What the daemon, the rules and the actions all use: the lowest layer, importing none of them."""
