"""The Hugging Face Hub as a source of model files: the one module that uses ``huggingface_hub``.

Everything else in the model store sees a ``Listing`` of a revision's files and ``fetch``, which
appends one file's bytes to a partial file (a range request from where it stopped). A second
source (ModelScope, an Ollama registry, a plain URL) is one more module with these two calls.

All HTTP goes through the Hub's own client: ``HfApi.model_info`` (``blobs=true``: sizes and the
SHA-256 of LFS files) and ``file_download.http_get`` (it follows the LFS redirect and resumes with
``Range``). ``hf_hub_download`` is not used for the bytes: since 1.x it writes to a file named
anew each time and deletes it on failure, so an interrupted download could not be resumed.

A stall: ``http_get`` reads with the stall timeout, and after a timeout it tries again from
where it stopped, up to five times in a row, counted afresh whenever a piece arrived: a hub that
sent some bytes and then went silent took six stall timeouts to fail. dgxmm's hook on the
client's requests (``_StallGuard``) refuses such a retry when nothing arrived for the stall
timeout, so a silent hub fails after one; a retry after a dropped connection, with bytes
arriving, still resumes at once.

Where the bytes go: ``http_get`` writes each piece it reads to the file it is given, which is
dgxmm's ``_Bounded`` writer: a piece that would take the file past the size the hub lists is
refused before it is written (``Oversized``: the transfer ends, the file is not kept), and each
piece is announced to ``on_bytes`` before it is written (the pull checks the free-space reserve
there). The listing's sizes are checked before any byte: a size that is missing, negative, not a
whole number or past what the Hub's client downloads at all refuses the listing.

Where the requests go: only to the hub's origin and ``[models] redirect_hosts`` (hosts.py).

The token: read from its file at each call, sent to the hub only, and never part of a message
(``SourceError`` texts are scrubbed of it).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httpx2
from huggingface_hub import HfApi, constants, hf_hub_url, set_client_factory
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import http_get
from huggingface_hub.utils._headers import build_hf_headers  # (lazily exported by .utils: mypy sees it here)
from huggingface_hub.utils._http import default_client_factory

from dgxmm.modelstore import hosts
from dgxmm.modelstore.hosts import AllowedHosts, Elsewhere, allowing

# The Hub's own default, unless HF_ENDPOINT says otherwise (huggingface_hub reads it).
DEFAULT_HUB_URL = constants.ENDPOINT
# The largest file a listing may name: the Hub's client downloads none larger over HTTP (it
# refuses one from the start, but not a resumed one), and a larger size is a hub's lie.
MAX_FILE_BYTES = constants.MAX_HTTP_DOWNLOAD_SIZE


class SourceError(Exception):
    """A hub's refusal or failure, as one line for the model's ``error`` (no token in it), with
    the hub's HTTP status when it answered one and a stable ``code`` (``repo_not_found``,
    ``revision_not_found``, ``gated_repo``, ``hub_timeout``, ``hub_unreachable``,
    ``hub_redirect``, ``hub_error``)."""

    def __init__(self, message: str, *, status: int | None = None, code: str = "hub_error") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class NotOnHub(SourceError):
    """The hub says the repository, the revision or the file does not exist."""


class Oversized(SourceError):
    """The hub sent more bytes of a file than it lists: nothing past the listed size is written."""


class Stopped(Exception):
    """Raised from the progress callback to end a transfer (a cancel, a shutdown)."""


class _Stalled(Exception):
    """Raised by ``_StallGuard`` from the client's request hook: not one of the errors
    ``http_get`` retries, so the transfer ends."""


class _StallGuard:
    """The running transfer of one thread: when its last bytes arrived."""

    current = threading.local()

    def __init__(self, stall_timeout_s: float) -> None:
        self.stall_timeout_s = stall_timeout_s
        self.last = time.monotonic()

    def moved(self) -> None:
        self.last = time.monotonic()

    @classmethod
    def on_request(cls, request: httpx2.Request) -> None:
        """Every request the Hub's client sends (hook): a retry of a transfer that got nothing
        for the stall timeout is refused."""
        guard: _StallGuard | None = getattr(cls.current, "guard", None)
        if guard is not None and time.monotonic() - guard.last >= guard.stall_timeout_s:
            raise _Stalled()


def _client() -> httpx2.Client:
    """huggingface_hub's own client, with the stall guard's and the hosts' hooks after its own."""
    client = default_client_factory()
    client.event_hooks["request"] += [_StallGuard.on_request, hosts.on_request]
    return client


