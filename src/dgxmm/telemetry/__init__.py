"""What dgxmm tells its operator about itself: Prometheus metrics, structured logs, request ids."""
