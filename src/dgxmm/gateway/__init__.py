"""The on-demand gateway: the checks of every request, the key, the forwarding to the engine."""
