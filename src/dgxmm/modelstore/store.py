"""The model store: every model's record, its pulls and their progress, on the event loop.

The records are frozen (``ModelRecord``) and this module is their one writer: every change is a
new record (``dataclasses.replace``) held in the old one's place by ``_changed`` (written to the
store, published) or ``_progress`` (a download's bytes, held only), so a reader keeps the record it
was handed as it was.

A pull's listing and its bytes are fetched off the loop (its bytes on a daemon thread), at most
``[models] max_concurrent_pulls`` at a time; the loop publishes ``model`` events (at least once
a second while bytes arrive, and at each status change) and writes the record at each status
change. A shutdown stops the transfers and leaves their records ``downloading``: the next start
resumes them (``resume``) from the partial blobs they left.

What a deployer asks, by the deployment's ``model`` (``hf://...``, names.py): ``lookup`` before
a deployment is created (does the hub have it), ``fetch`` (pull what is missing), ``files``
(here and verified, or how far the download is), and ``add_listener`` (told of every change and
progress tick). The deployer sees these through its own Protocol (deploy/preparation.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from dgxmm.errors import DgxmmError, InvalidInput, NotFound
from dgxmm.events import EventBus
from dgxmm.modelstore.browse import MAX_LISTINGS, HubRefused, ListingsBusy, here, offer
from dgxmm.modelstore.names import SCHEME, HubName, Readiness, parse, readiness
from dgxmm.modelstore.daemon import in_daemon_thread
from dgxmm.modelstore.layout import RepoFolder, UnsafePath, models_dir, name_checked, remove_files
from dgxmm.modelstore.pull import GIB, Release, present, run_pull
from dgxmm.modelstore.record import ModelFile, ModelRecord, Status, Transfer, model_id, selected
from dgxmm.modelstore.source import HubSource, Listing, NotOnHub, SourceError, Stopped
from dgxmm.onethread import Owner
from dgxmm.settings import ModelsSettings
from dgxmm.store.db import Store
from dgxmm.store.modeltable import delete_model, load_models, put_model

log = logging.getLogger(__name__)
CLOSE_WAIT_S = 2.0  # how long a shutdown waits for the transfers to stop
TICK_S = 0.5  # a downloading model's event this often
SPEED_SAMPLES = 10  # its speed: over the last this many ticks (5 s)
LOOKUP_TIMEOUT_S = 15.0  # a create asks the hub at most this long whether it has a model


class ModelInUse(DgxmmError):
    status = 409
    code = "model_in_use"


class ModelStore:
    def __init__(
        self,
        settings: ModelsSettings,
        data_dir: Path,
        db: Store,
        bus: EventBus,
        source: HubSource,
        users: Callable[[ModelRecord], list[str]] = lambda record: [],
        release: Release | None = None,
    ) -> None:
        self.settings = settings
        self.dir = models_dir(settings, data_dir)
        self.db = db
        self.bus = bus
        self.source = source
        self.users = users  # the deployments that use a model (the deployer's answer, by name)
        self._release = release  # a pulled file's pages out of the page cache (the policy's call)
        self._listeners: list[Callable[[], None]] = []
        self._owner = Owner("model store")
        loaded = [ModelRecord.from_row(row) for row in load_models(db)]
        self._records: dict[str, ModelRecord] = {record.id: record for record in loaded}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._transfers: dict[str, Transfer] = {}
        self._slots = asyncio.Semaphore(settings.max_concurrent_pulls)
        self._pulling: dict[str, asyncio.Lock] = {}
        self._speed: dict[str, float] = {}  # a downloading model's bytes a second, lately
        self._listings = 0  # listings asked of the hub now (``files``)

    # --- reading ----------------------------------------------------------------------------

    def all(self) -> list[ModelRecord]:
        return list(self._records.values())

    def get(self, model: str) -> ModelRecord:
        record = self._records.get(model)
        if record is None:
            raise NotFound(f"no model {model!r}")
        return record

    def view(self, record: ModelRecord) -> dict[str, Any]:
        """The record as the API and the ``model`` event show it, with the deployments that use
        it (``used_by``, names) and, while it downloads, its speed over the last seconds."""
        speed = self._speed.get(record.id) if record.status is Status.DOWNLOADING else None
        return {**record.view(), "used_by": sorted(self.users(record)), "bytes_per_s": speed}

    def disk(self) -> dict[str, Any]:
        """The models directory, its free space and what the store's models hold there."""
        self.dir.mkdir(parents=True, exist_ok=True)
        usage = shutil.disk_usage(self.dir)
        blobs: dict[str, int] = {}
        for record in self._records.values():
            for f in record.files:
                blobs[f"{record.repo}/{f.blob}"] = f.size if record.status is Status.READY else 0
        held = sum(blobs.values())
        return {
            "dir": str(self.dir),
            "free_gib": round(usage.free / GIB, 3),
            "total_gib": round(usage.total / GIB, 3),
            "reserve_gib": self.settings.reserve_gib,
            "held_gib": round(held / GIB, 3),
            "models": len(self._records),
        }

    async def files(self, repo: str, revision: str, include: list[str]) -> dict[str, Any]:
        """What a pull of ``repo`` at ``revision`` with ``include`` would fetch, asked of the hub
        now (browse.py): ``InvalidInput`` for a name that cannot be one, ``HubRefused`` with the
        hub's answer, ``ListingsBusy`` while ``MAX_LISTINGS`` are being asked."""
        name_checked(repo, revision)
        if self._listings >= MAX_LISTINGS:
            raise ListingsBusy(f"{MAX_LISTINGS} listings are being asked of the hub already: try again")
        self._listings += 1
        try:
            listing = await asyncio.to_thread(self.source.listing, repo, revision)
            wanted = set(selected([f.path for f in listing.files], include))
            chosen = [f for f in listing.files if f.path in wanted]
            present = await asyncio.to_thread(here, RepoFolder(self.dir, repo), chosen)
        except SourceError as exc:
            raise HubRefused(exc) from None
        finally:
            self._listings -= 1
        return offer(repo, revision, listing, include, present, self.source.token_file is not None)

    # --- pulling ----------------------------------------------------------------------------

    async def pull(
        self, repo: str, revision: str, include: list[str], user: str | None, actor: str = "api"
    ) -> tuple[ModelRecord, bool]:
        """The model's record, and whether a download was begun (False: it is all here, or
        already downloading). Input that cannot name files is ``InvalidInput``; what the hub
        refuses makes a ``failed`` record."""
        name_checked(repo, revision)
        key = model_id(repo, revision, include)
        lock = self._pulling.setdefault(key, asyncio.Lock())
        async with lock:  # two pulls of one model at once: the second finds what the first began
            return await self._pull(key, repo, revision, include, user, actor)

    async def _pull(
        self, key: str, repo: str, revision: str, include: list[str], user: str | None, actor: str
    ) -> tuple[ModelRecord, bool]:
        known = self._records.get(key)
        if known is not None and known.status is Status.DOWNLOADING:
            return known, False
        record = ModelRecord(key, repo, revision, list(include))
        if known is not None:
            record = replace(record, created_at=known.created_at)
        try:
            listing = await asyncio.to_thread(self.source.listing, repo, revision)
        except SourceError as exc:
            if known is not None and known.status is Status.READY and self._complete(RepoFolder(self.dir, repo), known):
                return known, False  # the hub cannot be asked now, but the model is all here
            return self._changed(replace(record, status=Status.FAILED, error=str(exc))), True
        self._owner.check()
        record = self._described(record, listing)
        folder = RepoFolder(self.dir, repo)
        assert record.commit is not None
        record = replace(record, path=str(folder.snapshot(record.commit)))
        self.bus.audit(
            "model_pull",
            actor=actor,
            user=user,
            deployment_id=None,
            new={"repo": repo, "revision": revision, "include": include, "commit": record.commit},
        )
        if self._complete(folder, record):
            return self._changed(replace(record, status=Status.READY, bytes_done=record.bytes_total)), False
        return self._begin(record), True

    def _described(self, record: ModelRecord, listing: Listing) -> ModelRecord:
        """``record`` with the commit and the files of ``listing`` its globs select."""
        by_path = {f.path: f for f in listing.files}
        chosen = selected(sorted(by_path), record.include)
        if not chosen:
            raise InvalidInput(
                f"include: {record.include} matches none of the {len(by_path)} files of {record.repo}@{record.revision}",
                field="include",
            )
        for path in chosen:
            try:
                RepoFolder(self.dir, record.repo).entry(listing.commit, path)
            except UnsafePath as exc:
                raise InvalidInput(f"repo: {exc}", field="repo") from None
        files = [ModelFile(p, by_path[p].size, by_path[p].sha256, by_path[p].blob) for p in chosen]
        return replace(record, commit=listing.commit, files=files)

    def _complete(self, folder: RepoFolder, record: ModelRecord) -> bool:
        """Every file is here and linked (what ``hf download`` or an earlier pull left counts)."""
        assert record.commit is not None
        try:
            for f in record.files:
                linked = folder.linked_blob(record.commit, f.path)
                if linked is None or not folder.blob(f.blob).exists():
                    return False
        except UnsafePath:
            return False
        folder.set_ref(record.revision, record.commit)
        return True

    def resume(self) -> None:
        """At start-up: every pull that was downloading goes on from where it stopped."""
        for record in self._records.values():
            if record.status is Status.DOWNLOADING and record.commit is not None:
                log.info("resuming the pull of %s@%s (%s)", record.repo, record.revision, record.id)
                self._begin(record)

    def _begin(self, record: ModelRecord) -> ModelRecord:
        transfer = Transfer()
        assert record.commit is not None
        transfer.done = present(RepoFolder(self.dir, record.repo), record.commit, record.files)
        self._transfers[record.id] = transfer
        record = self._changed(replace(record, status=Status.DOWNLOADING, error=None, bytes_done=transfer.done))
        self._tasks[record.id] = asyncio.create_task(self._run(record, transfer), name=f"pull-{record.id}")
        return record

    async def _run(self, record: ModelRecord, transfer: Transfer) -> None:
        """The pull of ``record``'s files, then its outcome written (``_changed``); a
        shutdown leaves it downloading with the bytes it has (``_progress``)."""
        ticker = asyncio.create_task(self._tick(record.id, transfer))
        assert record.commit is not None
        outcome: dict[str, Any]
        try:
            async with self._slots:
                if transfer.stop.is_set():
                    raise Stopped()
                await in_daemon_thread(
                    run_pull,
                    self.source,
                    self.dir,
                    self.settings.reserve_gib,
                    record.repo,
                    record.revision,
                    record.commit,
                    record.files,
                    transfer,
                    self._release,
                )
            outcome = {"status": Status.READY, "bytes_done": record.bytes_total}
            log.info("pulled %s@%s into %s", record.repo, record.revision, record.path)
        except Stopped:
            if transfer.why != "cancel":
                self._progress(record.id, transfer.done)
                return  # a shutdown: the record stays downloading, and the next start resumes it
            outcome = {"status": Status.CANCELLED, "bytes_done": transfer.done}
        except SourceError as exc:
            if transfer.stop.is_set() and transfer.why != "cancel":
                self._progress(record.id, transfer.done)
                return  # stopped by a shutdown in the middle of a read: resumed at the next start
            outcome = {"status": Status.FAILED, "error": str(exc), "bytes_done": transfer.done}
            log.warning("the pull of %s@%s failed: %s", record.repo, record.revision, exc)
        except Exception as exc:  # a bug or an unforeseen fault: the record says so, dgxmm goes on
            log.exception("the pull of %s failed", record.repo)
            outcome = {"status": Status.FAILED, "error": f"{type(exc).__name__}: {exc}"}
        finally:
            ticker.cancel()
            self._transfers.pop(record.id, None)
            self._tasks.pop(record.id, None)
        self._changed(replace(self._records.get(record.id, record), **outcome))

    async def _tick(self, model: str, transfer: Transfer) -> None:
        samples: deque[tuple[float, int]] = deque(maxlen=SPEED_SAMPLES)
        try:
            while True:
                await asyncio.sleep(TICK_S)
                record = self._progress(model, transfer.done)
                samples.append((time.monotonic(), transfer.done))
                (t0, b0), (t1, b1) = samples[0], samples[-1]
                self._speed[model] = (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0
                self.bus.publish("model", self.view(record))
                self._tell()
        finally:
            self._speed.pop(model, None)

    # --- what a deployment asks (by its ``model``, hf://...) -----------------------------------

    def readiness_of(self, model: str) -> Readiness:
        """Whether the files ``model`` names are here and verified (``path``), or how far their
        download is (``reason``)."""
        return self.readiness(self._name(model))

    def readiness(self, name: HubName) -> Readiness:
        record = self._records.get(model_id(name.repo, name.revision, name.include))
        return readiness(name, record, self._speed.get(record.id, 0.0) if record else 0.0)

    async def fetch(self, model: str, user: str | None) -> None:
        """Pull what ``model`` needs unless it is here or coming; ``InvalidInput`` (naming
        ``model``) when the repository has no such file. What the hub refuses makes the pull
        ``failed``, which ``files`` then says."""
        name = self._name(model)
        try:
            await self.pull(name.repo, name.revision, name.include, user, actor="deployer")
        except InvalidInput as exc:
            if exc.field != "include":
                raise
            raise self._no_such_file(model, name) from None

    async def lookup(self, model: str) -> int | None:
        """Before a deployment that names ``model`` is created (or changed to it):
        ``InvalidInput`` (422, field ``model``) when the hub says its repository, revision or file
        does not exist; else the bytes of its files, or None when the hub cannot be asked now (a
        hub that does not answer does not block a create: the pull will say what went wrong)."""
        name = self._name(model)
        known = self._records.get(model_id(name.repo, name.revision, name.include))
        if known is not None and known.status is Status.READY:
            return known.bytes_total
        try:
            async with asyncio.timeout(LOOKUP_TIMEOUT_S):
                listing = await asyncio.to_thread(self.source.listing, name.repo, name.revision)
        except NotOnHub as exc:
            raise InvalidInput(f"model: {model}: {exc}", field="model") from None
        except (SourceError, TimeoutError) as exc:
            log.info("cannot ask the hub about %s now (%s): the pull will", model, exc or "no answer")
            return None
        sizes = {f.path: f.size for f in listing.files}
        chosen = selected(sorted(sizes), name.include)
        if not chosen:
            raise self._no_such_file(model, name)
        return sum(sizes[path] for path in chosen)

    def add_listener(self, listener: Callable[[], None]) -> None:
        """``listener()`` after every change of a model's record and every progress tick."""
        self._listeners.append(listener)

    def _tell(self) -> None:
        for listener in self._listeners:
            try:
                listener()
            except Exception:
                log.exception("model store listener %r failed", listener)

    @staticmethod
    def _name(model: str) -> HubName:
        try:
            name = parse(model)
        except ValueError as exc:
            raise InvalidInput(str(exc), field="model") from None
        if name is None:
            raise InvalidInput(
                f"model: {model!r} is not a hub name ({SCHEME}ORG/REPO[@REVISION][/PATH])", field="model"
            )
        return name

    @staticmethod
    def _no_such_file(model: str, name: HubName) -> InvalidInput:
        return InvalidInput(f"model: {model}: {name.repo}@{name.revision} has no file {name.path}", field="model")

    # --- writing: the records' one writer -----------------------------------------------------

    def _progress(self, model: str, done: int) -> ModelRecord:
        """A downloading model's bytes so far, held (not written: the next status change writes them)."""
        self._owner.check()
        record = self._records[model] = replace(self._records[model], bytes_done=done)
        return record

    def _changed(self, record: ModelRecord) -> ModelRecord:
        """A status change: the record, frozen, is held in the old one's place and written, then
        sent to the event stream. Returns the record held."""
        self._owner.check()
        record = replace(record, updated_at=time.time())
        self._records[record.id] = record
        try:
            put_model(self.db, record.row())
        except DgxmmError as exc:  # a full disk: the record lives on in memory, written at its next change
            log.warning("model %s: %s", record.id, exc.message)
        self.bus.publish("model", self.view(record))
        self._tell()
        return record

    # --- removing ---------------------------------------------------------------------------

    async def delete(self, model: str, user: str | None) -> ModelRecord:
        """Cancel the model's download and remove its files no other snapshot shares;
        ``ModelInUse`` while a deployment refers to it."""
        record = self.get(model)
        users = self.users(record)
        if users:
            raise ModelInUse(f"model {record.repo} is used by deployment(s) {', '.join(sorted(users))}")
        await self._stop(record.id, "cancel")
        record = self._records.get(record.id, record)  # (as the cancelled pull left it)
        if record.status is Status.DOWNLOADING:
            record = replace(record, status=Status.CANCELLED)
        others = [r for r in self._records.values() if r.id != record.id and r.repo == record.repo]
        await asyncio.to_thread(remove_files, RepoFolder(self.dir, record.repo), record, others)
        delete_model(self.db, record.id)
        self._records.pop(record.id, None)
        self.bus.audit(
            "model_delete",
            actor="api",
            user=user,
            deployment_id=None,
            old={"repo": record.repo, "revision": record.revision, "include": record.include},
        )
        self.bus.publish("model", {**self.view(record), "removed": True})
        self._tell()
        return record

    async def _stop(self, model: str, why: str) -> None:
        transfer, task = self._transfers.get(model), self._tasks.get(model)
        if transfer is not None:
            transfer.why = why
            transfer.stop.set()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def close(self) -> None:
        """Shutdown: transfers stop where they are; their records stay ``downloading``. A
        transfer blocked in a read of a silent hub is not waited for past ``CLOSE_WAIT_S``: its
        thread is a daemon, its partial file only ever grows, and the next start resumes it."""
        tasks = list(self._tasks.values())
        for transfer in self._transfers.values():
            transfer.why = "shutdown"
            transfer.stop.set()
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=CLOSE_WAIT_S)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
