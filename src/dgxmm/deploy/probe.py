"""HTTP probes of a running engine: health, listed models, sleep and wake calls.

Every probe has a short timeout of its own: a hung engine must read as unhealthy, not hang the
deployer. Probes never raise for network trouble; they report it.
"""

from __future__ import annotations

import aiohttp

PROBE_TIMEOUT = aiohttp.ClientTimeout(total=5.0)


async def healthy(
    http: aiohttp.ClientSession, base_url: str, path: str, timeout_s: float = 5.0, headers: dict[str, str] | None = None
) -> bool:
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with http.get(base_url + path, timeout=timeout, headers=headers) as resp:
            await resp.read()
            return resp.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def lists_model(
    http: aiohttp.ClientSession, base_url: str, served_name: str, headers: dict[str, str] | None = None
) -> bool:
    """Whether ``/v1/models`` names ``served_name``: health alone can answer before the model
    is loaded (llama.cpp answers 503 while loading, others may already say 200)."""
    try:
        async with http.get(base_url + "/v1/models", timeout=PROBE_TIMEOUT, headers=headers) as resp:
            if resp.status != 200:
                return False
            body = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return False
    data = body.get("data") if isinstance(body, dict) else None
    return isinstance(data, list) and any(isinstance(item, dict) and item.get("id") == served_name for item in data)


async def post(
    http: aiohttp.ClientSession,
    url: str,
    timeout_s: float = 60.0,
    headers: dict[str, str] | None = None,
    body: dict[str, object] | None = None,
) -> str | None:
    """POST (``body`` as JSON, else nothing); None on a 2xx answer, else what went wrong."""
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with http.post(url, timeout=timeout, headers=headers, json=body) as resp:
            text = await resp.text()
            return None if resp.status < 300 else f"HTTP {resp.status}: {text[:200]}"
    except (aiohttp.ClientError, TimeoutError) as exc:
        return f"{type(exc).__name__}: {exc}"
