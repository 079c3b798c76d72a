"""A tiny Llama and word-level tokenizer built from a config (random weights, no download)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from workers.lm.loading import offline_transformers

VOCAB = 48
WORDS = [f"w{i}" for i in range(VOCAB - 4)]


def build_tiny_llama(folder: Path, *, seed: int = 0, bos: bool = True) -> Path:
    """A 2-layer Llama (random weights, safetensors) and a word-level tokenizer, saved."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers

    transformers = offline_transformers()

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3, **{w: i + 4 for i, w in enumerate(WORDS)}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", eos_token="</s>", pad_token="<pad>",
        **({"bos_token": "<s>"} if bos else {}))
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        bos_token_id=1 if bos else None, eos_token_id=2, pad_token_id=3)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


def text_table(rows: int, seed: int = 0) -> pa.Table:
    """Labelled word sequences: the first word tells the class."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, rows)
    ys = [" ".join([WORDS[int(c)], *rng.choice(WORDS[3:], int(rng.integers(2, 9)))]) for c in labels]
    xs = [" ".join(rng.choice(WORDS, int(rng.integers(0, 3)))) for _ in range(rows)]
    return pa.table({"x_text": xs, "y_text": ys, "label": [f"c{c}" for c in labels]})
