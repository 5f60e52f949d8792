"""What a gateway request asks for, from its method and path: the routes of the per-deployment
gateway (``{base}/ondemand/{id}/v1/...``) and of the model router (``{router path}/...``).

Both serve the same traffic endpoints, the model list and a model's entry; what tells the
deployment apart is the ``target``: the deployment's id in the path, the model's name in the
path (the router's ``models/{name}``), or nothing (the router's traffic: the body names it).

A gateway sees few distinct paths, so each is checked and routed once and remembered
(``Memo``), but only for requests that showed a valid key and only for short paths: what a
caller without a key sends is never kept, and the memo's size is bounded in bytes, not only in
entries.
"""

from __future__ import annotations

from dataclasses import dataclass

TRAFFIC = frozenset(
    {
        "chat/completions",
        "completions",
        "embeddings",
        "responses",
        "messages",
        "chat/completions/batch",
        "audio/transcriptions",
        "audio/translations",
        "rerank",
        "score",
    }
)
# The router's traffic adds Anthropic's token count, which Claude Code and other agents call
# right before each turn: through one base URL for every model, a client's whole API must answer,
# so it takes a slot and cold-starts like a turn. The per-deployment routes keep the spec's list
# (LiteLLM's entries never call it there; docs/gateway.md).
# It also serves the routes that llama-swap and llama-server serve and users point tools at
# (issue 50): image generation and edits (stable-diffusion.cpp's server; an edit is a multipart
# form whose ``model`` field names the model, as an audio upload's does) and text to speech, a
# binary answer streamed through as it comes; and ``reranking``, llama-server's name for rerank,
# which some clients use.
# The Ollama API's empty prompt (``/api/generate`` with no prompt, ``/api/chat`` with no
# messages) loads its model, or with ``keep_alive: 0`` stops it: routes of the router that only
# a request of a dialect that ``translates`` reaches (``request.Dialect``; for any other, 404), and
# that take a slot (a load) or none (an unload) but send the engine nothing (``loading``).
LOAD, UNLOAD = "dgxmm/load", "dgxmm/unload"
OWN = frozenset({LOAD, UNLOAD})
MEDIA = frozenset({"images/generations", "images/edits", "audio/speech", "reranking"})
# llama-server's own completion routes, which editors' completion (llama.vscode) and its native
# clients call at the server's root: reached only by way of the root (``llamacpp.api``, a dialect
# that ``translates``) and forwarded to the engine's ``/infill`` and ``/completion``, not under /v1.
NATIVE = frozenset({"infill", "completion"})
ROUTER_TRAFFIC = TRAFFIC | {"messages/count_tokens"} | MEDIA | OWN | NATIVE
# llama-server's ``GET /props?model=NAME`` (``llamacpp.api``): the router's own answer, the query
# naming the model (``gateway.props``), forwarded to the engine's ``/props`` only when it is ready.
PROPS = "dgxmm/props"
TRANSLATED_ONLY = OWN | NATIVE | {PROPS}  # routes a request reaches only by way of a dialect that translates
AT_ROOT = NATIVE | {"props"}  # the engine's routes at its root, not under /v1


@dataclass(frozen=True)
class Route:
    kind: str  # "traffic", "models", "model" or "props"
    endpoint: str  # for traffic: "chat/completions"...
    target: str  # the deployment's id, the model's name, or "" (the body names the model)


MEMO_ENTRIES = 1024  # distinct paths remembered
MEMO_PATH_BYTES = 256  # a longer path is checked each time (no route of an engine is that long)


class Memo:
    """The checked segments and route of each (method, raw path, router or not) seen with a
    valid key: at most ``MEMO_ENTRIES`` paths of at most ``MEMO_PATH_BYTES`` bytes, the oldest
    forgotten first."""

    def __init__(self, entries: int = MEMO_ENTRIES, path_bytes: int = MEMO_PATH_BYTES) -> None:
        self._entries = entries
        self._path_bytes = path_bytes
        self._known: dict[tuple[str, bytes, bool], tuple[tuple[str, ...], Route | None]] = {}

    def get(self, method: str, raw_path: bytes, router: bool) -> tuple[tuple[str, ...], Route | None] | None:
        return self._known.get((method, raw_path, router))

    def keep(self, method: str, raw_path: bytes, router: bool, parts: tuple[str, ...], route: Route | None) -> None:
        """Remember a path whose request passed the key check."""
        if len(raw_path) > self._path_bytes:
            return
        known = self._known
        if len(known) >= self._entries:
            del known[next(iter(known))]
        known[(method, raw_path, router)] = (parts, route)

    def __len__(self) -> int:
        return len(self._known)


def by_id(method: str, parts: tuple[str, ...]) -> Route | None:
    """A route of the per-deployment gateway (``{id}/v1/...``); None for everything it does not
    serve."""
    if len(parts) < 3 or parts[1] != "v1":
        return None
    route = _route(method, parts[2:], TRAFFIC)
    return None if route is None else Route(route.kind, route.endpoint, parts[0])


def by_model(method: str, parts: tuple[str, ...]) -> Route | None:
    """A route of the model router (the path after its prefix): the model's name is in the path
    for ``models/{name}``, in the body for traffic."""
    if method == "GET" and "/".join(parts) == PROPS:
        return Route("props", PROPS, "")  # (the query names the model)
    route = _route(method, parts, ROUTER_TRAFFIC)
    if route is not None and route.kind == "model":
        return Route("model", route.endpoint, parts[1])
    return route


def _route(method: str, rest: tuple[str, ...], traffic: frozenset[str]) -> Route | None:
    endpoint = "/".join(rest)
    if method == "POST" and endpoint in traffic:
        return Route("traffic", endpoint, "")
    if method == "GET" and rest == ("models",):
        return Route("models", endpoint, "")
    if method in ("GET", "HEAD") and len(rest) == 2 and rest[0] == "models":
        return Route("model", endpoint, "")
    return None
