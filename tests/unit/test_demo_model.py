"""The demo model as a declared deployment (examples/deployments.d/demo.toml, which
examples/dgxmm.toml's deployments_dir names): ``make run`` writes its model first
(``python -m dgxmm.demo --write-model``), where the declaration points, so the declaration is
valid from dgxmm's first start; without it, the missing model is the file's error."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest

from dgxmm.declared.commands import check
from dgxmm.declared.parse import Sources, read
from dgxmm.demo.cold_start import main
from dgxmm.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def clone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh clone's examples/, and its root as the directory `make run` starts in."""
    shutil.copytree(ROOT / "examples" / "deployments.d", tmp_path / "examples" / "deployments.d")
    shutil.copy(ROOT / "examples" / "dgxmm.toml", tmp_path / "examples" / "dgxmm.toml")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_example_config_declares_the_demo_in_its_data_dir(clone: Path) -> None:
    settings = load_settings(Path("examples/dgxmm.toml"))
    (demo,) = read(Sources.of(settings))
    assert (demo.name, demo.file) == ("demo", "examples/deployments.d/demo.toml")
    assert (demo.fields["engine"], demo.fields["mode"].value) == ("llamacpp", "on_demand")
    assert Path(demo.fields["model"]).parent.parent == settings.server.data_dir  # data/demo/…


def test_make_run_writes_the_declared_model_so_the_declaration_is_valid(
    clone: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = load_settings(Path("examples/dgxmm.toml"))
    err = io.StringIO()
    assert check(settings, io.StringIO(), err) == 2  # a fresh clone: the model is not there yet
    assert err.getvalue() == (
        "config error: examples/deployments.d/demo.toml:14: [[deployments]] #1 (demo) model: "
        "data/demo/tiny-random-llama.gguf: no such file on this host\n"
    )
    main(["--config", "examples/dgxmm.toml", "--write-model"])
    model = clone / "data" / "demo" / "tiny-random-llama.gguf"
    assert model.read_bytes()[:4] == b"GGUF" and "wrote the demo model" in capsys.readouterr().out
    out = io.StringIO()
    assert check(settings, out) == 0
    assert out.getvalue().splitlines() == [
        "config ok",
        "create  demo (examples/deployments.d/demo.toml)",
        "unchanged: 0",
    ]
    before = model.stat().st_mtime_ns
    main(["--config", "examples/dgxmm.toml", "--write-model"])  # `make run` again: kept as it is
    assert model.stat().st_mtime_ns == before and capsys.readouterr().out == ""
