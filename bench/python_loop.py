#!/usr/bin/python3
"""The plain PyTorch training loop gradguard's throughput is compared with.

What a careful engineer would write in Python for the same job as `gradguard train`
with its defaults: the same Llama (tests/golden/llama_reference.py, the model the C++
one is checked against), byte-level token files in llm.c's format, micro-batches with
gradient accumulation, AdamW with weight decay on matrices only, clip_grad_norm_,
linear warmup then cosine decay to a floor, and one .item() per step for the log.
No guard, no metrics file, no telemetry. Its best settings are options: torch's thread count
(the driver, bench/train_compare.py, runs it both ways: OpenBLAS's pool with the threads
and torch at 1, and torch with the threads and OPENBLAS_NUM_THREADS=1) and the foreach
AdamW implementation.

Prints one JSON object per step {"step", "step_s", "loss", "tokens"} and a final
{"done": true, "peak_rss_mb": ...}.
"""
import argparse
import json
import math
import os
import resource
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden"))
from llama_reference import LlamaConfig, LlamaForCausalLM  # noqa: E402


def load_tokens(path):
    header = np.fromfile(path, dtype=np.int32, count=256)
    if header[0] != 20240520:
        sys.exit("python_loop.py: %s is not an llm.c token file (magic %d)" % (path, header[0]))
    return np.memmap(path, dtype=np.uint16, mode="r", offset=256 * 4, shape=(int(header[2]),))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--intermediate", type=int, default=384)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--micro", type=int, default=32)
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr", type=float, default=3e-4)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--total-steps", type=int, default=200, help="schedule length (steps run: --steps)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--foreach", action="store_true")
    p.add_argument("--seed", type=int, default=1234)
    a = p.parse_args()

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    cfg = LlamaConfig(256, a.hidden, a.intermediate, a.layers, a.heads, a.kv_heads,
                      max_position_embeddings=max(1024, a.seq), rms_norm_eps=1e-5)
    model = LlamaForCausalLM(cfg)
    model.init_weights(torch.Generator().manual_seed(a.seed))
    decay = [q for n, q in model.named_parameters() if q.dim() >= 2 and "embed_tokens" not in n]
    no_decay = [q for n, q in model.named_parameters() if q.dim() < 2 or "embed_tokens" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, foreach=a.foreach or None)

    def lr_at(step):
        if step < a.warmup:
            return a.lr * (step + 1) / a.warmup
        t = min(1.0, (step - a.warmup) / max(1, a.total_steps - a.warmup))
        return a.min_lr + 0.5 * (a.lr - a.min_lr) * (1 + math.cos(math.pi * t))

    tokens = load_tokens(a.data)
    rng = np.random.default_rng(a.seed)
    span = a.seq + 1
    for step in range(a.steps):
        t0 = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for _ in range(a.accum):
            starts = rng.integers(0, len(tokens) - span, size=a.micro)
            batch = torch.from_numpy(np.stack([tokens[s:s + span] for s in starts]).astype(np.int64))
            logits = model(batch[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1)) / a.accum
            loss.backward()
            total = total + loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        value = float(total.item())
        dt = time.perf_counter() - t0
        print(json.dumps({"step": step, "step_s": dt, "loss": value, "tokens": a.micro * a.accum * a.seq}), flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps({"done": True, "peak_rss_mb": peak}), flush=True)


if __name__ == "__main__":
    main()
