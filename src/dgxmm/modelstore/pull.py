"""One pull, the blocking part, run in a worker thread: the space check, each missing file
fetched into its partial blob (resumed from where it stopped; the free-space reserve checked
again before each piece is written, as other writers share the disk; not a byte past the size
the hub lists), checked against the hub's size and SHA-256, written to the disk (``fsync``: a crash never leaves a blob that is not the file),
moved into ``blobs/`` and linked from the snapshot, and then handed to ``release``: the page
cache's policy drops its pages where cached pages count as used memory (deploy/pagecache.py)."""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from dgxmm.modelstore.layout import RepoFolder, UnsafePath
from dgxmm.modelstore.record import ModelFile, Transfer
from dgxmm.modelstore.source import HubSource, Oversized, RemoteFile, SourceError, Stopped

GIB = 1024**3
HASH_CHUNK = 4 * 1024 * 1024


# Drops a pulled file's pages from the page cache where the policy says so (blocking: the pull's
# thread calls it); app.py hands in the page cache's (deploy/pagecache.py), modelstore knows no more.
Release = Callable[[list[Path]], object]

_LOCKS: dict[Path, threading.Lock] = {}
_LOCKS_LOCK = threading.Lock()


def blob_lock(blob: Path) -> threading.Lock:
    """One writer per blob: two pulls that share a file (two includes of one repository) must
    not append to the same partial file; the second waits and finds the blob there."""
    with _LOCKS_LOCK:
        return _LOCKS.setdefault(blob, threading.Lock())


class InsufficientStorage(SourceError):
    """Too little free space for what remains to fetch (nothing was fetched)."""


def present(folder: RepoFolder, commit: str, files: list[ModelFile]) -> int:
    """Bytes of ``files`` already here, whole or in part (a partial blob counts what it has)."""
    total = 0
    for f in files:
        blob = folder.blob(f.blob)
        if blob.exists():
            total += f.size
        elif folder.partial(f.blob).exists():
            total += min(folder.partial(f.blob).stat().st_size, f.size)
    return total


def check_space(models_dir: Path, remaining: int, reserve_gib: float) -> None:
    models_dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(models_dir).free
    if remaining > free - reserve_gib * GIB:
        raise InsufficientStorage(
            f"insufficient_storage: {remaining / GIB:.2f} GiB remain to download but {models_dir} has "
            f"{free / GIB:.2f} GiB free, keeping [models] reserve_gib = {reserve_gib:g} GiB"
        )


def keep_reserve(models_dir: Path, piece: int, reserve_gib: float) -> None:
    """Before a piece of ``piece`` bytes is written: it leaves the reserve free, or the transfer
    ends (what was written is kept, for a pull once there is room)."""
    free = shutil.disk_usage(models_dir).free
    if free - piece < reserve_gib * GIB:
        raise InsufficientStorage(
            f"insufficient_storage: {models_dir} has {free / GIB:.2f} GiB free, and the download would "
            f"take it under [models] reserve_gib = {reserve_gib:g} GiB; the part downloaded is kept: "
            "pull again once there is room"
        )


def sha256_of(path: Path, stop: Transfer) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(HASH_CHUNK):
            if stop.stop.is_set():
                raise Stopped()
            digest.update(chunk)
    return digest.hexdigest()


def run_pull(
    source: HubSource,
    models_dir: Path,
    reserve_gib: float,
    repo: str,
    revision: str,
    commit: str,
    files: list[ModelFile],
    transfer: Transfer,
    release: Release | None = None,
) -> None:
    """Bring every file of the snapshot here; raises ``SourceError`` (with the reason) or
    ``Stopped``. What a stop or a failure leaves of a transfer is kept for the resume, but a file
    whose bytes are wrong, which is deleted."""
    folder = RepoFolder(models_dir, repo)
    for f in files:
        try:
            folder.linked_blob(commit, f.path)  # an entry that points out of the folder is refused
        except UnsafePath as exc:
            raise SourceError(str(exc)) from None
    transfer.done = present(folder, commit, files)
    check_space(models_dir, sum(f.size for f in files) - transfer.done, reserve_gib)
    (folder.root / "blobs").mkdir(parents=True, exist_ok=True)

    def on_bytes(n: int) -> None:
        if transfer.stop.is_set():
            raise Stopped()
        if n > 0:
            keep_reserve(models_dir, n, reserve_gib)
        transfer.done += n

    for f in files:
        blob = folder.blob(f.blob)
        with blob_lock(blob):
            if not blob.exists():
                fetch_blob(source, folder, repo, commit, f, on_bytes, transfer)
                if release is not None:
                    release([blob])
        folder.link(commit, f.path, f.blob)
    folder.set_ref(revision, commit)


def fetch_blob(
    source: HubSource,
    folder: RepoFolder,
    repo: str,
    commit: str,
    f: ModelFile,
    on_bytes: Callable[[int], None],
    transfer: Transfer,
) -> None:
    partial = folder.partial(f.blob)
    from_size = partial.stat().st_size if partial.exists() else 0
    if from_size > f.size:  # more than the file: not a part of it
        partial.unlink()
        transfer.done -= f.size
    try:
        source.fetch(repo, commit, _remote(f), partial, on_bytes)
    except Oversized:
        discard(partial, transfer)  # the hub's file is not the one it lists
        raise
    verify(partial, f, transfer)
    try:
        written(partial)
    except OSError as exc:
        raise SourceError(f"{f.path}: cannot write {partial}: {exc.strerror or exc}") from None
    os.replace(partial, folder.blob(f.blob))


def written(path: Path) -> None:
    """The file's bytes on the disk: a blob is the file whatever happens after its rename, and
    its pages are clean, which the page cache can drop."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def verify(partial: Path, f: ModelFile, transfer: Transfer) -> None:
    """The downloaded file is the hub's: its size, and its SHA-256 where the hub publishes one.
    A file that is not is deleted (a resume could only append to wrong bytes)."""
    size = partial.stat().st_size
    problem = None
    if size != f.size:
        problem = f"{f.path}: {size} bytes received, the hub lists {f.size}"
    elif f.sha256 is not None:
        got = sha256_of(partial, transfer)
        if got != f.sha256:
            problem = f"{f.path}: SHA-256 {got} does not match the hub's {f.sha256}; the file was not kept"
    if problem is not None:
        discard(partial, transfer)
        raise SourceError(problem)


def discard(partial: Path, transfer: Transfer) -> None:
    """A partial file whose bytes are not the hub's file: a resume could only append to them."""
    transfer.done -= partial.stat().st_size
    partial.unlink()


def _remote(f: ModelFile) -> RemoteFile:
    return RemoteFile(f.path, f.size, f.sha256, f.blob)
