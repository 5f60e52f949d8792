"""What a repository offers before it is pulled (``GET /api/models/files``): its files with
their sizes, the ones an ``include`` would pull, which of them are here already, and whether the
hub lets them download without a token. The console lists them in its Models view and deploy
wizard, so a user sees the sizes, the total and the free disk before a byte is fetched.

Bounded: the hub's answer comes within ``[models] stall_timeout_s`` (or fails ``hub_timeout``),
at most ``MAX_LISTINGS`` are asked at once, and at most ``MAX_LISTED`` files are listed (the
counts and sizes are of all of them)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dgxmm.errors import DgxmmError
from dgxmm.modelstore.layout import RepoFolder, UnsafePath
from dgxmm.modelstore.record import selected
from dgxmm.modelstore.source import Listing, RemoteFile, SourceError

MAX_LISTED = 1000  # files in one answer: a repository of checkpoints can have tens of thousands
MAX_LISTINGS = 4  # listings asked of the hub at once; more are refused (429), not queued


class HubRefused(DgxmmError):
    """The hub's refusal of a listing, with its status where it gave one: 404 an unknown
    repository or revision, 401 a private one without a token (the message says to set
    ``hub_token_file``), 504 a hub that sent nothing in time, 502 one that cannot be reached or
    answered otherwise."""

    def __init__(self, error: SourceError) -> None:
        super().__init__(str(error))
        self.code = error.code
        if error.status in (401, 403, 404):
            self.status = error.status
        else:
            self.status = 504 if error.code == "hub_timeout" else 502


class ListingsBusy(DgxmmError):
    status = 429
    code = "too_many_listings"


def here(folder: RepoFolder, files: Iterable[RemoteFile]) -> set[str]:
    """The paths among ``files`` whose blob is in the store already (blocking: a stat each)."""
    found = set()
    for f in files:
        try:
            if folder.blob(f.blob).exists():
                found.add(f.path)
        except UnsafePath:  # a blob name that is no hash is never here
            continue
    return found


def gated_warning(repo: str, listing: Listing, has_token: bool) -> str | None:
    """What a pull of a gated repository needs, said before it fails."""
    if listing.gated is None:
        return None
    if has_token:
        return (
            f"{repo} is a gated repository: its files download only if the account of hub_token_file's "
            "token was granted access on the hub"
        )
    return (
        f"{repo} is a gated repository: ask for access on the hub, then set [models] hub_token_file "
        "to a token of an account that has it, or the pull fails"
    )


def offer(
    repo: str, revision: str, listing: Listing, include: list[str], present: set[str], has_token: bool
) -> dict[str, Any]:
    """The answer of ``GET /api/models/files``: every count and size is of all the files (or all
    those ``include`` matches), the list itself at most ``MAX_LISTED`` of them, by path."""
    by_path = {f.path: f for f in listing.files}
    chosen = [by_path[p] for p in selected(sorted(by_path), include)]
    return {
        "repo": repo,
        "revision": revision,
        "commit": listing.commit,
        "gated": listing.gated,
        "warning": gated_warning(repo, listing, has_token),
        "include": include,
        "file_count": len(by_path),
        "bytes_total": sum(f.size for f in listing.files),
        "matched": len(chosen),
        "bytes_matched": sum(f.size for f in chosen),
        "bytes_here": sum(f.size for f in chosen if f.path in present),
        "truncated": len(chosen) > MAX_LISTED,
        "files": [{"path": f.path, "size": f.size, "here": f.path in present} for f in chosen[:MAX_LISTED]],
    }
