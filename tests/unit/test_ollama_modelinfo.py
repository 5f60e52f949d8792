"""What ``/api/show`` reads of a model directory (``ollama/modelinfo.py``): config.json put in
the GGUF header's names, the chat template from either of its two files, the vision part, and
files past their bounds or of the wrong shape read as absent, never trusted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dgxmm.demo.tiny_gguf import write_random_gguf
from dgxmm.ollama import modelinfo, views
from dgxmm.records.deployment import Deployment


def dep(model: Path, **fields: Any) -> Deployment:
    return Deployment(id="d", name="d", served_name="qwen", engine="vllm", memory_gib=1, model=str(model), **fields)


def model_dir(tmp_path: Path, config: dict[str, Any], **files: str) -> Path:
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    for name, text in files.items():
        (path / name.replace("__", ".")).write_text(text)
    return path


def test_a_model_directory_says_its_architecture_and_context_as_a_gguf_would(tmp_path: Path) -> None:
    config = {"model_type": "qwen3", "max_position_embeddings": 40960, "hidden_size": 1024, "num_hidden_layers": 28}
    template = "{% if tools %}...{% endif %}<think>"
    path = model_dir(tmp_path, config, tokenizer_config__json=json.dumps({"chat_template": template}))
    shown = views.show(dep(path), modelinfo.read(dep(path)))
    info = shown["model_info"]
    assert info["general.architecture"] == "qwen3" and info["qwen3.context_length"] == 40960
    assert info["qwen3.embedding_length"] == 1024 and info["qwen3.block_count"] == 28
    assert modelinfo.TEMPLATE not in info  # read, not shown
    assert shown["capabilities"] == ["completion", "tools", "thinking"]
    assert shown["details"]["format"] == "safetensors"


def test_a_vision_models_sizes_are_its_text_parts_and_its_template_may_be_a_file(tmp_path: Path) -> None:
    config = {
        "model_type": "gemma3",
        "text_config": {"max_position_embeddings": 131072, "num_attention_heads": 8},
        "vision_config": {"image_size": 896},
    }
    path = model_dir(tmp_path, config, chat_template__jinja="{{ tools }}")
    known = modelinfo.read(dep(path))
    assert known.vision and known.header["gemma3.context_length"] == 131072
    assert known.header["gemma3.attention.head_count"] == 8
    assert views.show(dep(path), known)["capabilities"] == ["completion", "tools", "vision"]


def test_files_past_their_bounds_or_of_another_shape_are_read_as_absent(tmp_path: Path) -> None:
    config = {"model_type": "llama", "max_position_embeddings": True, "num_hidden_layers": -1, "hidden_size": "big"}
    path = model_dir(tmp_path, config, tokenizer_config__json="[1, 2]")
    (path / "chat_template.jinja").write_text("x" * (modelinfo.CONFIG_BYTES + 1) + "tools")
    known = modelinfo.read(dep(path))
    assert known.header == {"general.architecture": "llama"} and not known.vision
    (path / "config.json").write_text("{" * 100_000)  # no JSON (and too deep to be one)
    assert modelinfo.read(dep(path)) == modelinfo.ModelInfo()
    (path / "config.json").write_text(json.dumps({"model_type": "x" * 10, "pad": "y" * modelinfo.CONFIG_BYTES}))
    assert modelinfo.read(dep(path)).header == {}


def test_a_gguf_or_nothing_on_this_host(tmp_path: Path) -> None:
    gguf = write_random_gguf(tmp_path / "tiny.gguf", n_ctx=1024)
    header = modelinfo.read(dep(gguf)).header
    assert header["general.architecture"] == "llama" and header["llama.context_length"] == 1024
    assert modelinfo.read(dep(tmp_path / "absent")) == modelinfo.ModelInfo()
    assert modelinfo.read(dep(Path("org/repo-on-the-hub"))) == modelinfo.ModelInfo()
    (tmp_path / "not.gguf").write_bytes(b"GGUF but not really")
    assert modelinfo.read(dep(tmp_path / "not.gguf")) == modelinfo.ModelInfo()
