"""Part of the vLLM stand-in (see api_server.py)."""
