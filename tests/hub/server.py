"""A local stand-in for the Hugging Face Hub: the HTTP API ``huggingface_hub`` uses to read a
model repository, answered as the real Hub answers it, on 127.0.0.1 only.

What it serves (each as the Hub does, from what ``huggingface_hub``'s ``hf_api.py`` and
``file_download.py`` read):

- ``GET /api/models/{repo}`` and ``/api/models/{repo}/revision/{rev}``: the model's info, with
  ``siblings``; with ``blobs=true`` each sibling has ``size``, ``blobId`` and, for an LFS file,
  ``lfs: {sha256, size, pointerSize}``.
- ``GET /api/models/{repo}/tree/{rev}[/{path}]`` (``recursive=true``): files as ``{type, oid,
  size, path[, lfs: {oid, size, pointerSize}]}`` and folders.
- ``HEAD``/``GET /{repo}/resolve/{rev}/{path}``: a small (git) file answered here with ``ETag``
  (its git blob id), ``X-Repo-Commit`` and its bytes, ranges honoured; an LFS file redirected
  (302) to a second listener, the "CDN" (another origin, as the Hub's is), the redirect carrying
  ``X-Linked-Etag`` (the SHA-256), ``X-Linked-Size`` and ``X-Repo-Commit``.
- 404 with ``X-Error-Code: RepoNotFound`` / ``RevisionNotFound`` / ``EntryNotFound``; a gated
  repository's files 401 with ``X-Error-Code: GatedRepo`` without its token (its info with the files'
  sizes is public, as the Hub's files tab of a gated model is); a private repository 401 with
  ``X-Error-Code: RepoNotFound`` everywhere without its token (the Hub does not say it exists).

Faults a test asks for: a file whose bytes differ from the SHA-256 published (``corrupt``), a
file whose transfer stops after some bytes until ``release`` (``stall_after``), a file sent at
a given rate (``slow``, bytes a second: a download a page can watch), a model info answered only
after ``release`` (``stall_info``). A hostile hub's answers: a file that goes on past its
listed size (``grows``: that many bytes more, sent until the client goes), a size listed as
something else (``listed``: a value, or ``MISSING`` for none), a redirect anywhere (``redirect``:
a file's ``resolve``, or ``"info"`` for the model info, answered with a 302 to that URL), and a
file sent whole when a range is asked (``whole``, as a CDN may). Every
request is recorded (method, path, its ``Range``, whether it carried a token), and the bytes
sent of each file (``sent``).

``Bystander`` is another server (on any 127.0.0.x) that records what it is asked: where a
hostile hub's redirect points, to show that dgxmm never went there.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_FROM = 64  # files of this many bytes or more are LFS files (the Hub's rule is by type and size)
MISSING = object()  # a listed size left out of the hub's answer


def git_blob_id(data: bytes) -> str:
    """Git's object id of a blob: what the Hub gives as a file's ``oid``/``blobId`` and its ETag."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(data: bytes) -> bytes:
    sha = hashlib.sha256(data).hexdigest()
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {len(data)}\n".encode()


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str = "0123456789abcdef0123456789abcdef01234567"
    branches: dict[str, str] = field(default_factory=dict)  # other refs than main -> commit
    token: str | None = None  # set: a gated repository; its files need this bearer token
    private: bool = False  # with a token: everything of it needs the token, and without it is "not found"
    stall_info: bool = False  # the model info is answered only once the hub is released
    corrupt: set[str] = field(default_factory=set)  # served bytes differ from the published SHA-256
    stall_after: dict[str, int] = field(default_factory=dict)  # path -> bytes sent before a stall
    slow: dict[str, int] = field(default_factory=dict)  # path -> bytes a second it is sent at
    grows: dict[str, int] = field(default_factory=dict)  # path -> bytes sent past its end (a lying hub)
    listed: dict[str, object] = field(default_factory=dict)  # path -> the size listed instead of its own
    redirect: dict[str, str] = field(default_factory=dict)  # path or "info" -> a URL answered with a 302
    whole: set[str] = field(default_factory=set)  # sent whole (200) even when a range is asked (as CDNs may)

    def is_lfs(self, path: str) -> bool:
        return len(self.files[path]) >= LFS_FROM

    def commit_of(self, revision: str) -> str | None:
        if revision in ("main", self.commit):
            return self.commit
        return self.branches.get(revision)


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    range: str | None
    authorized: bool
    origin: str  # "hub" or "cdn"


