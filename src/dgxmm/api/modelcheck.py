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
  downloaded yet when the deployment is created (the deployer checks their file the same way
  once it is downloaded, deploy/preparation.py). ``check_hub_model`` asks the hub instead:
  a repository, revision or file it does not have is a 422 naming ``model``, and a GGUF it lists
  larger than ``memory_gib`` the same 422 as a local one, before a byte is downloaded.

Declared deployments (declared/modelfiles.py) are checked by the same rule, through ``bounded``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from dgxmm.deploy.engines import ENGINES
from dgxmm.deploy.ggufheader import why_not_gguf as why_not_gguf  # (re-exported: declared/modelfiles.py reads it here)
from dgxmm.deploy.limits import GIB, check_file_size
from dgxmm.errors import DgxmmError, InvalidInput
from dgxmm.modelstore.store import ModelStore
from dgxmm.records.deployment import HUB_SCHEME
from dgxmm.settings import Settings

DEADLINE_S = 3.0  # a local disk answers in milliseconds; a hung mount does not answer at all
MAX_RUNNING = 4  # reads (and questions to the hub) in threads at once: one stuck holds its thread
DEFERRED_PREFIXES = (HUB_SCHEME,)

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


async def check_hub_model(settings: Settings, models: ModelStore, engine: str, model: str, memory_gib: float) -> None:
    """For a model a hub names: ``InvalidInput`` (422) when the hub says there is no such
    repository, revision or file, or when a llama.cpp file it lists is larger than
    ``memory_gib``; a file pulled already is checked as a local one. A hub that does not answer
    (``lookup`` gives None) lets the create go on: the deployment's pull then fails with the
    reason, and a start pulls again. The question counts as one of the ``MAX_RUNNING`` checks."""
    global _running
    if not model.startswith(HUB_SCHEME):
        return
    if _running >= MAX_RUNNING:  # (a hub that does not answer holds a thread for each question)
        raise ChecksBusy(f"{MAX_RUNNING} model checks are under way already; try again")
    _running += 1
    try:
        size = await models.lookup(model)
    finally:
        _running -= 1
    if size is not None and ENGINES[engine].memory_limit == "gguf":
        check_file_size(model, size / GIB, memory_gib)
    local = models.readiness_of(model).path
    if local is not None:
        await check_model(settings, engine, local)


def _done(reading: asyncio.Future[Any]) -> None:
    """The end of a read (on the loop's thread), even one whose request gave up waiting."""
    global _running
    _running -= 1
    if not reading.cancelled():
        reading.exception()
