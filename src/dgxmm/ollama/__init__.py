"""Ollama's API on dgxmm's listener (``/api/...``, issue 49; docs/ollama.md).

Tools that speak only Ollama's API (Open WebUI's Ollama connection, VS Code Copilot's Ollama
provider, Continue, the ``ollama`` clients) reach every model of the host through it. The package
translates and nothing more: ``translate`` turns an Ollama request into the engine's OpenAI
request (pure functions, every bad input a ``BadInput``), ``answers`` turns the engine's OpenAI
answer into Ollama's (its NDJSON stream and final object), ``request.OllamaRequest`` wraps the
caller's request so that the gateway serves it as one of the router's (``/v1``): the same checks,
slots, cold start, queue and usage, with no second way to an engine.
"""
