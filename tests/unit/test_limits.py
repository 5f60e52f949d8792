"""The memory limit an engine is launched with (deploy/limits.py) and the refusals around it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dgxmm.deploy.budget import MemoryBudget, Reading
from dgxmm.deploy.engines import ENGINES
from dgxmm.deploy import weights
from dgxmm.deploy.limits import GIB, EngineLimits, model_size_gib
from dgxmm.deploy.weights import MAX_GGUF_PARTS
from dgxmm.records.deployment import Deployment
from dgxmm.errors import InvalidInput
from dgxmm.settings import EngineSettings, MemorySettings


def dep(**kw: Any) -> Deployment:
    base = {"id": "x", "name": "x", "served_name": "m", "engine": "vllm", "memory_gib": 32, "model": "org/model"}
    return Deployment(**{**base, **kw})


def gpu(total: float = 128) -> EngineLimits:
    return EngineLimits(lambda index: total, EngineSettings())


def cpu() -> EngineLimits:
    return EngineLimits(lambda index: 64, EngineSettings(vllm_build="cpu"))


def refused(limits: EngineLimits, d: Deployment) -> InvalidInput:
    with pytest.raises(InvalidInput) as info:
        limits.resolve(d)
    return info.value


def model_dir(tmp_path: Path, weights_gib: float) -> Path:
    """A model directory whose weight file has the given size (sparse: no disk is used)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text("{}")
    with (tmp_path / "model.safetensors").open("wb") as f:
        f.truncate(int(weights_gib * GIB))
    return tmp_path


def test_32_of_128_gib_is_a_quarter_of_the_device() -> None:
    d = dep()
    d = d.model_copy(update={"memory_limit": gpu().resolve(d)})
    assert d.memory_limit is not None
    assert (d.memory_limit.flag, d.memory_limit.value, d.memory_limit.set_by) == (
        "--gpu-memory-utilization",
        "0.25",
        "dgxmm",
    )
    assert d.memory_limit.gib == 32 and d.memory_limit.device_total_gib == 128
    argv = ENGINES["vllm"].argv(d, 7, EngineSettings(vllm_python="py"))
    assert argv[-2:] == ["--gpu-memory-utilization", "0.25"]
    assert ENGINES["vllm"].container_cmd(d, 8000)[-2:] == ["--gpu-memory-utilization", "0.25"]


@pytest.mark.parametrize(
    ("memory", "total", "share"),
    [
        (10, 128, "0.078"),  # 0.078125, rounded down
        (38.4, 128, "0.3"),  # exactly 0.3, even though 38.4 / 128 * 1000 is 299.99999999999994
        (119.7, 119.7, "1"),
        (0.5, 119.7, "0.004"),
    ],
)
def test_the_share_is_rounded_down_to_3_decimals(memory: float, total: float, share: str) -> None:
    limit = gpu(total).resolve(dep(memory_gib=memory))
    assert limit is not None and limit.value == share
    assert limit.gib <= memory


def test_a_share_vllm_cannot_take_is_refused_on_memory_gib() -> None:
    assert refused(gpu(128), dep(memory_gib=0.1)).field == "memory_gib"  # 0.0008: rounds to 0
    err = refused(gpu(100), dep(memory_gib=120))
    assert err.field == "memory_gib" and "100.00 GiB" in err.message


def test_the_device_total_comes_from_the_memory_source() -> None:
    declared = MemoryBudget(MemorySettings(capacity_gib=100, reserve_gib=8))
    assert declared.device_total() == 100  # no reserve taken off: vLLM's share is of the device
    override = MemoryBudget(MemorySettings(capacity_gib=100, device_total_gib=128))
    assert override.device_total() == 128
    reads: list[int] = []

    def reader() -> Reading:
        reads.append(1)
        return Reading(total=119.7, available=60)

    measured = MemoryBudget(MemorySettings(source="meminfo", reserve_gib=8), reader=reader)
    assert measured.device_total() == 119.7 and measured.device_total() == 119.7
    assert len(reads) == 1  # read once: the total does not change
    nvml = MemoryBudget(MemorySettings(source="nvml", device_total_gib=80), reader=reader)
    assert nvml.device_total() == 80


