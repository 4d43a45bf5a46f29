#!/usr/bin/python3
"""The cost of gradguard's guard in a PyTorch loop, against clip_grad_norm_ alone.

Two copies of the same loop on gradguard's default model (tests/golden/llama_reference.py's
Llama, 4 layers x 128 wide, byte vocabulary; micro 32 x accum 4 x seq 64 = 8192 tokens per
step), the same weights and data, differing only in what happens between backward and
optimizer.step():
  clip   torch.nn.utils.clip_grad_norm_(params, 1.0), then one .item() of the loss for the log
  guard  gradguard.Guard with its defaults and a run directory (metrics.jsonl, TensorBoard
         events, the noise-scale sample every 10 steps): guard.step(), whose one host read
         also brings the loss back; optimizer.step() when applied
Rounds interleave the two (order alternating), each running --steps steps of each
variant, so load from elsewhere on the machine hits both alike; the figure is the ratio
of the median step times, printed side by side with the machine's CPU.

    /usr/bin/python3 bench/python_guard_cost.py [--rounds 8 --steps 4]
(PYTHONPATH=build/python unless setup.sh registered the module.)
"""
import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
# OpenBLAS reads its thread count when torch loads it: the fast split on CPUs is the
# cores in BLAS and one ATen thread (bench/results/2026-12-03-cpu.md).
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(os.cpu_count() or 1))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tests", "golden"))
from llama_reference import LlamaConfig, LlamaForCausalLM  # noqa: E402

import gradguard  # noqa: E402


def cpu_description():
    model, flags = platform.processor() or "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
    except OSError:
        pass
    avx512 = sorted(f for f in flags if f.startswith("avx512"))
    return model, (("avx512: " + " ".join(avx512)) if avx512 else "no avx512")


def load_tokens(path, count):
    if path and os.path.exists(path):
        header = np.fromfile(path, dtype=np.int32, count=256)
        if header[0] == 20240520:
            return np.memmap(path, dtype=np.uint16, mode="r", offset=1024, shape=(int(header[2]),)), path
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=count).astype(np.uint16), "random bytes"


