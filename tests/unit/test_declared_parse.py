"""Declared deployments read and checked (dgxmm.declared.parse): each table with the admin
API's schema, all of them together, every refusal naming file, line, table and field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dgxmm import boundedtoml
from dgxmm.declared import parse
from dgxmm.declared.parse import DeclarationError, Sources, read
from dgxmm.settings import load_settings

ONE = """
[server]
port = 8090

[deployment_defaults]
engine = "llamacpp"
mode = "on_demand"

[[deployments]]
name = "qwen"
model = "/models/qwen.gguf"
memory_gib = 8

[[deployments]]
name = "gemma"
model = "/models/gemma.gguf"
memory_gib = 12
mode = "always_on"
aliases = ["g"]
"""


def sources(tmp_path: Path, main: str, files: dict[str, str] | None = None) -> Sources:
    config = tmp_path / "dgxmm.toml"
    config.write_text(main)
    folder = None
    if files is not None:
        folder = tmp_path / "deployments.d"
        folder.mkdir(exist_ok=True)
        for name, text in files.items():
            (folder / name).write_text(text)
    return Sources(config, folder)


def refusal(src: Sources) -> DeclarationError:
    with pytest.raises(DeclarationError) as caught:
        read(src)
    return caught.value


def test_tables_of_the_config_file_and_the_directory_with_defaults(tmp_path: Path) -> None:
    more = '[[deployments]]\nname = "bge"\nengine = "command"\ncommand = ["x"]\nmemory_gib = 1\n'
    found = read(sources(tmp_path, ONE, {"b.toml": more, "ignored.txt": "not toml"}))
    assert [(d.name, d.fields["mode"].value, d.fields["served_name"]) for d in found] == [
        ("qwen", "on_demand", "qwen"),
        ("gemma", "always_on", "gemma"),
        ("bge", "on_demand", "bge"),
    ]
    assert found[0].fields["engine"] == "llamacpp" and found[2].fields["engine"] == "command"
    assert (found[1].file, found[1].table, found[1].line) == (str(tmp_path / "dgxmm.toml"), 1, 14)
    assert found[2].file == str(tmp_path / "deployments.d" / "b.toml")


def test_load_settings_keeps_the_tables_and_the_file(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text(ONE)
    settings = load_settings(tmp_path / "c.toml")
    src = Sources.of(settings)
    assert src.config_file == tmp_path / "c.toml" and len(settings.deployments) == 2
    assert [d.name for d in read(src)] == ["qwen", "gemma"]


def test_settings_without_a_file_declare_their_own_tables() -> None:
    src = Sources(None, None, ({"name": "a", "engine": "command", "command": ["x"], "memory_gib": 1},))
    assert [(d.name, d.file) for d in read(src)] == [("a", "config")]


@pytest.mark.parametrize(
    ("table", "field", "line", "message"),
    [
        ('model = "/m.gguf"\nmemory_gib = 8\nflavour = "x"', "flavour", 8, "unknown field"),
        ('model = "/m.gguf"\nmemory_gib = "eight"', "memory_gib", 7, "valid number"),
        ('model = "/m.gguf"\nmemory_gib = -1', "memory_gib", 7, "greater than 0"),
        ('memory_gib = 1\nengine = "vllm"', "model", 4, "required for the vllm engine"),
        ('model = "/m.gguf"\nmemory_gib = 1\nidle_timeout_s = 5', "idle_timeout_s", 8, "between 60 and 86400 s"),
        ('model = "/m.gguf"\nmemory_gib = 1\nenv = { "1X" = "y" }', "env", 8, "not a variable name"),
        ('model = "/m.gguf"\nmemory_gib = 1\nmax_concurrent = 0', "max_concurrent", 8, "greater than or equal to 1"),
        ('model = "/m.gguf"\nmemory_gib = 1\nmax_concurrent = 1.5', "max_concurrent", 8, "valid integer"),
        ('model = "/m.gguf"\nmemory_gib = 1\nrequest_overrides = { model = "x" }', "request_overrides", 8, "not a"),
        ('model = "/m.gguf"\nmemory_gib = 1\nstrip_params = ["stream"]', "strip_params", 8, "the gateway's"),
        (
            'model = "/m.gguf"\nmemory_gib = 1\nrequest_defaults = { top_k = 1 }\nstrip_params = ["top_k"]',
            "strip_params",
            9,
            "'top_k' is in request_defaults already",
        ),
        ('model = "/m.gguf"\nmemory_gib = 1\nrequest_defaults = { t = nan }', "request_defaults", 8, "finite"),
    ],
)
def test_a_bad_table_names_file_line_table_and_field(
    tmp_path: Path, table: str, field: str, line: int, message: str
) -> None:
    main = f'[deployment_defaults]\nengine = "llamacpp"\n\n[[deployments]]\nname = "m"\n{table}\n'
    err = refusal(sources(tmp_path, main))
    assert (err.field, err.table, err.name) == (field, 0, "m")
    assert message in err.message and err.line == line, err
    assert str(err).startswith(f"{tmp_path / 'dgxmm.toml'}:{line}: [[deployments]] #1 (m) {field}:")


def test_idle_timeout_0_is_accepted_as_never_idle_and_the_parameters_as_given(tmp_path: Path) -> None:
    table = (
        '[[deployments]]\nname = "m"\nengine = "command"\ncommand = ["x"]\nmemory_gib = 1\nmode = "on_demand"\n'
        'idle_timeout_s = 0\nrequest_overrides = { temperature = 0.2 }\nstrip_params = ["seed"]\n'
        'request_defaults = { stop = ["\\n"], chat_template_kwargs = { enable_thinking = false } }\n'
    )
    [decl] = read(sources(tmp_path, table))
    assert decl.fields["idle_timeout_s"] == 0 and decl.fields["strip_params"] == ["seed"]
    assert decl.fields["request_overrides"] == {"temperature": 0.2}
    assert decl.fields["request_defaults"] == {"stop": ["\n"], "chat_template_kwargs": {"enable_thinking": False}}


def test_two_declarations_of_a_name_in_two_files(tmp_path: Path) -> None:
    again = '[[deployments]]\nname = "qwen"\nengine = "command"\ncommand = ["x"]\nmemory_gib = 1\n'
    err = refusal(sources(tmp_path, ONE, {"a.toml": again}))
    assert err.file.endswith("a.toml") and err.field == "name" and "first in" in err.message
    assert err.line == 2  # the line of its name


def test_a_served_name_or_alias_taken_twice(tmp_path: Path) -> None:
    taken = '[[deployments]]\nname = "other"\nengine = "command"\ncommand = ["x"]\nmemory_gib = 1\naliases = ["g"]\n'
    err = refusal(sources(tmp_path, ONE, {"a.toml": taken}))
    assert (err.field, err.name) == ("aliases", "other") and "'g' is a name of gemma" in err.message


def test_files_that_are_not_declarations(tmp_path: Path) -> None:
    err = refusal(sources(tmp_path, ONE, {"a.toml": "[[deployments]\nname = 1\n"}))
    assert err.file.endswith("a.toml") and err.line == 1 and err.message.startswith("not TOML")
    err = refusal(sources(tmp_path, ONE, {"a.toml": "[server]\nport = 1\n"}))
    assert "unknown key 'server'" in err.message
    err = refusal(sources(tmp_path, ONE.replace("mode =", "nme =", 1)))
    assert (err.field, err.line) == ("nme", 7) and "[deployment_defaults]" in err.message
    err = refusal(sources(tmp_path, '[[deployments]]\nengine = "command"\n'))
    assert err.field == "name" and err.line == 1


def test_reading_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(boundedtoml, "MAX_BYTES", 100)
    err = refusal(sources(tmp_path, ONE))
    assert "larger than 100 bytes" in err.message
    monkeypatch.setattr(boundedtoml, "MAX_BYTES", 1 << 20)
    monkeypatch.setattr(parse, "MAX_DEPLOYMENTS", 1)
    assert "more than 1 declared" in refusal(sources(tmp_path, ONE)).message
    monkeypatch.setattr(parse, "MAX_FILES", 1)
    assert "more than 1 *.toml" in refusal(sources(tmp_path, "", {"a.toml": "", "b.toml": ""})).message
    assert "cannot read the directory" in refusal(Sources(None, tmp_path / "missing")).message


def test_all_files_together_are_bounded_and_the_count_comes_before_the_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parse, "MAX_TOTAL_BYTES", len(ONE.encode()) + 10)
    err = refusal(sources(tmp_path, ONE, {"a.toml": "# more than ten bytes\n"}))
    assert err.file.endswith("a.toml") and "larger than" in err.message and "together" in err.message
    monkeypatch.setattr(parse, "MAX_TOTAL_BYTES", 1 << 20)
    monkeypatch.setattr(parse, "MAX_DEPLOYMENTS", 3)
    many = "[[deployments]]\nname = 1\n" * 2  # not valid: refused for the count before any is checked
    assert "more than 3 declared" in refusal(sources(tmp_path, ONE, {"a.toml": many})).message


def test_a_declared_file_past_the_toml_bounds_is_refused_at_its_line(tmp_path: Path) -> None:
    deep = '[[deployments]]\nname = "x"\nengine = "command"\ncommand = ["x"]\nmemory_gib = 1\nargs = '
    err = refusal(sources(tmp_path, ONE, {"a.toml": deep + "[" * 40 + "]" * 40 + "\n"}))
    assert err.file.endswith("a.toml") and err.line == 6 and "nested more than 32 deep" in err.message


def test_the_spark_example_and_the_docs_example_are_accepted(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    example = read(Sources(None, root / "examples" / "spark" / "deployments.d"))
    part = (root / "docs" / "configuration.md").read_text().split("## Deployments in files", 1)[1]
    config, models = re.findall(r"```toml\n(.*?)```", part, flags=re.S)[:2]
    folder = tmp_path / "deployments.d"
    folder.mkdir()
    (folder / "spark.toml").write_text(models)
    (tmp_path / "dgxmm.toml").write_text(config.replace("/etc/dgxmm/deployments.d", str(folder)))
    documented = read(Sources.of(load_settings(tmp_path / "dgxmm.toml")))
    for found in (example, documented):
        assert [(d.name, d.fields["engine"], d.fields["mode"].value, d.fields["memory_gib"]) for d in found] == [
            ("gpt-oss-120b", "llamacpp", "on_demand", 66),
            ("qwen3-coder-30b", "llamacpp", "on_demand", 36),
            ("qwen3-8b", "vllm", "on_demand", 24),
            ("embed", "llamacpp", "always_on", 2),
        ]
