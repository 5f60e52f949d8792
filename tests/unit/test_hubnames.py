"""``hf://ORG/REPO[@REVISION][/PATH]`` names and what the model store answers a deployer about
them: the local path once the files are here, the download's progress until then."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dgxmm.modelstore.names import HubName, parse, progress_text, readiness, users_of
from dgxmm.modelstore.pull import GIB
from dgxmm.modelstore.record import ModelFile, ModelRecord, Status
from dgxmm.records.deployment import Deployment


@pytest.mark.parametrize(
    ("model", "name"),
    [
        ("hf://org/repo", HubName("org/repo", "main", None)),
        ("hf://org/repo@v1.0", HubName("org/repo", "v1.0", None)),
        ("hf://org/repo/sub/model-Q4_K_M.gguf", HubName("org/repo", "main", "sub/model-Q4_K_M.gguf")),
        ("hf://org/repo@abc/model.gguf", HubName("org/repo", "abc", "model.gguf")),
        ("/models/local.gguf", None),
    ],
)
def test_names_parse(model: str, name: HubName | None) -> None:
    assert parse(model) == name


@pytest.mark.parametrize("model", ["hf://org", "hf://../x/y", "hf://org/repo/../../etc/passwd", "hf://org/repo@../x"])
def test_names_that_would_leave_the_models_directory_are_refused(model: str) -> None:
    with pytest.raises(ValueError, match="model: "):
        parse(model)


def test_readiness_gives_the_file_once_ready_and_the_progress_until_then() -> None:
    name = HubName("org/repo", "main", "model.gguf")
    record = ModelRecord("m1", "org/repo", "main", ["model.gguf"], files=[ModelFile("model.gguf", 18 * GIB, None, "a")])
    assert readiness(name, None, 0).status is None
    record = replace(record, bytes_done=int(3.2 * GIB))
    waiting = readiness(name, record, 120 * 1024**2)
    assert waiting.status is Status.DOWNLOADING and waiting.path is None
    assert waiting.reason == "downloading 3.2 of 18.0 GiB, 120 MiB/s, about 2 min left"
    record = replace(record, status=Status.READY, path="/m/snapshots/c")
    assert readiness(name, record, 0).path == "/m/snapshots/c/model.gguf"
    assert readiness(HubName("org/repo", "main", None), record, 0).path == "/m/snapshots/c"
    record = replace(record, status=Status.FAILED, error="revision 'x' not found in org/repo (404)")
    assert readiness(name, record, 0).reason == record.error


def test_progress_text_without_a_speed_says_no_time_left() -> None:
    assert progress_text(0, 2 * GIB, 0) == "downloading 0.0 of 2.0 GiB"
    assert progress_text(GIB, 2 * GIB, GIB / 10).endswith("about 10 s left")
    assert progress_text(3 * 1024**2, 24 * 1024**2, 0) == "downloading 3.0 of 24.0 MiB"


def test_a_deployment_uses_the_records_that_hold_its_files_or_that_it_names() -> None:
    def dep(name: str, model: str, model_path: str | None = None) -> Deployment:
        return Deployment(
            id=name, name=name, served_name=name, engine="llamacpp", model=model, model_path=model_path, memory_gib=1
        )

    ggufs = ModelRecord(
        "m1",
        "org/repo",
        "main",
        ["*.gguf"],
        commit="c" * 40,
        path="/m/snapshots/c",
        files=[ModelFile("a.gguf", 1, None, "x"), ModelFile("b.gguf", 1, None, "y")],
    )
    deployments = [
        dep("local", "/m/snapshots/c/a.gguf"),  # a path inside its snapshot
        dep("pulled", "hf://org/other/z.gguf", model_path="/m/snapshots/c/b.gguf"),  # its local file
        dep("named", "hf://org/repo/b.gguf"),  # planned: one of its files, at its revision
        dep("whole", "hf://org/repo@" + "c" * 40),  # the snapshot, by commit
        dep("other-file", "hf://org/repo/c.gguf"),
        dep("other-revision", "hf://org/repo@v2/a.gguf"),
        dep("other-repo", "hf://org/repo2/a.gguf"),
    ]
    assert users_of(ggufs, deployments) == ["local", "pulled", "named", "whole"]
