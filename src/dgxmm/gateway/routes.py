"""What a gateway request asks for, from its method and path: the routes of the per-deployment
gateway (``{base}/ondemand/{id}/v1/...``) and of the model router (``{router path}/...``).

Both serve the same traffic endpoints, the model list and a model's entry; what tells the
deployment apart is the ``target``: the deployment's id in the path, the model's name in the
path (the router's ``models/{name}``), or nothing (the router's traffic: the body names it).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

TRAFFIC = frozenset({
    "chat/completions", "completions", "embeddings", "responses", "messages",
    "chat/completions/batch", "audio/transcriptions", "audio/translations", "rerank", "score",
})  # fmt: skip


@dataclass(frozen=True)
class Route:
    kind: str  # "traffic", "models" or "model"
    endpoint: str  # for traffic: "chat/completions"...
    target: str  # the deployment's id, the model's name, or "" (the body names the model)


@lru_cache(maxsize=4096)
def by_id(method: str, parts: tuple[str, ...]) -> Route | None:
    """A route of the per-deployment gateway (``{id}/v1/...``); None for everything it does not
    serve. (Cached: a gateway sees few distinct routes, and each is worked out once.)"""
    if len(parts) < 3 or parts[1] != "v1":
        return None
    route = _route(method, parts[2:])
    return None if route is None else Route(route.kind, route.endpoint, parts[0])


@lru_cache(maxsize=4096)
def by_model(method: str, parts: tuple[str, ...]) -> Route | None:
    """A route of the model router (the path after its prefix): the model's name is in the path
    for ``models/{name}``, in the body for traffic."""
    route = _route(method, parts)
    if route is not None and route.kind == "model":
        return Route("model", route.endpoint, parts[1])
    return route


def _route(method: str, rest: tuple[str, ...]) -> Route | None:
    endpoint = "/".join(rest)
    if method == "POST" and endpoint in TRAFFIC:
        return Route("traffic", endpoint, "")
    if method == "GET" and rest == ("models",):
        return Route("models", endpoint, "")
    if method in ("GET", "HEAD") and len(rest) == 2 and rest[0] == "models":
        return Route("model", endpoint, "")
    return None
