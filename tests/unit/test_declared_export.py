"""``dgxmm check-config`` and ``dgxmm export`` (dgxmm.declared.commands, .export): the plan
printed, an invalid file refused with exit code 2, and what export prints accepted back."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from conftest import make_settings

from dgxmm.declared.commands import check, export
from dgxmm.declared.export import fields_of
from dgxmm.declared.parse import Sources, read
from dgxmm.declared.plan import declared_id, plan
from dgxmm.records.deployment import Deployment, Mode
from dgxmm.settings import Settings, load_settings
from dgxmm.store.db import Store

ODD = 'quote " backslash \\ tab \t newline \n unicode é 模型 del \x7f'
NAME = 'quote " backslash \\ unicode é 模型 = [x]'  # a served name or alias must be printable


def stored(settings: Settings, *deps: Deployment) -> None:
    store = Store(settings.server.data_dir / "dgxmm.db")
    for dep in deps:
        store.put(dep, keep=False)
    store.close()


def variety(gguf: str = "/m.gguf") -> list[Deployment]:
    return [
        Deployment(id="a1", name="plain", served_name="plain", engine="llamacpp", model=gguf, memory_gib=8),
        Deployment(
            id="a2",
            name="every",
            served_name="Every/Model:1",
            aliases=["e", NAME],
            engine="vllm",
            model="org/model",
            args=["--max-model-len", "8192", ODD],
            env={"HF_HOME": "/hf", "ODD": ODD},
            memory_gib=40.5,
            mode=Mode.ON_DEMAND,
            idle_timeout_s=300,
            preload=True,
            sleep_mode=True,
            gpus=2,
            gpu_ids=[0, 1],
            volumes=["/hf:/root/.cache:ro"],
            shm_size="8g",
            health_path="/health",
            metrics_path="/metrics",
            upstream_max_connections=64,
            max_concurrent=4,
            request_defaults={"top_k": 40, "stop": ["\n", ODD], "chat_template_kwargs": {"enable_thinking": False}},
            request_overrides={"temperature": 0.2, "min p": 0.05},
            strip_params=["seed", "logit_bias"],
            capabilities=["completion", "tools"],
        ),
        Deployment(
            id="a3", name="cmd", served_name="cmd", engine="command", command=["srv", "--port", "{port}"], memory_gib=1
        ),
    ]


def test_export_prints_what_check_config_accepts_and_plans(tmp_path: Path) -> None:
    first = make_settings(tmp_path / "one")
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")  # check-config opens the llama.cpp model of a new declaration
    stored(first, *variety(str(gguf)))
    out = io.StringIO()
    assert export(first, out) == 0
    text = out.getvalue()
    assert "\nmax_concurrent = 4\n" in text
    assert '\ncapabilities = ["completion", "tools"]\n' in text
    assert '\nrequest_overrides = { temperature = 0.2, "min p" = 0.05 }\n' in text
    config = tmp_path / "exported.toml"
    config.write_text(text)
    declared = read(Sources(config, None))
    assert [d.fields for d in declared] == [fields_of(dep) for dep in variety(str(gguf))]

    other = load_settings(config).model_copy(update={"server": make_settings(tmp_path / "two").server})
    other._source = config
    out, err = io.StringIO(), io.StringIO()
    assert check(other, out, err) == 0, err.getvalue()
    assert out.getvalue().splitlines() == [
        "config ok",
        f"create  plain ({config})",
        f"create  every ({config})",
        f"create  cmd ({config})",
        "unchanged: 0",
    ]


def test_check_config_refuses_an_invalid_file_or_an_api_deployment_s_name(tmp_path: Path) -> None:
    config = tmp_path / "dgxmm.toml"
    config.write_text('[[deployments]]\nname = "plain"\nengine = "llamacpp"\nmemory_gib = 1\n')
    settings = load_settings(config).model_copy(update={"server": make_settings(tmp_path).server})
    settings._source = config
    err = io.StringIO()
    assert check(settings, io.StringIO(), err) == 2
    assert (
        err.getvalue()
        == f"config error: {config}:1: [[deployments]] #1 (plain) model: required for the llamacpp engine\n"
    )
    config.write_text('[[deployments]]\nname = "plain"\nengine = "llamacpp"\nmodel = "/m.gguf"\nmemory_gib = 1\n')
    stored(settings, variety()[0])
    err = io.StringIO()
    assert check(settings, io.StringIO(), err) == 2
    assert "plain) name: a deployment made through the API (id a1) has this name" in err.getvalue()


def test_check_config_refuses_a_model_file_a_new_declaration_cannot_load(tmp_path: Path) -> None:
    """As applying would (declared/modelfiles.py): the file named, its line, table and field."""
    config = tmp_path / "dgxmm.toml"
    not_gguf = tmp_path / "notes.txt"
    not_gguf.write_text("hello")
    table = '[[deployments]]\nname = "m"\nengine = "llamacpp"\nmemory_gib = 1\nmodel = "{}"\n'
    settings = load_settings(None).model_copy(update={"server": make_settings(tmp_path).server})
    for model, why in [
        (tmp_path / "missing.gguf", "no such file on this host"),
        (not_gguf, "not a GGUF file (it does not begin with the GGUF magic)"),
        (tmp_path, "a directory, not a .gguf file"),
    ]:
        config.write_text(table.format(model))
        settings._source = config
        err = io.StringIO()
        assert check(settings, io.StringIO(), err) == 2
        assert err.getvalue() == f"config error: {config}:5: [[deployments]] #1 (m) model: {model}: {why}\n"
    config.write_text(table.format("hf://org/repo/m.gguf"))  # a store download: not a file yet
    out = io.StringIO()
    assert check(settings, out) == 0 and out.getvalue().splitlines()[1] == f"create  m ({config})"


def test_check_config_prints_changes_and_removals(tmp_path: Path) -> None:
    config = tmp_path / "dgxmm.toml"
    config.write_text('[[deployments]]\nname = "m"\nengine = "llamacpp"\nmodel = "/m.gguf"\nmemory_gib = 6\n')
    settings = load_settings(config).model_copy(update={"server": make_settings(tmp_path).server})
    settings._source = config
    mine: dict[str, Any] = {"managed_by": "config", "declared_in": str(config), "engine": "llamacpp"}
    stored(
        settings,
        Deployment(id=declared_id("m"), name="m", served_name="m", model="/m.gguf", memory_gib=4, **mine),
        Deployment(id=declared_id("old"), name="old", served_name="old", model="/o.gguf", memory_gib=4, **mine),
    )
    out = io.StringIO()
    assert check(settings, out) == 0
    assert out.getvalue().splitlines()[1:] == ["change  m: memory_gib", "remove  old", "unchanged: 0"]
    assert plan(read(Sources.of(settings)), []).created[0].id == declared_id("m")
