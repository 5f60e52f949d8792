"""dgxmm: serve many LLM engines from one GPU host, starting models on demand."""

__version__ = "0.1.0"