class _Bounded:
    """The partial file as ``http_get`` writes it (``write``, ``tell``, ``seek``, ``truncate``):
    no byte past ``size``, and each piece announced to ``on_bytes`` before it is written."""

    def __init__(self, out: Any, path: str, size: int, on_bytes: Callable[[int], None]) -> None:
        self._out, self._path, self._size, self._on_bytes = out, path, size, on_bytes

    def write(self, data: bytes) -> int:
        if self._out.tell() + len(data) > self._size:
            raise Oversized(
                f"{self._path}: the hub sent more than the {self._size} bytes it lists; the file was not kept"
            )
        self._on_bytes(len(data))
        written: int = self._out.write(data)
        return written

    def tell(self) -> int:
        at: int = self._out.tell()
        return at

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        at: int = self._out.seek(offset, whence)
        return at

    def truncate(self, size: int | None = None) -> int:
        """(A hub that answers a range request with the whole file: ``http_get`` starts over.)"""
        before = os.fstat(self._out.fileno()).st_size
        after: int = self._out.truncate(size)
        self._on_bytes(after - before)
        return after


_hooked = False  # the client factory is set once (setting it closes the client in use)


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None  # published for LFS files: what the download is checked against
    blob: str  # the blob's name in the cache: the SHA-256 for an LFS file, else its git blob id


@dataclass(frozen=True)
class Listing:
    commit: str
    files: tuple[RemoteFile, ...]
    gated: str | None = None  # "auto" or "manual": its files download only with a token that has access


