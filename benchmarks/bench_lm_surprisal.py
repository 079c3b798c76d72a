"""b_t throughput of a causal LM: workers.lm.surprisal (batched) against a plain transformers
loop, one text at a time, over the same tokens, in one process.

The plain loop is what one would write first: per example ``model(prefix + y[:-1])``, float32
log_softmax, gather. Both score identical inputs (the largest per-token difference is
printed). Printed: load time, tokens/s and process CPU seconds of each, the speed-up, and
the load average (``os.getloadavg``) before and after.

    python -m benchmarks.bench_lm_surprisal --model DIR --gguf-file F.gguf --texts T.parquet
    python -m benchmarks.bench_lm_surprisal --tiny --device cuda   # config-built Llama
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from workers.lm.loading import bos_token_id, load_model, load_tokenizer, offline_transformers
from workers.lm.surprisal import token_surprisal


def plain_loop(model, xs, ys, bos: int) -> list[np.ndarray]:
    """One example per forward pass, no padding: the reference a user would write."""
    import torch

    device = next(model.parameters()).device
    out = []
    with torch.inference_mode():
        for x, y in zip(xs, ys, strict=True):
            prefix = list(x) if len(x) else [bos]
            ids = torch.tensor([prefix + list(y[:-1])], device=device)
            logits = model(input_ids=ids).logits[0, len(prefix) - 1:].float()
            nll = -logits.log_softmax(-1).gather(1, torch.tensor(y, device=device)[:, None])[:, 0]
            out.append(nll.cpu().numpy())
    return out


def tiny_model(device: str):
    """A 4-layer Llama of width 256 and SmolLM2's vocabulary (49,152), random weights."""
    transformers = offline_transformers()
    import torch

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=49152, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, bos_token_id=1, eos_token_id=2)
    folder = Path(tempfile.mkdtemp(prefix="tiny-llama-"))
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return load_model(folder, device=device), None


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, help="a model folder (with --gguf-file: a GGUF in it)")
    parser.add_argument("--gguf-file")
    parser.add_argument("--tiny", action="store_true", help="a config-built Llama (no files)")
    parser.add_argument("--texts", type=Path, help="Parquet with y_text (default: random ids)")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-batch-tokens", type=int, default=2048)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    (model, tokenizer), load_s, _ = timed(
        lambda: tiny_model(args.device) if args.tiny else
        (load_model(args.model, args.gguf_file, device=args.device),
         load_tokenizer(args.model, args.gguf_file)))
    bos = bos_token_id(model, tokenizer) if tokenizer is not None else 1
    rng = np.random.default_rng(0)
    if args.texts is not None and tokenizer is not None:
        import pyarrow.parquet as pq

        texts = pq.read_table(args.texts, columns=["y_text"]).column("y_text").to_pylist()
        ys = [ids for ids in tokenizer(texts, add_special_tokens=False).input_ids
              if 0 < len(ids) <= args.max_tokens][:args.rows]
    else:
        ys = [rng.integers(3, model.config.vocab_size, rng.integers(8, args.max_tokens + 1)).tolist()
              for _ in range(args.rows)]
    xs: list[list[int]] = [[] for _ in ys]
    tokens = sum(map(len, ys))
    plain_loop(model, xs[:2], ys[:2], bos)  # warm-up (allocator, kernels)
    ref, plain_s, plain_cpu = timed(lambda: plain_loop(model, xs, ys, bos))
    got, batch_s, batch_cpu = timed(lambda: token_surprisal(
        model, xs, ys, bos_id=bos, max_batch_tokens=args.max_batch_tokens, progress=False))
    diff = max(float(np.abs(a - b).max()) for a, b in zip(ref, got, strict=True))
    figures = {
        "model": "tiny-llama-4x256" if args.tiny else f"{args.model}/{args.gguf_file or ''}",
        "device": args.device, "rows": len(ys), "tokens": tokens, "load_s": round(load_s, 1),
        "plain_tokens_per_s": round(tokens / plain_s, 1), "plain_cpu_s": round(plain_cpu, 1),
        "batched_tokens_per_s": round(tokens / batch_s, 1), "batched_cpu_s": round(batch_cpu, 1),
        "speedup": round(plain_s / batch_s, 2), "max_abs_diff_nats": diff,
        "loadavg_before": [round(v, 2) for v in load_before],
        "loadavg_after": [round(v, 2) for v in os.getloadavg()],
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
