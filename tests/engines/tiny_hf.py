"""A tiny random Llama model in Hugging Face format (a few MB) that vLLM can serve on a CPU.

No model hub: the weights are random (seeded) and saved with transformers, the tokenizer is a
byte-level BPE trained here on a few sentences with the ``tokenizers`` library, and a ChatML
template makes /v1/chat/completions work. The output is junk text; the point is a real vLLM with
real endpoints, metrics and memory accounting.

Run it with a Python that has torch and transformers (the vLLM venv, not the project's):
``python tests/engines/tiny_hf.py OUT_DIR``. Kept free of project imports.
"""

from __future__ import annotations

import json
import pathlib
import sys

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "hello world, this is a tiny model that says nothing useful at all.",
    "the quick brown fox jumps over the lazy dog again and again.",
    "you asked a question and I answer it with random words, ok?",
] * 20
VOCAB = 512
SEED = 1234


def write_tiny_hf(out: pathlib.Path) -> pathlib.Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    raw = Tokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    raw.train_from_iterator(CORPUS, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="<|im_end|>",
        pad_token="</s>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        dtype="float32",
    )
    LlamaForCausalLM(config).save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": tokenizer.eos_token_id}))
    return out


if __name__ == "__main__":
    print(write_tiny_hf(pathlib.Path(sys.argv[1])))
