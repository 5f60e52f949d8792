"""The local hub (tests/hub/server.py) checked against ``huggingface_hub`` itself: what the Hub's
own client downloads from it lands in the Hub's cache layout, byte for byte, so the model
store's tests run against a hub that answers as the real one does."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import pytest
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

from hub.fixture import hub_fixture  # noqa: F401 (the fixture "hub")
from hub.server import FakeHub

WEIGHTS = bytes(range(256)) * 40  # an LFS file (10 KiB)
CONFIG = b'{"model_type": "llama"}'  # a small git file


def two_files(hub: FakeHub) -> None:
    hub.add("org/tiny", {"model.gguf": WEIGHTS, "sub/config.json": CONFIG})


def test_model_info_with_blobs_gives_sizes_and_lfs_sha256(hub: FakeHub) -> None:
    two_files(hub)
    info = HfApi(endpoint=hub.url).model_info("org/tiny", files_metadata=True)
    assert info.sha == hub.repos["org/tiny"].commit
    files = {s.rfilename: s for s in info.siblings or []}
    assert files["model.gguf"].size == len(WEIGHTS)
    assert files["model.gguf"].lfs is not None
    assert files["model.gguf"].lfs.sha256 == hashlib.sha256(WEIGHTS).hexdigest()
    assert files["sub/config.json"].lfs is None and files["sub/config.json"].size == len(CONFIG)


def test_hf_hub_download_follows_the_lfs_redirect_into_the_cache_layout(hub: FakeHub, tmp_path: Path) -> None:
    two_files(hub)
    got = Path(hf_hub_download("org/tiny", "model.gguf", cache_dir=tmp_path, endpoint=hub.url))
    commit = hub.repos["org/tiny"].commit
    assert got == tmp_path / "models--org--tiny" / "snapshots" / commit / "model.gguf"
    assert got.read_bytes() == WEIGHTS
    assert got.resolve() == tmp_path / "models--org--tiny" / "blobs" / hashlib.sha256(WEIGHTS).hexdigest()
    assert (tmp_path / "models--org--tiny" / "refs" / "main").read_text() == commit
    assert [s.origin for s in hub.gets("model.gguf")] == ["cdn"]  # the bytes came from the CDN


def test_snapshot_download_lists_the_tree_and_fetches_every_file(hub: FakeHub, tmp_path: Path) -> None:
    two_files(hub)
    folder = Path(snapshot_download("org/tiny", cache_dir=tmp_path, endpoint=hub.url))
    assert (folder / "model.gguf").read_bytes() == WEIGHTS
    assert (folder / "sub" / "config.json").read_bytes() == CONFIG
    assert any("/tree/" in s.path and "recursive=true" in s.path.lower() for s in hub.seen)


def test_range_requests_answer_206_with_the_part(hub: FakeHub) -> None:
    two_files(hub)
    url = f"{hub.url}/org/tiny/resolve/main/model.gguf"
    with httpx.Client(follow_redirects=True) as client:
        answer = client.get(url, headers={"Range": "bytes=100-"})
    assert answer.status_code == 206
    assert answer.content == WEIGHTS[100:]
    assert answer.headers["Content-Range"] == f"bytes 100-{len(WEIGHTS) - 1}/{len(WEIGHTS)}"


def test_missing_repo_revision_and_gated_repo_raise_the_clients_errors(hub: FakeHub, tmp_path: Path) -> None:
    two_files(hub)
    hub.add("org/gated", {"model.gguf": WEIGHTS}, token="hf_secret")
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("org/missing", "model.gguf", cache_dir=tmp_path, endpoint=hub.url)
    with pytest.raises(RevisionNotFoundError):
        HfApi(endpoint=hub.url).model_info("org/tiny", revision="nope", files_metadata=True)
    with pytest.raises(GatedRepoError):
        hf_hub_download("org/gated", "model.gguf", cache_dir=tmp_path, endpoint=hub.url)
    got = hf_hub_download("org/gated", "model.gguf", cache_dir=tmp_path, endpoint=hub.url, token="hf_secret")
    assert Path(got).read_bytes() == WEIGHTS
    assert HfApi(endpoint=hub.url).model_info("org/gated", files_metadata=True).gated == "manual"


def test_a_private_repo_is_not_found_without_its_token(hub: FakeHub) -> None:
    """The Hub answers 401 with RepoNotFound for a private repository asked without a token; the
    client makes it a RepositoryNotFoundError carrying that 401."""
    hub.add("org/private", {"model.gguf": WEIGHTS}, token="hf_secret", private=True)
    with pytest.raises(RepositoryNotFoundError) as refused:
        HfApi(endpoint=hub.url).model_info("org/private", files_metadata=True)
    assert refused.value.response.status_code == 401
    info = HfApi(endpoint=hub.url, token="hf_secret").model_info("org/private", files_metadata=True)
    assert info.private and [s.rfilename for s in info.siblings or []] == ["model.gguf"]
