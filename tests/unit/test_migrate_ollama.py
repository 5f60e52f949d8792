"""``dgxmm import ollama`` (issue 51 item 2): a store made as Ollama writes one (manifests under
manifests/HOST/NAMESPACE/MODEL/TAG, blobs/sha256-<hex>) becomes llama.cpp deployments serving
the blobs in place (the same inode, nothing copied), with the projector, num_ctx and the sampling
defaults (item 4) carried and the rest reported; a tag whose manifest or blobs are broken, or that names a path instead of a
sha256 digest, is reported and skipped whole; safetensors models are reported."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tomllib
from pathlib import Path
from typing import Any

import pytest
from conftest import make_settings

from dgxmm.cli import main
from dgxmm.declared.commands import check
from dgxmm.demo.tiny_gguf import write_random_gguf
from dgxmm.migrate import ollama

MEDIA = "application/vnd.ollama.image."


def blob(store: Path, data: bytes, kind: str) -> dict[str, Any]:
    """Put ``data`` in the store as Ollama does; its layer as a manifest lists it."""
    digest = hashlib.sha256(data).hexdigest()
    (store / "blobs" / f"sha256-{digest}").write_bytes(data)
    return {"mediaType": MEDIA + kind, "digest": f"sha256:{digest}", "size": len(data)}


def manifest(store: Path, name: str, layers: list[dict[str, Any]], host: str = "registry.ollama.ai") -> None:
    model, tag = name.split(":")
    namespace, model = model.split("/") if "/" in model else ("library", model)
    folder = store / "manifests" / host / namespace / model
    folder.mkdir(parents=True, exist_ok=True)
    config = blob(store, b'{"model_format":"gguf"}', "config")
    body = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json"}
    (folder / tag).write_text(json.dumps(body | {"config": config, "layers": layers}))


@pytest.fixture
def store(tmp_path: Path) -> Path:
    store = tmp_path / "ollama"
    (store / "blobs").mkdir(parents=True)
    gguf = write_random_gguf(tmp_path / "w.gguf", n_embd=64, n_ff=128, n_layer=2, n_head=4, n_head_kv=2, n_ctx=1024)
    weights = blob(store, gguf.read_bytes(), "model")
    proj = write_random_gguf(tmp_path / "p.gguf", n_embd=32, n_ff=64, n_layer=1, n_head=2, n_head_kv=1, n_ctx=64)
    projector = blob(store, proj.read_bytes(), "projector")
    sampling = {"num_ctx": 512, "temperature": 0.7, "stop": ["<|im_end|>"], "num_predict": 64, "num_thread": 4}
    params = blob(store, json.dumps(sampling).encode(), "params")
    template = blob(store, b"{{ .Prompt }}", "template")
    system = blob(store, b"You are terse.", "system")
    manifest(store, "tiny:latest", [weights, projector, params, template, system, blob(store, b"MIT", "license")])
    manifest(store, "tiny:q8", [weights])
    manifest(store, "someone/tiny:1b", [weights])
    manifest(store, "tiny:vllm", [weights], host="example.com")
    missing = dict(weights, digest="sha256:" + "0" * 64)
    manifest(store, "broken:latest", [missing])
    manifest(store, "short:latest", [dict(weights, size=weights["size"] + 1)])
    manifest(store, "text:latest", [blob(store, b"not a model at all", "model")])
    manifest(store, "st:latest", [blob(store, b"\0" * 16, "tensor"), params])
    manifest(store, "escape:latest", [dict(weights, digest="sha256:../../../etc/passwd")])
    manifest(store, "md5:latest", [dict(weights, digest="md5:" + "0" * 32)])
    (store / "manifests" / "registry.ollama.ai" / "library" / "junk").mkdir()
    (store / "manifests" / "registry.ollama.ai" / "library" / "junk" / "latest").write_text("{not json")
    return store


def imported(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(["import", "ollama", *argv])
    out, err = capsys.readouterr()
    return int(exited.value.code or 0), out, err


def test_each_gguf_tag_is_served_from_its_blob_and_the_broken_are_reported(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DGXMM_CONFIG", raising=False)
    out_dir = tmp_path / "deployments.d"
    blobs_before = sorted(os.listdir(store / "blobs"))
    code, out, err = imported(capsys, "--models", str(store), "--out", str(out_dir))
    assert (code, err) == (0, "")
    found = {t["served_name"]: t for t in tomllib.loads((out_dir / "ollama.toml").read_text())["deployments"]}
    assert set(found) == {"tiny:latest", "tiny:q8", "someone/tiny:1b", "example.com/library/tiny:vllm"}
    latest = found["tiny:latest"]
    digest = json.loads((store / "manifests/registry.ollama.ai/library/tiny/latest").read_text())["layers"]
    weights, projector = (store / "blobs" / d["digest"].replace(":", "-") for d in digest[:2])
    assert latest == {
        "name": "tiny-latest",
        "served_name": "tiny:latest",
        "aliases": ["tiny"],
        "engine": "llamacpp",
        "model": str(weights),
        "memory_gib": latest["memory_gib"],
        "mode": "on_demand",
        "args": ["--mmproj", str(projector), "-c", "512"],
        "request_defaults": {"temperature": 0.7, "stop": ["<|im_end|>"], "max_tokens": 64},
    }
    assert os.stat(latest["model"]).st_ino == weights.stat().st_ino  # served in place, never copied
    assert sorted(os.listdir(store / "blobs")) == blobs_before  # nothing added beside them
    assert found["tiny:q8"]["model"] == str(weights) and "aliases" not in found["tiny:q8"]
    assert (found["tiny:q8"]["name"], found["someone/tiny:1b"]["name"]) == ("tiny-q8", "someone-tiny-1b")
    lines = out.splitlines()
    tiny = "\n".join(lines[lines.index("tiny:latest: deployment tiny-latest (llamacpp)") :][:14])
    assert "carried: parameters: num_ctx as -c 512" in tiny
    assert "carried: parameters: temperature = 0.7 as a request default" in tiny
    assert 'carried: parameters: stop = ["<|im_end|>"] as a request default' in tiny
    assert "carried: parameters: num_predict = 64 as a request default" in tiny
    assert "not carried: parameters: num_thread = 4: not a request parameter llama-server reads" in tiny
    assert "not carried: template: a Go template llama-server cannot read; the GGUF's own chat template is used" in tiny
    assert "not carried: system: the default system prompt: dgxmm adds no message to a request" in tiny
    blobs = store / "blobs"
    assert f"broken:latest: not imported: model blob {blobs}/sha256-{'0' * 64}: No such file or directory" in lines
    short = next(line for line in lines if line.startswith("short:latest: not imported: model blob "))
    assert short.endswith("bytes, the manifest says " + str(weights.stat().st_size + 1) + " (truncated?)")
    assert any(
        line.startswith("text:latest: not imported: model blob ") and "not a GGUF file" in line for line in lines
    )
    assert "st:latest: not imported: a safetensors model: llama.cpp serves GGUF only (not imported)" in lines
    assert (
        "escape:latest: not imported: manifest: digest 'sha256:../../../etc/passwd' is not sha256:<64 hex digits>"
    ) in lines
    assert "md5:latest: not imported: manifest: digest 'md5:" + "0" * 32 + "' is not sha256:<64 hex digits>" in lines
    assert "junk:latest: not imported: manifest: not JSON" in lines


def test_the_file_passes_check_config_and_a_second_import_changes_nothing(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DGXMM_CONFIG", raising=False)
    monkeypatch.setenv("OLLAMA_MODELS", str(store))  # the default store
    out_dir = tmp_path / "deployments.d"
    assert imported(capsys, "--out", str(out_dir))[0] == 0
    written = out_dir / "ollama.toml"
    before = (written.read_bytes(), written.stat().st_mtime_ns)
    code, out, _ = imported(capsys, "--out", str(out_dir))
    assert code == 0 and out.splitlines()[-1] == f"{written}: unchanged (4 deployments)"
    assert (written.read_bytes(), written.stat().st_mtime_ns) == before
    said, errors = io.StringIO(), io.StringIO()
    assert (check(make_settings(tmp_path, server={"deployments_dir": out_dir}), said, errors), errors.getvalue()) == (
        0,
        "",
    )


def test_the_default_store_and_a_missing_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "x"))
    assert ollama.default_dir() == tmp_path / "x"
    monkeypatch.delenv("OLLAMA_MODELS")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert ollama.default_dir() == tmp_path / ".ollama" / "models"
    report = ollama.run(tmp_path / "nothing")
    assert (report.models, report.top) == (
        [],
        [f"{tmp_path}/nothing/manifests: not a directory (no Ollama store there)"],
    )


def test_a_huge_manifest_is_refused_unread(store: Path) -> None:
    huge = store / "manifests" / "registry.ollama.ai" / "library" / "huge"
    huge.mkdir()
    (huge / "latest").write_bytes(b" " * (ollama.MAX_MANIFEST_BYTES + 1))
    entry = next(e for e in ollama.run(store).models if e.source_name == "huge:latest")
    assert (entry.fields, entry.skipped) == (None, f"manifest: larger than {ollama.MAX_MANIFEST_BYTES} bytes")


def test_the_walk_stops_at_its_bounds(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ollama, "MAX_MANIFESTS", 3)
    report = ollama.run(store)
    assert len(report.models) == 3 and report.top == ["more than 3 manifests: the rest not read"]
    monkeypatch.setattr(ollama, "MAX_FOLDERS", 2)
    report = ollama.run(store)
    assert report.models == [] and report.top == [f"more than 2 folders under {store / 'manifests'}: the rest not read"]
