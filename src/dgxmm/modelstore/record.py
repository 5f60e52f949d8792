"""A model's record: what was asked (repo, revision, include), what the hub listed for it, and
how far its pull is. Frozen, and written by ``ModelStore`` alone on the event loop's thread (a new
record for each change); a pull's worker thread only moves its ``Transfer``'s byte count, which
the loop reads."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import threading
import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    DOWNLOADING = "downloading"
    READY = "ready"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class ModelFile:
    path: str
    size: int
    sha256: str | None  # the hub's, for LFS files; the download is checked against it
    blob: str  # the blob's name in the cache layout


@dataclass(frozen=True)
class ModelRecord:
    """Frozen: changed only by the model store (store.py), as a new record (``replace``)."""

    id: str
    repo: str
    revision: str
    include: list[str]
    status: Status = Status.DOWNLOADING
    commit: str | None = None
    files: list[ModelFile] = field(default_factory=list)
    path: str | None = None  # the snapshot directory
    error: str | None = None
    bytes_done: int = 0
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)

    @property
    def bytes_total(self) -> int:
        return sum(f.size for f in self.files)

    def view(self) -> dict[str, Any]:
        """The record as the API and the ``model`` event show it."""
        return {
            "id": self.id,
            "repo": self.repo,
            "revision": self.revision,
            "include": self.include,
            "commit": self.commit,
            "status": self.status.value,
            "bytes_total": self.bytes_total,
            "bytes_done": self.bytes_done,
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in self.files],
            "path": self.path,
            "error": self.error,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }

    def row(self) -> dict[str, Any]:
        """The record as its SQLite row (store/modeltable.py)."""
        return {
            "id": self.id,
            "repo": self.repo,
            "revision": self.revision,
            "include": json.dumps(self.include),
            "commit_hash": self.commit,
            "status": self.status.value,
            "files": json.dumps([asdict(f) for f in self.files]),
            "path": self.path,
            "error": self.error,
            "bytes_done": self.bytes_done,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ModelRecord:
        return cls(
            id=row["id"],
            repo=row["repo"],
            revision=row["revision"],
            include=json.loads(row["include"]),
            status=Status(row["status"]),
            commit=row["commit_hash"],
            files=[ModelFile(**f) for f in json.loads(row["files"])],
            path=row["path"],
            error=row["error"],
            bytes_done=int(row["bytes_done"]),
            created_at=float(row["created_at"]),
            updated_at=float(row["updated_at"]),
        )


def model_id(repo: str, revision: str, include: list[str]) -> str:
    """One id for one (repo, revision, include): pulling the same again finds the same record."""
    key = json.dumps([repo, revision, sorted(include)])
    return "m" + hashlib.sha256(key.encode()).hexdigest()[:12]


def selected(paths: list[str], include: list[str]) -> list[str]:
    """The paths any of the globs matches (all of them without globs)."""
    if not include:
        return list(paths)
    return [p for p in paths if any(fnmatch.fnmatchcase(p, glob) for glob in include)]


class Transfer:
    """A running pull's shared part: bytes present so far (written by the worker thread only)
    and the flag that ends it (set by the loop)."""

    def __init__(self) -> None:
        self.done = 0
        self.stop = threading.Event()
        self.why: str = ""  # "cancel" or "shutdown"
