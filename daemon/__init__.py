"""The running daemon: its lifecycle, the scheduled round, Alertmanager intake, reload and status."""
