"""``dgxmm import llama-swap`` (issue 51 item 1): a config using every field of llama-swap's
format (config.example.yaml at v250) becomes a declared deployments file check-config accepts,
every model carried or explained, the same file again when imported again; hostile files (an
alias bomb, a huge file, macros that grow past their bound) are refused in one clear line."""

from __future__ import annotations

import io
import tomllib
from pathlib import Path
from typing import Any

import pytest
from conftest import make_settings

from dgxmm.cli import main
from dgxmm.declared.commands import check
from dgxmm.demo.tiny_gguf import write_random_gguf
from dgxmm.migrate import swapconfig

CONFIG = """
healthCheckTimeout: 500
logLevel: info
logTimeFormat: ""
logToStdout: proxy
metricsMaxInMemory: 1000
captureBuffer: 15
store: {path: /tmp/activity.sqlite}
ui: {activity: {session_id: [X-Session-ID]}}
performance: {disabled: false, every: 15s}
startPort: 10001
sendLoadingState: true
includeAliasesInList: false
globalTTL: 300
unloadTimeout: 10
macros:
  "server": >
    llama-server --port ${PORT} --host 0.0.0.0
  "default_ctx": 512
  "default_args": "--ctx-size ${default_ctx}"
  "models_dir": "${env.MIGRATE_MODELS}"
apiKeys: ["sk-hunter2", "${env.MIGRATE_KEY}"]
upstream: {ignorePaths: ['.*\\.png$']}
profiles: {coding: {pins: {llm-code: tiny}}}
selectors: {coding-model: {strategy: warm, targets: [tiny]}}
models:
  "tiny":
    macros:
      "default_ctx": 256
    cmd: |
      # ${server} is the macro above; this line is a comment
      ${server}
      -m ${models_dir}/tiny.gguf   \\
      ${default_args}
      -ngl 99 --jinja
    name: "Tiny model"
    description: "a tiny GGUF"
    env: ["CUDA_VISIBLE_DEVICES=0", "LLAMA_ARG_THREADS=2"]
    aliases: ["gpt-4o-mini", "tiny-latest"]
    ttl: 120
    concurrencyLimit: 2
    checkEndpoint: /health
    unloadTimeout: 5
    compat: {ignoreWebsockets: true}
    filters:
      stripParams: "temperature, top_p"
      setParams: {temperature: 0.7}
      setParamsByID: {"${MODEL_ID}:high": {chat_template_kwargs: {reasoning_effort: high}}}
    metadata: {port: "${PORT}", note: "model ${MODEL_ID}"}
    sendLoadingState: false
    timeouts: {connect: 30}
    capabilities: {in: [text], out: [text], tools: true, context: 256}
  "forever":
    cmd: /opt/llama/llama-server-b6000 -m ${models_dir}/tiny.gguf --port ${PORT} -c 128
    ttl: 0
    unlisted: true
  "vl":
    cmd: vllm serve Qwen/Qwen2.5-0.5B-Instruct --port ${PORT} --max-model-len 4096
    useModelName: "Qwen/Qwen2.5-0.5B-Instruct"
    checkEndpoint: none
  "hub":
    cmd: llama-server -hf ggml-org/gemma-3-1b-it-GGUF:Q4_K_M --port ${PORT}
    ttl: 30
  "docker-llama":
    proxy: "http://127.0.0.1:9503"
    cmd: |
      docker run --name ${MODEL_ID} --init --rm -p 9503:8080
      ghcr.io/ggml-org/llama.cpp:server --model '/models/{odd}.gguf'
    cmdStop: docker stop ${MODEL_ID}
  "needs-env":
    cmd: llama-server -m ${env.MIGRATE_UNSET}/m.gguf
hooks:
  on_startup:
    preload: ["tiny"]
groups:
  "all": {swap: true, exclusive: true, members: [tiny, forever]}
routing:
  router:
    use: group
    settings:
      matrix: {vars: {t: tiny}, sets: {standard: "t"}}
peers:
  openrouter: {proxy: "https://openrouter.ai/api", models: [a/b]}
"""


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    models = tmp_path / "models"
    models.mkdir()
    write_random_gguf(models / "tiny.gguf", n_embd=64, n_ff=128, n_layer=2, n_head=4, n_head_kv=2, n_ctx=1024)
    monkeypatch.setenv("MIGRATE_MODELS", str(models))
    monkeypatch.setenv("MIGRATE_KEY", "sk-from-env")
    monkeypatch.delenv("MIGRATE_UNSET", raising=False)
    monkeypatch.delenv("DGXMM_CONFIG", raising=False)
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    return path


