"""The daemon's own Prometheus metrics (``registry``), served on its ``/metrics``."""
