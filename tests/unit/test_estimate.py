"""``dgxmm estimate`` (issue 29): what llama-server will hold for a GGUF, from its header and the
deployment's arguments, without starting it. (docs/engines.md has it against real processes.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from dgxmm.cli import main
from dgxmm.demo.tiny_gguf import write_random_gguf
from dgxmm.deploy.estimate import OVERHEAD_BYTES, NotAModel, Options, estimate, read_shape, server_options


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 layers of 256 wide, 8 heads of which 2 for K and V, trained for 1024 tokens, F16."""
    return write_random_gguf(
        tmp_path_factory.mktemp("m") / "m.gguf",
        n_embd=256,
        n_ff=512,
        n_layer=8,
        n_head=8,
        n_head_kv=2,
        n_ctx=1024,
        f16=True,
    )


def test_the_header_gives_the_weights_and_the_attention_shape(model: Path) -> None:
    shape = read_shape(model)
    assert (shape.architecture, shape.layers, shape.context_length) == ("llama", 8, 1024)
    assert (shape.heads, shape.kv_heads, shape.key_length, shape.value_length) == (8, 2, 32, 32)
    # every tensor as stored: F16 matrices (2 bytes), F32 norms (4 bytes)
    assert shape.weights_bytes < model.stat().st_size < shape.weights_bytes + 64 * 1024


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], Options()),
        (["-c", "8192"], Options(context=8192)),
        (["--ctx-size=4096", "-c", "2048"], Options(context=2048)),  # the last one wins
        (["-ctk", "q8_0", "--cache-type-v", "Q4_0"], Options(cache_k="q8_0", cache_v="q4_0")),
        (["-ctk", "nonsense"], Options()),
        (["-fa", "off"], Options(flash_attention=False)),
        (["--flash-attn", "on", "-np", "4"], Options()),
        (["-c"], Options()),
    ],
)
def test_the_server_options_that_count(args: list[str], expected: Options) -> None:
    assert server_options(args) == expected


def test_the_kv_cache_is_layers_by_context_by_width_by_cache_type(model: Path) -> None:
    trained = estimate(model)
    assert trained.context == 1024  # no -c: the model's own
    per_token = 2 * 32 * 2 * 2  # KV heads x head width x (K and V) x f16
    assert trained.kv_bytes == 8 * 1024 * per_token
    bigger = estimate(model, ["-c", "4096", "-ctk", "q8_0", "-ctv", "q8_0"])
    assert bigger.kv_bytes == int(8 * 4096 * 2 * (32 * 34 / 32) * 2)
    assert estimate(model, ["-c", "4096"], ctx=512).context == 512  # --ctx wins
    assert trained.overhead_bytes == OVERHEAD_BYTES
    assert estimate(model, ["-fa", "off"]).overhead_bytes == OVERHEAD_BYTES + 1024 * 512 * 8 * 4
    assert trained.total_bytes == trained.weights_bytes + trained.kv_bytes + trained.overhead_bytes
    assert trained.suggested_gib >= trained.total_gib and trained.suggested_gib - trained.total_gib < 0.1


def test_what_is_not_a_gguf_is_refused(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not a model")
    with pytest.raises(NotAModel, match="not a GGUF"):
        estimate(text)


def test_the_command_prints_it(model: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as done:
        main(["estimate", str(model), "--", "-c", "2048"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "context 2048" in out and "declare memory_gib = 0.1" in out
    with pytest.raises(SystemExit) as done:
        main(["estimate", str(tmp_path / "missing.gguf")])
    assert done.value.code == 2 and "dgxmm estimate:" in capsys.readouterr().err
