"""Is a llama.cpp deployment's ``model`` a GGUF dgxmm can read? Checked at create and edit
(issue 41 item 8), so that a path that does not exist, is not readable or is no GGUF is a 422
naming ``model`` and not an engine that fails at its first request.

Only what fails every start is checked: the path opens as a regular file (without blocking: a
FIFO is refused, not waited on) and begins with the GGUF magic. The read runs in a thread, never
on the event loop, and the request waits at most ``DEADLINE_S`` for it (a hung network mount is a
422 that says so); at most ``MAX_RUNNING`` reads are under way at once. Not checked:

* other engines (vLLM takes a Hugging Face name or a directory, a command names its own files);
* the docker runtime, where ``model`` is a path inside the container (``volumes`` maps it);
* a model string that ``is_deferred``: the model store's ``hf://`` models, which may not be
  downloaded yet when the deployment is created (the store checks them when they land).

Declared deployments (declared/models.py) are checked by the same rule, through ``bounded``.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from dgxmm.errors import DgxmmError, InvalidInput
from dgxmm.settings import Settings

DEADLINE_S = 3.0  # a local disk answers in milliseconds; a hung mount does not answer at all
MAX_RUNNING = 4  # reads in threads at once (one stuck on a dead mount holds its thread)
DEFERRED_PREFIXES = ("hf://",)
GGUF_MAGIC = b"GGUF"  # the first 4 bytes of every GGUF (deploy/ggufheader.py reads the rest)

_running = 0
T = TypeVar("T")


class ChecksBusy(DgxmmError):
    status = 503
    code = "server_busy"


def is_deferred(model: str) -> bool:
    """A model that is not a file yet (a store download): not checked here."""
    return model.startswith(DEFERRED_PREFIXES)


def is_checked(runtime: str, engine: str | None, model: str | None) -> bool:
    """Whether ``model`` is a file on this host that every start of ``engine`` opens."""
    return engine == "llamacpp" and bool(model) and runtime == "process" and not is_deferred(model or "")


def needs_check(settings: Settings, engine: str | None, model: str | None) -> bool:
    return is_checked(settings.runtime.kind, engine, model)


def why_not_gguf(path: Path) -> str | None:
    """None when ``path`` is a readable regular file that begins with the GGUF magic, else what is
    wrong, as a person reads it. Blocking: run it in a thread."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        return "no such file on this host"
    except PermissionError:
        return "dgxmm may not read it (permission denied)"
    except OSError as exc:
        return f"cannot open it: {exc.strerror or exc}"
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            return "a directory, not a .gguf file"
        if not stat.S_ISREG(info.st_mode):
            return "not a regular file"
        head = os.read(fd, len(GGUF_MAGIC))
    except OSError as exc:
        return f"cannot read it: {exc.strerror or exc}"
    finally:
        os.close(fd)
    if head != GGUF_MAGIC:
        return "not a GGUF file (it does not begin with the GGUF magic)"
    return None


async def bounded(work: Callable[[], T]) -> T:
    """``work`` (blocking reads of model files) run in a thread, waited for at most
    ``DEADLINE_S`` (``TimeoutError``; the thread is counted until it ends), with at most
    ``MAX_RUNNING`` under way at once (``ChecksBusy``)."""
    global _running
    if _running >= MAX_RUNNING:
        raise ChecksBusy(f"{MAX_RUNNING} model checks are reading their files already; try again")
    _running += 1
    reading = asyncio.ensure_future(asyncio.to_thread(work))
    reading.add_done_callback(_done)
    return await asyncio.wait_for(asyncio.shield(reading), DEADLINE_S)


async def check_model(settings: Settings, engine: str | None, model: str | None) -> None:
    """``InvalidInput`` (422, field ``model``) when a llama.cpp deployment's model cannot load."""
    if not needs_check(settings, engine, model):
        return
    assert model is not None
    try:
        why = await bounded(lambda: why_not_gguf(Path(model)))
    except TimeoutError:
        why = f"its file did not answer within {DEADLINE_S:g} s"
    if why is not None:
        raise InvalidInput(f"model: {model}: {why}", field="model")


def _done(reading: asyncio.Future[Any]) -> None:
    """The end of a read (on the loop's thread), even one whose request gave up waiting."""
    global _running
    _running -= 1
    if not reading.cancelled():
        reading.exception()
