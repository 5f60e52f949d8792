"""The bounded GGUF header reader (issue 34): it reads what ``gguf.GGUFReader`` reads of a valid
file, and refuses every hostile shape with one line, at once, without allocating what the header
claims."""

from __future__ import annotations

import re
import time
import tracemalloc
from pathlib import Path

import gguf
import numpy as np
import pytest

from dgxmm.cli import main
from dgxmm.demo.tiny_gguf import write_random_gguf, write_tiny_gguf
from dgxmm.deploy import ggufheader
from dgxmm.deploy.estimate import estimate, read_shape
from dgxmm.deploy.ggufheader import NotAModel, read_header
from hostile.ggufs import KEYS, SHAPES, STRING, U32, array, gguf as gguf_bytes, replaced, valid, write_specials

MIB = 1024**2


def write_vocabulary(path: Path, n: int = 5000) -> Path:
    """A GGUF with a tokenizer (tokens, scores, types, merges) and quantised tensors."""
    tokens = [f"tok{i}\u0120{'ab' * (i % 7)}" for i in range(n)]
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_block_count(2)
    w.add_context_length(32768)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(1)
    w.add_rope_freq_base(1e6)
    w.add_token_list(tokens)
    w.add_token_scores([float(-i) for i in range(n)])
    w.add_token_types([1] * n)
    w.add_token_merges([f"{a} {b}" for a, b in zip(tokens, tokens[1:], strict=False)])
    w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    w.add_bool("qwen2.some_flag", True)
    w.add_array("qwen2.some_floats", [0.5, 1.5])
    w.add_tensor("token_embd.weight", np.zeros((16, 34 * 2), dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.ffn.weight", np.zeros((8, 144), dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    w.add_tensor("output_norm.weight", np.ones(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("models")
    return [
        write_tiny_gguf(folder / "tiny.gguf"),
        write_random_gguf(folder / "f16.gguf", n_embd=128, n_layer=3, n_head=8, n_head_kv=8, f16=True),
        write_vocabulary(folder / "vocab.gguf"),
    ]


def test_it_reads_what_ggufs_reader_reads(models: list[Path]) -> None:
    for path in models:
        theirs = gguf.GGUFReader(str(path))
        ours = read_header(path, lambda key: True, keep_bytes=1 << 30)
        fields = {name: f for name, f in theirs.fields.items() if not name.startswith("GGUF.")}
        assert list(ours.types) == list(fields)
        for name, field in fields.items():
            assert ours.types[name] == tuple(field.types[:2]), name
            assert ours.values[name] == field.contents(), name
        assert [(t.name, t.type, list(t.dims), t.n_bytes, ours.data_offset + t.offset) for t in ours.tensors] == [
            (t.name, t.tensor_type, t.shape.tolist(), t.n_bytes, t.data_offset) for t in theirs.tensors
        ]
        assert (ours.version, ours.alignment, ours.data_offset) == (3, theirs.alignment, theirs.data_offset)


def test_it_keeps_only_the_values_asked_for(models: list[Path]) -> None:
    header = read_header(models[2], lambda key: key.startswith("qwen2."))
    assert set(header.values) == {
        "qwen2.block_count",
        "qwen2.context_length",
        "qwen2.embedding_length",
        "qwen2.attention.head_count",
        "qwen2.attention.head_count_kv",
        "qwen2.rope.freq_base",
        "qwen2.some_flag",
        "qwen2.some_floats",
    }
    assert header.types["tokenizer.ggml.tokens"] == (gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING)
    shape = read_shape(models[2])
    assert (shape.architecture, shape.layers, shape.context_length, shape.kv_heads) == ("qwen2", 2, 32768, 1)


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.bounded
def test_every_hostile_shape_is_refused_at_once_in_one_line(name: str, tmp_path: Path) -> None:
    raw, words = SHAPES[name]
    path = tmp_path / "m.gguf"
    path.write_bytes(raw)
    tracemalloc.start()
    began = time.process_time()  # this process's CPU: what a busy machine does not stretch
    try:
        with pytest.raises(NotAModel) as refused:
            estimate(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(refused.value)
    assert words in message and "\n" not in message and message.startswith(str(path)), message
    assert time.process_time() - began < 0.5
    assert peak < 2 * MIB, peak  # one chunk of the file at most, whatever the header claims


@pytest.mark.bounded
def test_a_fifo_a_sparse_file_a_directory_and_a_device_are_refused(tmp_path: Path) -> None:
    for name, (path, words) in write_specials(tmp_path).items():
        began = time.process_time()  # (CPU: a wait on the FIFO or the device would hang the test, not slow it)
        with pytest.raises(NotAModel, match=re.escape(words)):
            estimate(path)
        assert time.process_time() - began < 0.5, name


def test_the_header_is_read_within_its_byte_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(
        gguf_bytes([*KEYS.values(), array("big", STRING, 4096, b"\1\0\0\0\0\0\0\0x" * 4096)], data=1 << 20)
    )
    read_header(path)
    monkeypatch.setattr(ggufheader, "MAX_HEADER_BYTES", 34 * 1024)  # room for 4096 lengths, not their bytes
    with pytest.raises(NotAModel, match="item 3[0-9]{3} of 'big' makes the header larger than 0.033"):
        read_header(path)


@pytest.mark.bounded
def test_a_long_array_is_walked_in_the_window_not_stored(tmp_path: Path) -> None:
    """2,097,151 strings (the limit's worth, far beyond any vocabulary) are walked in well under
    the deadline, with about one chunk of memory."""
    n = ggufheader.MAX_ARRAY_ITEMS - 1
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf_bytes([*KEYS.values(), array("t", STRING, n, (b"\1\0\0\0\0\0\0\0x") * n)]))
    began = time.process_time()  # CPU time; the wall-clock deadline is given room a busy machine needs
    read_header(path, deadline_s=60)
    assert time.process_time() - began < ggufheader.DEADLINE_S / 2  # (0.4 s on an idle core)
    few = tmp_path / "few.gguf"  # 300,000 (a large vocabulary): 2.6 MiB, walked through 3 windows
    few.write_bytes(gguf_bytes([*KEYS.values(), array("t", STRING, 300_000, (b"\1\0\0\0\0\0\0\0x") * 300_000)]))
    tracemalloc.start()  # (which slows the walk down several times)
    try:
        read_header(few, deadline_s=60)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * MIB, peak
    path.write_bytes(gguf_bytes([array("t", STRING, n + 2, (b"\1\0\0\0\0\0\0\0x") * (n + 2))]))
    with pytest.raises(NotAModel, match="more than the 2097152 dgxmm reads"):
        read_header(path)


def test_the_values_kept_and_the_time_are_bounded_too(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf_bytes([kv for kv in KEYS.values()]))
    with pytest.raises(NotAModel, match="larger than the 1024 KiB"):
        read_header(path, lambda key: True, keep_bytes=100)
    with pytest.raises(NotAModel, match="takes longer than"):
        read_header(path, deadline_s=-1)


def test_per_layer_head_counts_take_the_largest(tmp_path: Path) -> None:
    """A hybrid model's KV heads, one per layer, 0 for its recurrent layers."""
    path = tmp_path / "m.gguf"
    kv_heads = array("llama.attention.head_count_kv", U32, 2, b"\0\0\0\0\3\0\0\0")
    path.write_bytes(gguf_bytes(replaced("llama.attention.head_count_kv", kv_heads)))
    assert read_shape(path).kv_heads == 3
    path.write_bytes(valid())
    assert read_shape(path).kv_heads == 2


@pytest.mark.parametrize("name", list(SHAPES))
def test_the_command_says_what_is_wrong_in_one_line_and_exits_2(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw, words = SHAPES[name]
    path = tmp_path / "m.gguf"
    path.write_bytes(raw)
    with pytest.raises(SystemExit) as done:
        main(["estimate", str(path)])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1 and err.startswith("dgxmm estimate: ") and words in err, err