class Variant:
    def __init__(self, name, a, cfg, init, tokens, run_dir):
        self.name, self.a, self.tokens = name, a, tokens
        self.model = LlamaForCausalLM(cfg)
        self.model.load_state_dict(init)
        decay = [p for n, p in self.model.named_parameters() if p.dim() >= 2 and "embed_tokens" not in n]
        no_decay = [p for n, p in self.model.named_parameters() if p.dim() < 2 or "embed_tokens" in n]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                      {"params": no_decay, "weight_decay": 0.0}],
                                     lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
        self.guard = None
        if name == "guard":
            self.guard = gradguard.Guard(self.model, self.opt, run_dir=run_dir, warmup_steps=a.warmup, peak_lr=a.lr,
                                         global_batch=a.micro * a.accum, tokens_per_step=a.micro * a.accum * a.seq)
        self.step_no = 0
        self.times = []
        self.losses = []

    def lr_at(self, step):
        a = self.a
        if step < a.warmup:
            return a.lr * (step + 1) / a.warmup
        t = min(1.0, (step - a.warmup) / max(1, 200 - a.warmup))
        return a.min_lr + 0.5 * (a.lr - a.min_lr) * (1 + math.cos(math.pi * t))

    def batch(self, step, m):
        a = self.a
        samples = (len(self.tokens) - 1) // a.seq
        first = (step * a.accum + m) * a.micro
        rows = [self.tokens[((first + b) % samples) * a.seq:][:a.seq + 1] for b in range(a.micro)]
        return torch.from_numpy(np.stack(rows).astype(np.int64))

    def run_step(self, keep):
        a, step, guard = self.a, self.step_no, self.guard
        batches = [self.batch(step, m) for m in range(a.accum)]  # data outside the timed region
        t0 = time.perf_counter()
        lr = self.lr_at(step) * (guard.lr_factor(step) if guard else 1.0)
        for group in self.opt.param_groups:
            group["lr"] = lr
        self.opt.zero_grad(set_to_none=True)
        scale = guard.loss_scale if guard else 1.0
        total_tokens = a.micro * a.accum * a.seq
        loss_sum, micro = torch.zeros(()), []
        for m, window in enumerate(batches):
            logits = self.model(window[:, :-1])
            summed = F.cross_entropy(logits.reshape(-1, logits.size(-1)), window[:, 1:].reshape(-1), reduction="sum")
            loss = summed / total_tokens
            (loss * scale).backward()
            loss_sum += loss.detach()
            micro.append(summed.detach() / window[:, 1:].numel())
            if guard and m == 0 and a.accum > 1 and guard.noise_due(step):
                guard.sample_noise(share=1.0 / a.accum, micro_batch=a.micro)
        if guard:
            out = guard.step(step, loss_sum, micro, lr=lr, tokens=total_tokens)
            if out.applied:
                self.opt.step()
            value = out.loss
        else:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
            value = float(loss_sum.item())
        dt = time.perf_counter() - t0
        if keep:
            self.times.append(dt)
        self.losses.append(value)
        self.step_no += 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=os.path.join(ROOT, "data", "brown", "train.bin"),
                   help="llm.c token file (default data/brown/train.bin; random bytes when absent)")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps", type=int, default=4, help="steps of each variant per round")
    p.add_argument("--warmup-steps", type=int, default=2, help="untimed steps of each variant first")
    p.add_argument("--micro", type=int, default=32)
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr", type=float, default=3e-4)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--threads", type=int, default=1, help="ATen intra-op threads (BLAS: OPENBLAS_NUM_THREADS)")
    p.add_argument("--json", action="store_true", help="also print the summary as one JSON line")
    a = p.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(1234)
    cfg = LlamaConfig(256, 128, 384, 4, 4, 2, max_position_embeddings=1024, rms_norm_eps=1e-5)
    init_model = LlamaForCausalLM(cfg)
    init_model.init_weights(torch.Generator().manual_seed(1234))
    init = {k: v.clone() for k, v in init_model.state_dict().items()}
    steps_needed = (a.warmup_steps + a.rounds * a.steps) * a.micro * a.accum * (a.seq + 1) + 1
    tokens, source = load_tokens(a.data, steps_needed)
    cpu, avx = cpu_description()

    with tempfile.TemporaryDirectory(prefix="gg-guard-cost-") as tmp:
        variants = {"clip": Variant("clip", a, cfg, init, tokens, None),
                    "guard": Variant("guard", a, cfg, init, tokens, os.path.join(tmp, "run"))}
        for v in variants.values():
            for _ in range(a.warmup_steps):
                v.run_step(keep=False)
        for r in range(a.rounds):
            order = ("clip", "guard") if r % 2 == 0 else ("guard", "clip")
            for name in order:
                for _ in range(a.steps):
                    variants[name].run_step(keep=True)

    med = {k: statistics.median(v.times) for k, v in variants.items()}
    ratio = med["guard"] / med["clip"]
    tokens_per_step = a.micro * a.accum * a.seq
    print("cpu: %s (%s), %d cores; torch %s, %d ATen thread(s), OPENBLAS_NUM_THREADS=%s"
          % (cpu, avx, os.cpu_count() or 0, torch.__version__, torch.get_num_threads(),
             os.environ.get("OPENBLAS_NUM_THREADS")))
    print("model: Llama 4 layers x 128 wide (%d parameters), micro %d x accum %d x seq %d = %d tokens/step; data: %s"
          % (sum(q.numel() for q in variants["clip"].model.parameters()), a.micro, a.accum, a.seq, tokens_per_step,
             source))
    print("%d rounds x %d steps per variant (interleaved), after %d untimed steps each"
          % (a.rounds, a.steps, a.warmup_steps))
    print("| loop | median step s | tokens/s | vs clip_grad_norm_ |")
    print("|---|---:|---:|---:|")
    for name, label in (("clip", "clip_grad_norm_ only"), ("guard", "gradguard.Guard")):
        print("| %s | %.4f | %.0f | %.4f |" % (label, med[name], tokens_per_step / med[name], med[name] / med["clip"]))
    print("guard cost: %+.2f%% of a step (%.1f ms)" % (100 * (ratio - 1), 1000 * (med["guard"] - med["clip"])))
    same = all(abs(x - y) <= 1e-4 * abs(y) for x, y in zip(variants["guard"].losses, variants["clip"].losses))
    print("losses of the two loops agree to 1e-4: %s" % same)
    if a.json:
        print(json.dumps({"cpu": cpu, "avx512": avx, "median_clip_s": med["clip"], "median_guard_s": med["guard"],
                          "ratio": ratio, "rounds": a.rounds, "steps": a.steps}))


if __name__ == "__main__":
    main()
