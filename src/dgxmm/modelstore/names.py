"""A deployment's model named by the hub: ``hf://ORG/REPO[@REVISION][/PATH]``.

With a PATH it is one file of the repository (a GGUF for llama.cpp; the first part of a split
GGUF brings its other parts, which llama.cpp loads from beside it); without, the whole snapshot
(a directory, what vLLM takes). ``readiness`` says whether the files are here, and how far
their download is, in the words a deployment's ``state_reason`` shows.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Iterable
from dataclasses import dataclass

from dgxmm.modelstore.layout import UnsafePath, check_file_path, check_repo, check_revision
from dgxmm.modelstore.pull import GIB
from dgxmm.modelstore.record import ModelRecord, Status, model_id, selected
from dgxmm.records.deployment import HUB_SCHEME, Deployment

SCHEME = HUB_SCHEME
# The first part of a split GGUF, as gguf-split names them: every part is fetched with it.
_FIRST_PART = re.compile(r"^(?P<stem>.+)-00001-of-(?P<count>\d{5})\.gguf$")


@dataclass(frozen=True)
class HubName:
    repo: str
    revision: str
    path: str | None  # one file of the repository; None: the whole snapshot

    @property
    def include(self) -> list[str]:
        """What a pull of this name fetches (globs, as a pull's ``include``): the file alone, its
        name escaped (``[``, ``*`` and ``?`` are characters of it), or every part of a split GGUF
        named by its first; without a PATH everything."""
        if self.path is None:
            return []
        split = _FIRST_PART.match(self.path)
        if split is None:
            return [glob.escape(self.path)]
        return [f"{glob.escape(split['stem'])}-[0-9][0-9][0-9][0-9][0-9]-of-{split['count']}.gguf"]


def parse(model: str) -> HubName | None:
    """The hub name ``model`` is, None when it is not one (a local path); ``ValueError`` (with
    the reason) when it starts with ``hf://`` but is not a name dgxmm can pull."""
    if not model.startswith(SCHEME):
        return None
    rest = model[len(SCHEME) :]
    parts = rest.split("/", 2)
    if len(parts) < 2:
        raise ValueError(f"model: {model!r} is not hf://ORG/REPO[@REVISION][/PATH]")
    org, name = parts[0], parts[1]
    revision = "main"
    if "@" in name:
        name, revision = name.split("@", 1)
    path = parts[2] if len(parts) == 3 and parts[2] else None
    try:
        check_repo(f"{org}/{name}")
        check_revision(revision)
        if path is not None:
            check_file_path(path)
    except UnsafePath as exc:
        raise ValueError(f"model: {exc}") from None
    return HubName(f"{org}/{name}", revision, path)


@dataclass(frozen=True)
class Readiness:
    """Whether a hub name's files are here: ``path`` (the file or the snapshot) once they are."""

    status: Status | None  # None: never pulled
    path: str | None
    reason: str  # for a deployment's state_reason while it waits, or the pull's error
    fraction: float | None = None  # downloading: how much is here, 0 to 1 (None: the size is not known yet)

    @property
    def downloading(self) -> bool:
        return self.status is Status.DOWNLOADING


def readiness(name: HubName, record: ModelRecord | None, speed_bps: float) -> Readiness:
    if record is None:
        return Readiness(None, None, f"{name.repo} is not pulled yet")
    if record.status is Status.READY and record.path is not None:
        path = record.path if name.path is None else f"{record.path}/{name.path}"
        return Readiness(Status.READY, path, "")
    if record.status is Status.DOWNLOADING:
        text = progress_text(record.bytes_done, record.bytes_total, speed_bps)
        fraction = min(record.bytes_done / record.bytes_total, 1.0) if record.bytes_total > 0 else None
        return Readiness(Status.DOWNLOADING, None, text, fraction)
    return Readiness(record.status, None, record.error or f"the pull of {name.repo} was {record.status.value}")


def users_of(record: ModelRecord, deployments: Iterable[Deployment]) -> list[str]:
    """The names of the deployments that use the record's model, what keeps it from being
    deleted: one whose model (a hub model's local path) is one of its files or its snapshot
    directory, or whose ``model`` names it (it waits for its files, or will run on them): the
    same repository at the same revision, and a PATH among its files (no PATH: the whole
    snapshot, of which every record of that revision holds a part)."""
    found = []
    for dep in deployments:
        local = dep.local_model
        inside = record.path is not None and (local == record.path or local.startswith(record.path + "/"))
        if inside or _names(dep.model, record):
            found.append(dep.name)
    return found


def _names(model: str, record: ModelRecord) -> bool:
    try:
        name = parse(model)
    except ValueError:
        return False
    if name is None or name.repo != record.repo:
        return False
    if model_id(name.repo, name.revision, name.include) == record.id:
        return True
    if name.revision not in (record.revision, record.commit):
        return False
    return not name.include or bool(selected([f.path for f in record.files], name.include))


def progress_text(done: int, total: int, speed_bps: float) -> str:
    """ "downloading 3.2 of 18.0 GiB, 120 MiB/s, about 2 min left" (MiB below a GiB)."""
    unit, size = ("GiB", GIB) if total >= GIB else ("MiB", 1024**2)
    text = f"downloading {done / size:.1f} of {total / size:.1f} {unit}"
    if speed_bps <= 0:
        return text
    text += f", {speed_bps / 1024**2:.0f} MiB/s"
    left = max(total - done, 0) / speed_bps
    if left < 60:
        return text + f", about {max(round(left), 1)} s left"
    if left < 5400:
        return text + f", about {round(left / 60)} min left"
    return text + f", about {left / 3600:.1f} h left"