@pytest.mark.parametrize(
    "args",
    [
        ["--gpu-memory-utilization", "0.2"],
        ["--gpu-memory-utilization=0.2"],
        ["--gpu_memory_utilization", "0.2"],
        ["--gpu-memory-util", "0.2"],
        ["--device-memory-utilization", "0.2"],
        ["--gpu-memory-utilization", "0.9", "--gpu-memory-utilization", "0.2"],
    ],
)
def test_the_deployments_own_share_is_kept_when_it_fits(args: list[str]) -> None:
    d = dep(args=args)
    d = d.model_copy(update={"memory_limit": gpu().resolve(d)})
    assert d.memory_limit is not None
    assert d.memory_limit.set_by == "deployment" and d.memory_limit.added == []
    assert d.memory_limit.value == "0.2" and d.memory_limit.gib == pytest.approx(25.6)
    argv = ENGINES["vllm"].argv(d, 7, EngineSettings())
    assert argv[-len(args) :] == args  # the deployment's own arguments come last, nothing added


@pytest.mark.parametrize(
    "args",
    [
        ["--gpu-memory-utilization", "0.9"],
        ["--gpu-memory-utilization=0.26"],
        ["--gpu_memory_util", "1"],
        ["--gpu-memory-utilization", "0.2", "--gpu-memory-utilization", "0.9"],  # vLLM keeps the last
        ["--kv-cache-memory-bytes", "40G"],
        ["--kv-cache-memory-bytes=34359739392"],
        ["--kv_cache_memory", "35g"],
    ],
)
def test_a_flag_claiming_more_than_memory_gib_is_refused_on_args(args: list[str]) -> None:
    err = refused(gpu(), dep(args=args))
    assert err.field == "args" and "more than memory_gib 32 GiB" in err.message
    assert args[0].split("=")[0] in err.message


@pytest.mark.parametrize(
    "args",
    [
        ["--gpu-memory-utilization", "lots"],
        ["--kv-cache-memory-bytes", "8 GB"],
        ["--gpu-memory-utilization"],
        ["--gpu-memory-utilization", "-1"],
    ],
)
def test_a_flag_without_a_usable_value_is_refused_on_args(args: list[str]) -> None:
    assert refused(gpu(), dep(args=args)).field == "args"


def test_a_kv_cache_size_counts_the_weights_and_still_gets_dgxmms_share(tmp_path: Path) -> None:
    model = model_dir(tmp_path, weights_gib=16)
    d = dep(model=str(model), args=["--kv-cache-memory-bytes", "16G"])
    limit = gpu().resolve(d)
    assert limit is not None and limit.set_by == "deployment" and limit.flag == "--kv-cache-memory-bytes"
    assert limit.gib == pytest.approx(32) and limit.weights_gib == pytest.approx(16)
    # vLLM checks at start-up that its share of the device is free: dgxmm's share asks for 32 GiB.
    assert limit.added == ["--gpu-memory-utilization", "0.25"]
    err = refused(gpu(), dep(model=str(model), args=["--kv-cache-memory-bytes", "17G"]))
    assert err.field == "args" and "33.00 GiB" in err.message


def test_the_cpu_build_gets_a_kv_cache_of_memory_gib_minus_the_weights(tmp_path: Path) -> None:
    model = model_dir(tmp_path, weights_gib=1.5)
    d = dep(model=str(model), memory_gib=4)
    d = d.model_copy(update={"memory_limit": cpu().resolve(d)})
    assert d.memory_limit is not None
    assert d.memory_limit.flag == "--kv-cache-memory-bytes" and d.memory_limit.value == str(int(2.5 * GIB))
    assert d.memory_limit.weights_gib == pytest.approx(1.5) and d.memory_limit.gib == pytest.approx(4)
    assert ENGINES["vllm"].argv(d, 7, EngineSettings())[-2:] == ["--kv-cache-memory-bytes", str(int(2.5 * GIB))]
    # Weights of unknown size (a hub name): the whole memory_gib is the KV cache's.
    hub = cpu().resolve(dep(memory_gib=4))
    assert hub is not None and hub.value == str(4 * GIB) and hub.weights_gib is None
    err = refused(cpu(), dep(model=str(model), memory_gib=1.5))
    assert err.field == "memory_gib" and "1.50 GiB" in err.message


def test_the_cpu_build_cannot_sleep_and_says_so_at_create_time() -> None:
    err = refused(cpu(), dep(sleep_mode=True))
    assert err.field == "sleep_mode" and "CPU build of vLLM cannot sleep" in err.message
    assert gpu().resolve(dep(sleep_mode=True)) is not None  # the GPU build can


