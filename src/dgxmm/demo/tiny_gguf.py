"""A tiny llama GGUF with random weights (~0.5 MB) that llama-server can load and chat with.

Its output is junk text: it exists so that ``make demo`` and the tests run a real engine process
with real endpoints (health, models, chat streaming, metrics) that starts in well under a second,
without downloading a model. Deterministic: the same bytes on every run.

Written with ``gguf`` (llama.cpp's Python package). Usage: python -m dgxmm.demo.tiny_gguf OUT.gguf
"""

from __future__ import annotations

import pathlib
import sys

import gguf
import numpy as np

N_EMBD = 64
N_FF = 128
N_LAYER = 2
N_HEAD = 4
N_HEAD_KV = 2
N_CTX = 2048
SEED = 1234

# ChatML: the tokens are in the vocab as CONTROL so they tokenize as one piece
# and llama.cpp recognises <|im_end|> as an end-of-generation token.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# SentencePiece-style pieces ("\u2581" marks a leading space); anything else
# falls back to the byte tokens.
_WORDS = ["the", "a", "is", "of", "and", "to", "in", "hello", "world", "hi", "you", "I", "it", "ok"]


def _vocab() -> tuple[list[str], list[float], list[int]]:
    T = gguf.TokenType
    tokens = ["<unk>", "<s>", "</s>"]
    types = [T.UNKNOWN, T.CONTROL, T.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [T.BYTE] * 256
    # SPM only merges adjacent pieces into pieces that exist, so every prefix is
    # needed for a whole word ("\u2581h", "\u2581he", ... "\u2581hello") to be reachable.
    prefixes = ["\u2581" + w[:k] for w in _WORDS for k in range(1, len(w) + 1)]
    pieces = list(dict.fromkeys(["\u2581", *prefixes, *"abcdefghijklmnopqrstuvwxyz"]))
    tokens += pieces
    types += [T.NORMAL] * len(pieces)
    tokens += ["<|im_start|>", "<|im_end|>"]
    types += [T.CONTROL, T.CONTROL]
    # SPM merges by score: higher wins, so earlier (more "frequent") pieces score higher.
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))] + [0.0, 0.0]
    return tokens, scores, [int(t) for t in types]


def write_tiny_gguf(path: pathlib.Path) -> pathlib.Path:
    return write_random_gguf(path)


def write_random_gguf(
    path: pathlib.Path,
    *,
    n_embd: int = N_EMBD,
    n_ff: int = N_FF,
    n_layer: int = N_LAYER,
    n_head: int = N_HEAD,
    n_head_kv: int = N_HEAD_KV,
    n_ctx: int = N_CTX,
    f16: bool = False,
    name: str = "dgxmm-tiny-llama",
) -> pathlib.Path:
    """A llama GGUF with random weights of any shape (the tiny one by default; larger ones for
    measuring what llama-server holds against ``dgxmm estimate``); ``f16``: weights in F16."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokens, scores, types = _vocab()
    n_vocab = len(tokens)
    rng = np.random.default_rng(SEED)
    head_dim = n_embd // n_head

    def rand(*shape: int) -> np.ndarray:
        # numpy shape is ggml's ne reversed: (rows=out, cols=in).
        return (rng.standard_normal(shape) * 0.02).astype(np.float16 if f16 else np.float32)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_block_count(n_layer)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)

    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    w.add_tensor("token_embd.weight", rand(n_vocab, n_embd))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("output.weight", rand(n_vocab, n_embd))
    for i in range(n_layer):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(b + "attn_q.weight", rand(n_head * head_dim, n_embd))
        w.add_tensor(b + "attn_k.weight", rand(n_head_kv * head_dim, n_embd))
        w.add_tensor(b + "attn_v.weight", rand(n_head_kv * head_dim, n_embd))
        w.add_tensor(b + "attn_output.weight", rand(n_embd, n_head * head_dim))
        w.add_tensor(b + "ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(b + "ffn_gate.weight", rand(n_ff, n_embd))
        w.add_tensor(b + "ffn_up.weight", rand(n_ff, n_embd))
        w.add_tensor(b + "ffn_down.weight", rand(n_embd, n_ff))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m dgxmm.demo.tiny_gguf OUT.gguf")
    print(write_tiny_gguf(pathlib.Path(sys.argv[1])))