class HubSource:
    """The Hub at ``url``; ``token_file`` holds the token for gated and private repositories."""

    def __init__(
        self, url: str, token_file: Path | None, stall_timeout_s: float, redirect_hosts: Sequence[str]
    ) -> None:
        self.url = url.rstrip("/")
        self.token_file = token_file
        self.hosts = AllowedHosts.of(self.url, redirect_hosts)
        # huggingface_hub's read timeout (its module constant, read at each request): the time a
        # transfer may go without a byte before it fails as stalled.
        constants.HF_HUB_DOWNLOAD_TIMEOUT = max(1, round(stall_timeout_s))
        self.stall_timeout_s = stall_timeout_s
        global _hooked
        if not _hooked:
            set_client_factory(_client)
            _hooked = True

    def _token(self) -> str | None:
        if self.token_file is None:
            return None
        try:
            return self.token_file.read_text().strip() or None
        except OSError as exc:
            raise SourceError(f"cannot read hub_token_file {self.token_file}: {exc.strerror}") from None

    def listing(self, repo: str, revision: str) -> Listing:
        """The revision's commit and every file with its size (and SHA-256 where published). A hub
        that sends nothing for ``stall_timeout_s`` fails it (``hub_timeout``)."""
        token = self._token()
        try:
            with allowing(self.hosts):
                info = HfApi(endpoint=self.url, token=token or False).model_info(
                    repo, revision=revision, files_metadata=True, timeout=self.stall_timeout_s
                )
        except Elsewhere as exc:
            raise self._elsewhere(exc) from None
        except (HfHubHTTPError, httpx2.HTTPError, ValueError) as exc:
            raise self._error(exc, repo, revision, token) from None
        except (KeyError, TypeError, AttributeError):  # huggingface_hub reading an answer that is no model info
            raise SourceError(
                f"{self.url} answered with no model information for {repo}@{revision}: is [models] hub_url a hub?"
            ) from None
        if not info.sha:
            raise SourceError(f"the hub gave no commit for {repo}@{revision}")
        files = []
        for sibling in info.siblings or []:
            sha = sibling.lfs.sha256 if sibling.lfs is not None else None
            size = sibling.lfs.size if sibling.lfs is not None else sibling.size
            blob = sha or sibling.blob_id
            if blob is None:
                raise SourceError(f"the hub gave no blob id for {sibling.rfilename} in {repo}")
            files.append(RemoteFile(sibling.rfilename, file_size(size, sibling.rfilename, repo), sha, blob))
        return Listing(info.sha, tuple(files), info.gated or None)

    def fetch(self, repo: str, commit: str, file: RemoteFile, partial: Path, on_bytes: Callable[[int], None]) -> None:
        """Append the rest of ``file`` to ``partial`` (a range request from its size), calling
        ``on_bytes`` with each piece's length before it is written; it may raise ``Stopped`` or a
        ``SourceError`` to end the transfer. ``Oversized`` when the hub sends more than
        ``file.size`` (what it sent up to that size is on disk, for the caller to discard)."""
        token = self._token()
        url = hf_hub_url(repo, file.path, revision=commit, endpoint=self.url)
        headers = build_hf_headers(token=token or False)
        guard = _StallGuard(self.stall_timeout_s)

        class Progress:
            """huggingface_hub's progress bar, in the shape it calls: each chunk's length."""

            def __init__(self, **kwargs: Any) -> None:
                pass

            def __enter__(self) -> Progress:
                return self

            def __exit__(self, *exc: object) -> None:
                pass

            def update(self, n: int | float | None = 1) -> None:
                guard.moved()

        _StallGuard.current.guard = guard
        try:
            with partial.open("ab") as out, allowing(self.hosts):
                done = out.tell()
                if done >= file.size:
                    return
                http_get(
                    url,
                    cast(Any, _Bounded(out, file.path, file.size, on_bytes)),
                    resume_size=done,
                    headers=headers,
                    expected_size=file.size,
                    displayed_filename=file.path,
                    tqdm_class=cast(Any, Progress),
                    _nb_retries=0,  # a stall before the first byte fails now, not five times later
                )
        except Stopped:
            raise
        except _Stalled:
            raise SourceError(self._stalled()) from None
        except Elsewhere as exc:
            raise self._elsewhere(exc, file.path) from None
        except (HfHubHTTPError, httpx2.HTTPError) as exc:
            raise self._error(exc, repo, commit, token) from None
        except OSError as exc:
            if exc.errno is None:  # huggingface_hub's own check: the size received is not the size listed
                raise SourceError(f"{file.path}: {str(exc).splitlines()[0]}") from None
            reason = os.strerror(exc.errno)
            raise SourceError(f"{file.path}: cannot write {partial}: {reason} (the part downloaded is kept)") from None
        except ValueError as exc:  # huggingface_hub refuses a plain download of a file past 50 GB
            raise SourceError(f"{file.path}: {str(exc).strip()}") from None
        finally:
            _StallGuard.current.guard = None

    def _elsewhere(self, exc: Elsewhere, path: str | None = None) -> SourceError:
        what = f"{path}: the hub" if path else "the hub"
        return SourceError(
            f"{what} redirected to {exc.where}, which is neither the hub's host nor one of [models] "
            "redirect_hosts: not followed",
            code="hub_redirect",
        )

    def _stalled(self) -> str:
        return f"the hub sent nothing for {self.stall_timeout_s:g} s (stalled); pull again to resume"

    def _error(self, exc: Exception, repo: str, revision: str, token: str | None) -> SourceError:
        status = exc.response.status_code if isinstance(exc, HfHubHTTPError) and exc.response is not None else None
        code = "hub_error"
        if isinstance(exc, GatedRepoError):
            code = "gated_repo"
            text = (
                f"{repo} is a gated repository ({status}): ask for access on the hub, then set "
                "[models] hub_token_file to a token of an account that has it"
                if token is None
                else f"{repo} is a gated repository and the token of hub_token_file has no access to it ({status})"
            )
        elif isinstance(exc, RevisionNotFoundError):
            code, text = "revision_not_found", f"revision {revision!r} not found in {repo} ({status})"
        elif isinstance(exc, EntryNotFoundError):
            text = f"a file of {repo} is not on the hub ({status})"
        elif isinstance(exc, RepositoryNotFoundError):
            hint = "" if token is not None else "; if it is private, set [models] hub_token_file"
            code, text = "repo_not_found", f"repository {repo} not found on the hub ({status}){hint}"
        elif isinstance(exc, HfHubHTTPError):
            text = f"the hub answered {status}: {str(exc).splitlines()[0]}"
        elif isinstance(exc, httpx2.TimeoutException):
            code, text = "hub_timeout", self._stalled()
        elif isinstance(exc, httpx2.HTTPError):
            code, text = "hub_unreachable", f"cannot reach the hub at {self.url}: {exc}"
        else:
            text = f"{type(exc).__name__}: {exc}"
        if token:
            text = text.replace(token, "***")
        missing = isinstance(exc, RevisionNotFoundError | EntryNotFoundError | RepositoryNotFoundError)
        kind = NotOnHub if missing and not isinstance(exc, GatedRepoError) else SourceError
        return kind(text, status=status, code=code)


def file_size(size: object, path: str, repo: str) -> int:
    """A listed size that is a file's: a whole number from 0 to ``MAX_FILE_BYTES``; anything else
    (missing, negative, a fraction, absurd) refuses the listing before any byte is fetched."""
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_FILE_BYTES:
        raise SourceError(
            f"the hub lists {path} in {repo} at {size!r} bytes, which is no file's size "
            f"(0 to {MAX_FILE_BYTES}): not pulled"
        )
    return size