class FakeHub:
    """The hub (``url``) and its CDN, each a thread listening on 127.0.0.1."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.seen: list[Seen] = []
        self.sent: dict[str, int] = {}  # a growing file's path -> the bytes of it sent (once it ends)
        self.released = threading.Event()
        self._hub = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, "hub"))
        self._cdn = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, "cdn"))
        self._hub.daemon_threads = self._cdn.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._hub.server_address[1]}"
        self.cdn_url = f"http://127.0.0.1:{self._cdn.server_address[1]}"
        self._threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (self._hub, self._cdn)]

    def start(self) -> FakeHub:
        for thread in self._threads:
            thread.start()
        return self

    def close(self) -> None:
        self.released.set()
        for server in (self._hub, self._cdn):
            server.shutdown()
            server.server_close()

    def add(self, repo_id: str, files: dict[str, bytes], **options: Any) -> Repo:
        repo = Repo(dict(files), **options)
        self.repos[repo_id] = repo
        return repo

    @property
    def settings(self) -> dict[str, Any]:
        """The ``[models]`` keys for dgxmm to pull from this hub: its CDN is another origin."""
        return {"hub_url": self.url, "redirect_hosts": self.redirect_hosts}

    @property
    def redirect_hosts(self) -> list[str]:
        return [self.cdn_url.removeprefix("http://")]

    def gets(self, path_part: str) -> list[Seen]:
        """The GETs of file bytes whose path contains ``path_part`` (at the hub or the CDN)."""
        return [s for s in self.seen if s.method == "GET" and path_part in s.path and "/api/" not in s.path]

    # --- what the API answers ----------------------------------------------------------------

    def sibling(self, repo: Repo, path: str, blobs: bool) -> dict[str, Any]:
        entry: dict[str, Any] = {"rfilename": path}
        if blobs:
            data = repo.files[path]
            entry["blobId"] = git_blob_id(lfs_pointer(data) if repo.is_lfs(path) else data)
            entry["size"] = len(data)
            if repo.is_lfs(path):
                sha = hashlib.sha256(data).hexdigest()
                entry["lfs"] = {"sha256": sha, "size": len(data), "pointerSize": len(lfs_pointer(data))}
            if path in repo.listed:
                for where in [entry, *([entry["lfs"]] if "lfs" in entry else [])]:
                    where.pop("size")
                    if repo.listed[path] is not MISSING:
                        where["size"] = repo.listed[path]
        return entry

    def tree_entry(self, repo: Repo, path: str) -> dict[str, Any]:
        s = self.sibling(repo, path, True)
        entry: dict[str, Any] = {"type": "file", "oid": s["blobId"], "size": s["size"], "path": path}
        if "lfs" in s:
            entry["lfs"] = {"oid": s["lfs"]["sha256"], "size": s["size"], "pointerSize": s["lfs"]["pointerSize"]}
        return entry


def _handler(hub: FakeHub, origin: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_HEAD(self) -> None:
            self._route(head=True)

        def do_GET(self) -> None:
            self._route(head=False)

        # --- plumbing --------------------------------------------------------------------

        def _record(self) -> None:
            auth = self.headers.get("Authorization")
            hub.seen.append(Seen(self.command, self.path, self.headers.get("Range"), auth is not None, origin))

        def _answer(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            if "Content-Length" not in (headers or {}):
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, data: Any, headers: dict[str, str] | None = None) -> None:
            self._answer(200, json.dumps(data).encode(), {"Content-Type": "application/json", **(headers or {})})

        def _error(self, status: int, code: str, message: str) -> None:
            body = json.dumps({"error": message}).encode()
            headers = {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": message}
            self._answer(status, body, headers)

        def _allowed(self, repo: Repo, repo_id: str) -> bool:
            if repo.token is None or self.headers.get("Authorization") == f"Bearer {repo.token}":
                return True
            if repo.private:
                self._error(401, "RepoNotFound", f"Repository Not Found for url: {hub.url}{self.path}.")
                return False
            message = (
                f"Access to model {repo_id} is restricted. You must have access to it and be authenticated "
                "to access it. Please log in."
            )
            self._error(401, "GatedRepo", message)
            return False

        def _route(self, *, head: bool) -> None:
            self._record()
            url = urlsplit(self.path)
            path = unquote(url.path)
            query = parse_qs(url.query)
            if origin == "cdn":
                return self._cdn(path)
            if path.startswith("/api/models/"):
                return self._api(path.removeprefix("/api/models/"), query)
            match = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
            if match:
                return self._resolve(*match.groups())
            self._error(404, "EntryNotFound", f"{path} not found")

        def _repo(self, repo_id: str) -> Repo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(404, "RepoNotFound", f"Repository Not Found for url: {hub.url}{self.path}.")
            return repo

        def _revision(self, repo: Repo, revision: str) -> str | None:
            commit = repo.commit_of(revision)
            if commit is None:
                self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return commit

        # --- the API -----------------------------------------------------------------------

        def _api(self, rest: str, query: dict[str, list[str]]) -> None:
            parts = rest.split("/")
            repo_id = "/".join(parts[:2])
            repo = self._repo(repo_id)
            if repo is None or (repo.private and not self._allowed(repo, repo_id)):
                return
            tail = parts[2:]
            if "info" in repo.redirect:
                return self._answer(302, b"", {"Location": repo.redirect["info"]})
            if not tail or tail[0] == "revision":
                commit = self._revision(repo, tail[1] if len(tail) > 1 else "main")
                if commit is None:
                    return
                if repo.stall_info:
                    hub.released.wait()  # a hub that does not answer until the test releases it
                blobs = query.get("blobs", ["false"])[0].lower() == "true"
                info = {
                    "_id": "fake" + commit[:20],
                    "id": repo_id,
                    "modelId": repo_id,
                    "sha": commit,
                    "private": repo.private,
                    "gated": "manual" if repo.token and not repo.private else False,
                    "disabled": False,
                    "tags": [],
                    "siblings": [hub.sibling(repo, path, blobs) for path in sorted(repo.files)],
                }
                return self._json(info)
            if tail[0] == "tree" and len(tail) >= 2:
                if not self._allowed(repo, repo_id) or self._revision(repo, tail[1]) is None:
                    return
                under = "/".join(tail[2:])
                recursive = query.get("recursive", ["false"])[0].lower() == "true"
                return self._json(self._tree(repo, under, recursive))
            self._error(404, "EntryNotFound", f"{self.path} not found")

        def _tree(self, repo: Repo, under: str, recursive: bool) -> list[dict[str, Any]]:
            prefix = under + "/" if under else ""
            entries: list[dict[str, Any]] = []
            folders: set[str] = set()
            for path in sorted(repo.files):
                if not path.startswith(prefix):
                    continue
                rest = path[len(prefix) :].split("/")
                for depth in range(1, len(rest)):
                    folder = prefix + "/".join(rest[:depth])
                    if folder not in folders and (recursive or depth == 1):
                        folders.add(folder)
                        oid = hashlib.sha1(folder.encode()).hexdigest()
                        entries.append({"type": "directory", "oid": oid, "size": 0, "path": folder})
                if recursive or len(rest) == 1:
                    entries.append(hub.tree_entry(repo, path))
            return entries

        # --- files -------------------------------------------------------------------------

        def _resolve(self, repo_id: str, revision: str, path: str) -> None:
            repo = self._repo(repo_id)
            if repo is None or not self._allowed(repo, repo_id):
                return
            commit = self._revision(repo, revision)
            if commit is None:
                return
            if path not in repo.files:
                self._error(404, "EntryNotFound", f"{path} does not exist on {revision!r}")
                return
            data = repo.files[path]
            if path in repo.redirect:
                return self._answer(302, b"", {"Location": repo.redirect[path], "X-Repo-Commit": commit})
            if repo.is_lfs(path):
                sha = hashlib.sha256(data).hexdigest()
                location = f"{hub.cdn_url}/repos/{quote(repo_id)}/{sha}?file={quote(path)}&sig=fake"
                headers = {
                    "Location": location,
                    "ETag": f'"{git_blob_id(lfs_pointer(data))}"',
                    "X-Linked-Etag": f'"{sha}"',
                    "X-Linked-Size": str(len(data)),
                    "X-Repo-Commit": commit,
                    "Content-Type": "text/plain; charset=utf-8",
                }
                self._answer(302, f"Found. Redirecting to {location}".encode(), headers)
                return
            etag = {"ETag": f'"{git_blob_id(data)}"', "X-Repo-Commit": commit}
            self._bytes(data, etag, None)

        def _cdn(self, path: str) -> None:
            match = re.fullmatch(r"/repos/([^/]+/[^/]+)/([0-9a-f]{64})", path)
            repo = hub.repos.get(match.group(1)) if match else None
            query = parse_qs(urlsplit(self.path).query)
            name = query.get("file", [""])[0]
            if match is None or repo is None or name not in repo.files or query.get("sig") != ["fake"]:
                return self._answer(403, b"<Error><Code>AccessDenied</Code></Error>")
            data = repo.files[name]
            if name in repo.corrupt:
                data = bytes(b ^ 0xFF for b in data[:8]) + data[8:]
            if name in repo.grows:
                return self._growing(name, data, repo.grows[name])
            headers = {"ETag": f'"{match.group(2)}"'}
            self._bytes(data, headers, repo.stall_after.get(name), repo.slow.get(name), name not in repo.whole)

        def _growing(self, name: str, data: bytes, more: int) -> None:
            """The file and ``more`` bytes past it, with no length said (read to the close), sent
            until the client stops reading; ``hub.sent[name]``: what was sent, once it ends."""
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            sent, piece = 0, data + bytes(max(0, 65536 - len(data)))
            try:
                while sent < len(data) + more:
                    part = piece[: len(data) + more - sent]
                    self.wfile.write(part)
                    sent += len(part)
                    piece = bytes(65536)
            except OSError:
                pass  # the client went
            finally:
                hub.sent[name] = sent

        def _bytes(
            self,
            data: bytes,
            headers: dict[str, str],
            stall_after: int | None,
            rate: int | None = None,
            ranges: bool = True,
        ) -> None:
            """The file's bytes, or the part a ``Range: bytes=N-[M]`` asks for (206)."""
            status, start, end = 200, 0, len(data)
            wanted = self.headers.get("Range") if ranges else None
            if wanted:
                match = re.fullmatch(r"bytes=(\d+)-(\d*)", wanted.strip())
                if match is None or int(match.group(1)) >= len(data):
                    self._answer(416, b"", {"Content-Range": f"bytes */{len(data)}"})
                    return
                start = int(match.group(1))
                end = int(match.group(2)) + 1 if match.group(2) else len(data)
                status = 206
                headers = {**headers, "Content-Range": f"bytes {start}-{end - 1}/{len(data)}"}
            part = data[start:end]
            self.send_response(status)
            for key, value in {**headers, "Accept-Ranges": "bytes", "Content-Length": str(len(part))}.items():
                self.send_header(key, value)
            self.end_headers()
            if self.command == "HEAD":
                return
            if stall_after is not None and start <= stall_after:
                self.wfile.write(part[: stall_after - start])
                self.wfile.flush()
                hub.released.wait()  # a stalled transfer: nothing more until the test releases it
                self.close_connection = True
                return
            if rate is None:
                self.wfile.write(part)
                return
            piece = max(rate // 10, 1)  # a tenth of a second's worth at a time
            for start in range(0, len(part), piece):
                self.wfile.write(part[start : start + piece])
                self.wfile.flush()
                time.sleep(piece / rate)

    return Handler


class Bystander:
    """A server at ``address`` that answers every request 200 and records its path (``seen``)."""

    def __init__(self, address: str = "127.0.0.1") -> None:
        self.seen: list[str] = []
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                seen.append(self.path)
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

        self._server = ThreadingHTTPServer((address, 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://{address}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> Bystander:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