def test_the_cpu_builds_own_kv_variable_is_kept_or_refused_on_env(tmp_path: Path) -> None:
    model = model_dir(tmp_path, weights_gib=1)
    limit = cpu().resolve(dep(model=str(model), memory_gib=4, env={"VLLM_CPU_KVCACHE_SPACE": "3"}))
    assert limit is not None and limit.set_by == "deployment" and limit.added == [] and limit.gib == 4
    err = refused(cpu(), dep(model=str(model), memory_gib=4, env={"VLLM_CPU_KVCACHE_SPACE": "4"}))
    assert err.field == "env" and "5.00 GiB" in err.message
    # The GPU build ignores the variable, so it neither counts nor replaces dgxmm's share.
    assert gpu().resolve(dep(env={"VLLM_CPU_KVCACHE_SPACE": "400"})).set_by == "dgxmm"  # type: ignore[union-attr]


def test_other_engines_get_no_limit() -> None:
    assert gpu().resolve(dep(engine="command", command=["srv"])) is None
    assert gpu().resolve(dep(engine="llamacpp", model="/no/such.gguf")) is None


def test_a_gguf_larger_than_memory_gib_is_refused_naming_both_sizes(tmp_path: Path) -> None:
    gguf = tmp_path / "big.gguf"
    with gguf.open("wb") as f:
        f.truncate(int(5.5 * GIB))
    err = refused(gpu(), dep(engine="llamacpp", model=str(gguf), memory_gib=4))
    assert err.field == "memory_gib"
    assert "5.50 GiB" in err.message and "memory_gib 4 GiB" in err.message and str(gguf) in err.message
    assert gpu().resolve(dep(engine="llamacpp", model=str(gguf), memory_gib=6)) is None


def test_a_split_gguf_counts_every_part(tmp_path: Path) -> None:
    for index in (1, 2, 3):
        with (tmp_path / f"m-{index:05d}-of-00003.gguf").open("wb") as f:
            f.truncate(2 * GIB)
    first = tmp_path / "m-00001-of-00003.gguf"
    assert model_size_gib(str(first)) == pytest.approx(6)
    assert refused(gpu(), dep(engine="llamacpp", model=str(first), memory_gib=5)).field == "memory_gib"


def test_a_split_ggufs_parts_are_found_in_one_listing_not_a_stat_per_claimed_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name may claim 65,535 parts (99,999 used to make as many stats on the event loop): only
    the parts present are looked at, found among the directory's names; other files and other
    splits beside it do not count."""
    for index in (1, 2):
        (tmp_path / f"m-{index:05d}-of-{MAX_GGUF_PARTS}.gguf").write_bytes(b"x" * 1000)
    (tmp_path / "m-00001-of-00002.gguf").write_bytes(b"x" * 7)  # another split of the same stem
    (tmp_path / "notes.txt").write_bytes(b"x" * 5)
    stats: list[Path] = []
    real_stat = Path.stat
    monkeypatch.setattr(Path, "stat", lambda self, **kw: stats.append(self) or real_stat(self, **kw))
    first = tmp_path / f"m-00001-of-{MAX_GGUF_PARTS}.gguf"
    assert model_size_gib(str(first)) == pytest.approx(2000 / GIB)
    assert len(stats) <= 1  # the model's own is_file(): the parts come from the listing


@pytest.mark.parametrize("name", ["m-00001-of-99999.gguf", "m-00004-of-00003.gguf", "m-00000-of-00000.gguf"])
def test_a_part_count_no_llamacpp_reads_is_refused(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_bytes(b"x")
    err = refused(gpu(), dep(engine="llamacpp", model=str(tmp_path / name), memory_gib=4))
    assert err.field == "model" and "65535 parts" in err.message


def test_a_split_gguf_in_a_directory_too_large_to_list_is_not_sized(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(weights, "MAX_LISTED", 3)
    for index in (1, 2, 3):
        (tmp_path / f"m-{index:05d}-of-00003.gguf").write_bytes(b"x")
    assert model_size_gib(str(tmp_path / "m-00001-of-00003.gguf")) == pytest.approx(3 / GIB)
    (tmp_path / "notes.txt").write_bytes(b"x")
    assert model_size_gib(str(tmp_path / "m-00001-of-00003.gguf")) is None


def test_model_sizes(tmp_path: Path) -> None:
    assert model_size_gib("") is None and model_size_gib("org/model") is None
    model = model_dir(tmp_path / "st", weights_gib=0.5)
    (model / "pytorch_model.bin").write_bytes(b"x" * 1024)  # vLLM loads the safetensors only
    assert model_size_gib(str(model)) == pytest.approx(0.5)
    bins = tmp_path / "bins"
    bins.mkdir()
    (bins / "pytorch_model.bin").write_bytes(b"x" * 1024)
    assert model_size_gib(str(bins)) == pytest.approx(1024 / GIB)
