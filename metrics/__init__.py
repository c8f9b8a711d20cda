"""What the numbers mean: the daemon's own Prometheus metrics (``registry``, served on its
``/metrics``), the expected speedup of speculative decoding (``speedup``) and its k table as text
(``ktable``)."""