def imported(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(["import", "llama-swap", *argv])
    out, err = capsys.readouterr()
    return int(exited.value.code or 0), out, err


def tables(path: Path) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in tomllib.loads(path.read_text())["deployments"]}


def section(out: str, model: str) -> str:
    """The report's lines of one model (its own line and the indented ones under it)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{model}:"))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith("  ")), len(lines))
    return "\n".join(lines[start:end])


def test_every_model_is_carried_or_explained(config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "deployments.d"
    code, out, err = imported(capsys, str(config), "--out", str(out_dir))
    assert (code, err) == (0, "")
    found = tables(out_dir / "llama-swap.toml")
    gguf = str(tmp_path / "models" / "tiny.gguf")
    assert found["tiny"] == {
        "name": "tiny",
        "aliases": ["gpt-4o-mini", "tiny-latest"],
        "engine": "llamacpp",
        "model": gguf,
        "memory_gib": found["tiny"]["memory_gib"],
        "mode": "on_demand",
        "idle_timeout_s": 120.0,
        "preload": True,
        "args": ["--ctx-size", "256", "-ngl", "99", "--jinja"],  # the model's macro over the global one
        "health_path": "/health",
        "max_concurrent": 2,
        "env": {"CUDA_VISIBLE_DEVICES": "0", "LLAMA_ARG_THREADS": "2"},
        "request_overrides": {"temperature": 0.7},  # stripped, then set: set (item 4)
        "strip_params": ["top_p"],
    }
    assert 0 < found["tiny"]["memory_gib"] < 1
    assert "# memory_gib estimated by dgxmm import" in (out_dir / "llama-swap.toml").read_text()
    tiny = section(out, "tiny")
    assert "carried: memory_gib:" in tiny and "estimated from the GGUF (context 256)" in tiny
    assert "carried: concurrencyLimit: max_concurrent = 2 (requests past it wait here, not 429)" in tiny
    assert "carried: hooks.on_startup.preload: preload = true" in tiny
    assert "carried: ${env.*}: the values of MIGRATE_MODELS now, written into the file" in tiny
    assert "not carried: cmd: the program" not in tiny  # (llama-server itself, as dgxmm runs it)
    for key in ("name", "description", "unloadTimeout", "compat", "metadata", "sendLoadingState", "timeouts"):
        assert f"not carried: {key}: " in tiny
    assert "carried: filters.stripParams: strip_params = top_p" in tiny
    assert "carried: filters.setParams: request_overrides = temperature (set whatever the client sent)" in tiny
    assert "not carried: filters.setParamsByID: a request by another name with other parameters" in tiny
    assert "capabilities: dgxmm's /v1/models carries no capabilities" in tiny
    # ttl 0: never stopped for idleness (item 3), make-room's still
    assert found["forever"]["args"] == ["-c", "128"] and found["forever"]["idle_timeout_s"] == 0
    assert "carried: ttl: 0 as idle_timeout_s = 0 (never stopped for idleness" in section(out, "forever")
    assert "unlisted: dgxmm lists every deployment" in section(out, "forever")
    assert "cmd: the program /opt/llama/llama-server-b6000: dgxmm runs [engines] llamacpp_bin" in section(
        out, "forever"
    )
    # vllm serve: the model and its flags; useModelName as the served name, the id an alias
    assert found["vl"]["engine"] == "vllm" and found["vl"]["model"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert found["vl"]["args"] == ["--max-model-len", "4096"] and found["vl"]["idle_timeout_s"] == 300  # globalTTL
    assert (found["vl"]["served_name"], found["vl"]["aliases"]) == ("Qwen/Qwen2.5-0.5B-Instruct", ["vl"])
    assert "checkEndpoint: none" in section(out, "vl") and "a placeholder, set it" in section(out, "vl")
    # -hf: llama-server fetches it itself, so it runs as a command; a ttl under dgxmm's bound raised to it
    hub = found["hub"]
    assert hub["command"] == ["llama-server", "-hf", "ggml-org/gemma-3-1b-it-GGUF:Q4_K_M", "--port", "{port}"]
    assert hub["idle_timeout_s"] == 60 and "ttl: 30 s as idle_timeout_s = 60" in section(out, "hub")
    # a fixed port in cmd and proxy becomes dgxmm's {port}; braces of the command kept literal
    docker = found["docker-llama"]["command"]
    assert docker[docker.index("-p") + 1] == "{port}:8080" and docker[-1] == "/models/{{odd}}.gguf"
    assert "cmdStop: dgxmm stops the process it started" in section(out, "docker-llama")
    assert "needs-env: not imported: ${env.MIGRATE_UNSET}: the environment variable MIGRATE_UNSET is not set" in out
    tops = [line for line in out.splitlines() if line.startswith("top level: ")]
    assert "top level: apiKeys: 2 keys never written out: give callers dgxmm caller keys (docs/gateway.md)" in tops
    assert any(line.startswith("top level: groups: dropped") for line in tops)
    assert any(line.startswith("top level: routing: dropped (groups, matrix") for line in tops)
    written = set(CONFIG.split("\nmodels:")[0].split("\n")) | {"hooks:", "groups:", "routing:", "peers:"}
    keys = {line.split(":")[0] for line in written if line and not line.startswith(" ")}
    assert {line.split(":")[1].strip() for line in tops} == keys
    assert "sk-hunter2" not in (out_dir / "llama-swap.toml").read_text() and "sk-from-env" not in out


def test_the_file_passes_check_config_and_a_second_import_changes_nothing(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "deployments.d"
    assert imported(capsys, str(config), "--out", str(out_dir))[0] == 0
    written = out_dir / "llama-swap.toml"
    before = (written.read_bytes(), written.stat().st_mtime_ns, written.stat().st_ino)
    code, out, _ = imported(capsys, str(config), "--out", str(out_dir))
    assert code == 0 and out.splitlines()[-1] == f"{written}: unchanged (5 deployments)"
    assert (written.read_bytes(), written.stat().st_mtime_ns, written.stat().st_ino) == before
    settings = make_settings(tmp_path, server={"deployments_dir": out_dir})
    said, errors = io.StringIO(), io.StringIO()
    assert (check(settings, said, errors), errors.getvalue()) == (0, "")
    assert said.getvalue().startswith("config ok\n")


def test_a_dry_run_writes_nothing(config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = imported(capsys, str(config), "--out", str(tmp_path / "d"), "--dry-run")
    assert code == 0 and out.splitlines()[-1].endswith("would hold 5 deployments; nothing written")
    assert not (tmp_path / "d").exists()


def test_an_alias_bomb_is_refused_before_anything_walks_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    levels = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for n in range(1, 10):
        levels.append(f"{'abcdefghij'[n]}: &{'abcdefghij'[n]} [" + ", ".join([f"*{'abcdefghij'[n - 1]}"] * 9) + "]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(levels) + "\nmodels: {m: {cmd: *j}}\n")
    code, out, err = imported(capsys, str(bomb), "--out", str(tmp_path / "d"))
    assert (code, out) == (2, "")
    assert err == f"dgxmm import: {bomb}: more than 200000 values once its aliases are followed (an alias bomb?)\n"


def test_a_huge_file_is_refused_unread(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    huge = tmp_path / "huge.yaml"
    huge.write_text("models:\n" + "#" * swapconfig.MAX_BYTES)
    assert imported(capsys, str(huge), "--out", str(tmp_path / "d"))[1:] == (
        "",
        f"dgxmm import: {huge}: larger than {swapconfig.MAX_BYTES} bytes\n",
    )


BIG = "x" * 60_000
MANY_MODELS = "models:\n" + "".join(f"  m{n}: {{cmd: x}}\n" for n in range(1001))
MANY_MACROS = "macros:\n" + "".join(f"  a{n}: x\n" for n in range(1025)) + "models: {m: {cmd: x}}"
EXPANDED = f"macros: {{b: {BIG}}}\nmodels:\n" + "".join(f"  m{n}: {{cmd: '${{b}}'}}\n" for n in range(40))


@pytest.mark.parametrize(
    ("text", "code", "why"),
    [
        ("models: [1, 2]", 2, "no models"),
        (MANY_MODELS, 2, "more than 1000 models"),
        (MANY_MACROS, 2, "macros: more than 1024 macros"),
        ("macros: {PORT: 1}\nmodels: {m: {cmd: x}}", 2, "'PORT' is not a macro name llama-swap accepts"),
        ("[" * 5000 + "]" * 5000, 2, "nested too deep (more than 64 levels)"),
        ("a: " + "[" * 65 + "]" * 65, 2, "nested too deep (more than 64 levels)"),
        # one model's problem: that model is skipped, with the reason
        (
            "macros: {b: '" + "x" * 9000 + "', a: '${b}${b}${b}${b}${b}${b}${b}${b}'}\nmodels: {m: {cmd: '${a}'}}",
            0,
            "m: not imported: a value longer than 65536 characters once macros are expanded",
        ),
        (
            EXPANDED,
            0,
            "m17: not imported: the file would pass 1048576 bytes with it\n"
            "m34: not imported: the values are longer than 2097152 characters together once expanded",
        ),
        ("models: {m: {cmd: 'llama-server -m ${nope}'}}", 0, "m: not imported: ${nope} is not a macro defined before"),
        ("models: {m: {cmd: 'a \"b'}}", 0, "m: not imported: cmd: No closing quotation"),
        ("models: {m: {cmd: x, filters: {stripParams: [a]}}}", 0, "m: not imported: filters.stripParams: must be"),
        ("models: {m: {cmd: x, filters: {setParams: [a]}}}", 0, "m: not imported: filters.setParams: must be"),
        (
            "models: {m: {cmd: x, filters: {setParams: {a: .nan}}}}",
            0,
            "m: not imported: filters: request_overrides: a: not a finite number",
        ),
    ],
)
def test_bad_configs_are_refused_or_their_model_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, code: int, why: str
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    exit_code, out, err = imported(capsys, str(path), "--out", str(tmp_path / "d"), "--dry-run")
    assert exit_code == code
    if code == 2:
        assert out == "" and err.startswith("dgxmm import: ") and err.rstrip().endswith(why)
    else:
        for line in why.splitlines():
            assert any(said.startswith(line) for said in out.splitlines())


def test_macros_in_macros_and_the_environment_first() -> None:
    expander = swapconfig.Expander("m-1", {"a": "${env.X}/a", "b": "${a}/b ${MODEL_ID}"}, {"X": "/x"})
    assert expander.text("${b} --port ${PORT}") == "/x/a/b m-1 --port ${PORT}"
    assert swapconfig.split_command("# c ${x}\n  prog \\\n  --flag 'a b' # not a comment\n") == [
        "prog",
        "--flag",
        "a b",
        "#",
        "not",
        "a",
        "comment",
    ]


def test_a_model_check_config_would_refuse_is_skipped_and_the_others_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "models:\n"
        "  a: {cmd: 'srv --port ${PORT}', aliases: [shared]}\n"
        "  b: {cmd: 'srv --port ${PORT}', aliases: [shared]}\n"
        "  c: {cmd: 'srv --port ${PORT}', env: ['1BAD=x']}\n"
        "  d: {cmd: 'srv --port ${PORT}', concurrencyLimit: 99999999}\n"
    )
    code, out, _ = imported(capsys, str(config), "--out", str(tmp_path / "d"))
    assert code == 0 and list(tables(tmp_path / "d" / "llama-swap.toml")) == ["a"]
    assert "b: not imported: a name of it is a's already (names are unique on a host)" in out
    assert "c: not imported: check-config would refuse env: '1BAD' is not a variable name" in out
    assert "d: not imported: check-config would refuse max_concurrent: " in out


def test_filters_become_the_request_parameters_and_ttl_0_never_idle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``model`` is never stripped and ``stream`` never set (the gateway's to read); a name both
    stripped and set is set; a model without ``ttl`` under no ``globalTTL`` is never unloaded
    there (llama-swap's default), so never reaped here."""
    config = tmp_path / "c.yaml"
    config.write_text(
        "models:\n"
        "  m:\n"
        "    cmd: 'srv --port ${PORT}'\n"
        "    filters: {stripParams: 'model, seed , top_k,seed', setParams: {top_k: 20, stream: true, n: null}}\n"
    )
    code, out, _ = imported(capsys, str(config), "--out", str(tmp_path / "d"))
    found = tables(tmp_path / "d" / "llama-swap.toml")["m"]
    assert code == 0 and (found["strip_params"], found["request_overrides"]) == (["seed"], {"top_k": 20})
    assert found["idle_timeout_s"] == 0
    said = section(out, "m")
    assert "not carried: filters.setParams: stream: the gateway's to read, not a parameter" in said
    assert "not carried: filters.setParams: n: null (strip_params removes a parameter)" in said
    assert "carried: globalTTL: 0 (llama-swap's default) as idle_timeout_s = 0" in said
