"""The Hugging Face Hub's cache layout, which the model store keeps its files in:

    <dir>/models--ORG--REPO/blobs/<blob>            the bytes (blob: SHA-256 for LFS files, else git's id)
    <dir>/models--ORG--REPO/blobs/<blob>.incomplete  a download in progress (kept for the resume)
    <dir>/models--ORG--REPO/snapshots/<commit>/PATH  a relative symlink to the blob
    <dir>/models--ORG--REPO/refs/<revision>          the commit a branch or tag named

So a ``[models] dir`` pointed at an existing Hugging Face cache reuses what ``hf download`` or
vLLM fetched, and they reuse what dgxmm fetched. Every path is checked to stay inside the
repository's folder: a name with ``..``, an absolute path, or a symlink in a snapshot that points
out is refused (``UnsafePath``).
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from dgxmm.errors import InvalidInput
from dgxmm.settings import ModelsSettings

if TYPE_CHECKING:
    from dgxmm.modelstore.record import ModelRecord

# The Hub's rule for a repository id, ORG/REPO: letters, digits, '-', '_', '.'; no '..', no '--'
# at either end (the folder name joins the parts with '--').
REPO_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$"
REVISION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$"


class UnsafePath(Exception):
    """A name that would leave the models directory."""


def check_repo(repo: str) -> str:
    if not re.fullmatch(REPO_PATTERN, repo) or ".." in repo:
        raise UnsafePath(f"repo: {repo!r} is not a repository id ORG/REPO")
    return repo


def check_revision(revision: str) -> str:
    if not re.fullmatch(REVISION_PATTERN, revision) or ".." in revision.split("/") or "//" in revision:
        raise UnsafePath(f"revision: {revision!r} is not a branch, tag or commit")
    return revision


def check_file_path(path: str) -> PurePosixPath:
    """A repository's file path, relative and without '..' (a hub must not name another)."""
    pure = PurePosixPath(path)
    if not path or pure.is_absolute() or "\\" in path or any(part in ("..", ".", "") for part in path.split("/")):
        raise UnsafePath(f"the file path {path!r} would leave the snapshot")
    return pure


def models_dir(settings: ModelsSettings, data_dir: Path) -> Path:
    """Absolute: a record's ``path`` is what an engine is given, and a container (which binds
    this directory at the same path) does not share dgxmm's working directory."""
    return (settings.dir or data_dir / "models").absolute()


def name_checked(repo: str, revision: str) -> None:
    """``InvalidInput`` naming its field for a repository or revision that cannot be one (a
    path that would leave the models directory among them), before the hub is asked."""
    try:
        check_repo(repo)
        check_revision(revision)
    except UnsafePath as exc:
        raise InvalidInput(str(exc), field=str(exc).partition(": ")[0]) from None


class RepoFolder:
    """One repository's folder in the cache."""

    def __init__(self, models_dir: Path, repo: str) -> None:
        org, name = check_repo(repo).split("/")
        self.root = models_dir / f"models--{org}--{name}"

    def blob(self, blob: str) -> Path:
        if not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", blob):
            raise UnsafePath(f"the blob name {blob!r} is not a hash")
        return self.root / "blobs" / blob

    def partial(self, blob: str) -> Path:
        return self.blob(blob).with_name(blob + ".incomplete")

    def snapshot(self, commit: str) -> Path:
        if not re.fullmatch(r"[0-9a-f]{40}", commit):
            raise UnsafePath(f"the commit {commit!r} is not a commit hash")
        return self.root / "snapshots" / commit

    def entry(self, commit: str, path: str) -> Path:
        return self.snapshot(commit) / check_file_path(path)

    def linked_blob(self, commit: str, path: str) -> Path | None:
        """The file a snapshot entry is, when it is there and inside the repository's folder
        (``UnsafePath`` when it points out); None when it is missing."""
        entry = self.entry(commit, path)
        if not entry.exists():
            return None
        target = entry.resolve()
        if not target.is_relative_to(self.root.resolve()):
            raise UnsafePath(f"{path} in the snapshot points outside the models directory ({target})")
        return target

    def link(self, commit: str, path: str, blob: str) -> Path:
        """The snapshot entry for ``path``: a relative symlink to its blob (as the Hub's client makes)."""
        entry = self.entry(commit, path)
        entry.parent.mkdir(parents=True, exist_ok=True)
        target = Path(*[".."] * (len(PurePosixPath(path).parts) + 1), "blobs", blob)
        if entry.is_symlink() or entry.exists():
            entry.unlink()
        entry.symlink_to(target)
        return entry

    def set_ref(self, revision: str, commit: str) -> None:
        if revision == commit:
            return
        ref = self.root / "refs" / check_revision(revision)
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(commit)

    def blobs_in_use(self, besides: Path) -> set[Path]:
        """The blobs every snapshot but ``besides`` links to."""
        found: set[Path] = set()
        snapshots = self.root / "snapshots"
        if not snapshots.is_dir():
            return found
        for snap in snapshots.iterdir():
            if snap == besides:
                continue
            for entry in snap.rglob("*"):
                if entry.is_symlink():
                    found.add(entry.resolve())
        return found


def remove_files(folder: RepoFolder, record: ModelRecord, others: list[ModelRecord]) -> None:
    """Remove a deleted model's snapshot entries and the blobs none of ``others`` (the store's
    other records of the repository) and no other snapshot shares; run off the loop."""
    if record.commit is None:
        return
    snapshot = folder.snapshot(record.commit)
    kept_blobs = {f.blob for r in others for f in r.files}
    kept_paths = {f.path for r in others if r.commit == record.commit for f in r.files}
    shared = folder.blobs_in_use(besides=snapshot)
    for f in record.files:
        if f.path not in kept_paths:
            with contextlib.suppress(FileNotFoundError, UnsafePath):
                folder.entry(record.commit, f.path).unlink()
        blob = folder.blob(f.blob)
        if f.blob not in kept_blobs and blob.resolve() not in shared:
            blob.unlink(missing_ok=True)
            folder.partial(f.blob).unlink(missing_ok=True)
    for directory in sorted((p for p in snapshot.rglob("*") if p.is_dir()), reverse=True):
        with contextlib.suppress(OSError):
            directory.rmdir()
    with contextlib.suppress(OSError):
        snapshot.rmdir()
