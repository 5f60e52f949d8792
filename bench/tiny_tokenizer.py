"""A Hugging Face tokenizer made from the tiny test model's vocabulary (``dgxmm.demo.tiny_gguf``),
for the benchmark tools that need one to build prompts of a given length and count tokens
(guidellm, aiperf): with it they run against the tiny model without downloading anything.

Written as plain JSON (``tokenizer.json`` in the ``tokenizers`` format, a ``tokenizer_config.json``
naming ``PreTrainedTokenizerFast``), so the project needs neither ``tokenizers`` nor
``transformers``; the tools' own venv loads it with ``AutoTokenizer.from_pretrained(dir)``.

The model is a Unigram over the GGUF's pieces and scores with byte fallback, as SentencePiece
reads them; llama.cpp merges the same pieces by score, so counts match llama-server's on the
words the vocabulary has and may differ by a token or two elsewhere: close enough to size
prompts, and the tools take the answer's counts from the server's ``usage``.

    .venv/bin/python bench/tiny_tokenizer.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import gguf

from dgxmm.demo.tiny_gguf import CHAT_TEMPLATE, N_CTX, _vocab

SPACE = "\u2581"  # SentencePiece's leading-space mark


def tokenizer_json() -> dict[str, Any]:
    tokens, scores, types = _vocab()
    special = {int(gguf.TokenType.CONTROL), int(gguf.TokenType.UNKNOWN)}
    added = [
        {
            "id": i,
            "content": tok,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, (tok, kind) in enumerate(zip(tokens, types, strict=True))
        if kind in special
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {
            "type": "Sequence",
            "normalizers": [
                {"type": "Prepend", "prepend": SPACE},
                {"type": "Replace", "pattern": {"String": " "}, "content": SPACE},
            ],
        },
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0},
            ],
        },
        "model": {
            "type": "Unigram",
            "unk_id": 0,
            "byte_fallback": True,
            "vocab": [[tok, score] for tok, score in zip(tokens, scores, strict=True)],
        },
    }


def write_tiny_tokenizer(out: Path) -> Path:
    """The tokenizer's directory, ``out``, written (idempotent)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(tokenizer_json(), ensure_ascii=False))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "model_max_length": N_CTX,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


if __name__ == "__main__":
    print(write_tiny_tokenizer(Path(sys.argv[1])))
