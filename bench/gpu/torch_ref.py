#!/usr/bin/env python3
"""PyTorch's own training step on the model bench/gpu_step.cpp times, for a side by side.

The same Llama (gg_llama.build_model: HF Llama computing as gradguard does, attention
through F.scaled_dot_product_attention), the same shapes and the same work per step as
gpu_step's "guarded"/"bare" variants as far as a careful engineer would write it:
token-mean loss over `accum` micro-batches under autocast, clip_grad_norm_(1.0), fused
AdamW (decay on matrices only), zero_grad(set_to_none=True), and one loss.item() per step
for the log line. Random tokens made on the device, four step-sized sets cycled.

--impl eager     the model as is
--impl compile   torch.compile(model) (default mode); its compile time is reported apart
                 (compile_s: the warm-up steps' wall time) and excluded from throughput.

Timing: after the warm-up, `steps` steps between two torch.cuda.synchronize() calls
(wall time -> tokens/s), and per-step CUDA events (median step_ms). MFU uses
gg_llama.mfu: tokens/s x (6 N + 12 L d T) / peak, peak 989 TFLOP/s (H100/H200 SXM dense
BF16) unless --peak-tflops. Prints one JSON object.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gg_llama as gg  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--impl", choices=["eager", "compile"], default="eager")
    p.add_argument("--device", default="cuda")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--kv-heads", type=int, default=12)
    p.add_argument("--intermediate", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--micro", type=int, default=16)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--peak-tflops", type=float, default=989.0)
    a = p.parse_args()
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        print("torch_ref.py: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2

    if a.impl == "compile" and not hasattr(torch, "compile"):
        print("torch_ref.py: torch %s has no torch.compile (2.0+)" % torch.__version__, file=sys.stderr)
        return 2

    torch.manual_seed(0)
    cfg = gg.LlamaConfig(a.vocab, a.hidden, a.intermediate, a.layers, a.heads, a.kv_heads,
                         max_position_embeddings=max(1024, a.seq), rms_norm_eps=1e-5)
    model = gg.build_model(cfg)
    gg.init_like_gradguard(model, a.layers)
    model = model.to(device).train()
    n_params = sum(q.numel() for q in model.parameters())
    opt = torch.optim.AdamW(gg.param_groups(model, 0.1), lr=1e-4, betas=(0.9, 0.95), eps=1e-8,
                            **({"fused": True} if cuda and gg.TORCH_VERSION >= (2, 0) else {}))
    fwd = torch.compile(model) if a.impl == "compile" else model
    total = a.micro * a.accum * a.seq
    sets = [[torch.randint(0, a.vocab, (a.micro, a.seq + 1), device=device) for _ in range(a.accum)]
            for _ in range(4)]
    amp_dtype = torch.bfloat16 if a.dtype == "bf16" else None
    losses = []

    def step(i):
        opt.zero_grad(set_to_none=True)
        acc = None
        for w in sets[i % 4]:
            inputs, targets = w[:, :-1], w[:, 1:]
            with torch.autocast(device_type=device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                logits = fwd(inputs)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, a.vocab).float(), targets.reshape(-1),
                                                     reduction="sum") / total
            loss.backward()
            acc = loss.detach() if acc is None else acc + loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(acc.item())  # the log line's host read

    def sync():
        if cuda:
            torch.cuda.synchronize()

    t0 = time.time()
    for i in range(a.warmup):
        step(i)
        print("torch_ref %s: warm-up step %d/%d done at %.1f s" % (a.impl, i + 1, a.warmup, time.time() - t0),
              file=sys.stderr, flush=True)
    sync()
    warmup_s = time.time() - t0
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    events = []
    sync()
    t0 = time.time()
    for i in range(a.steps):
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
        step(a.warmup + i)
        if cuda:
            e1.record()
            events.append((e0, e1))
    sync()
    wall = time.time() - t0
    step_ms = [e0.elapsed_time(e1) for e0, e1 in events] if cuda else [1e3 * wall / a.steps]
    tps = a.steps * total / wall
    out = {
        "bench": "torch_ref", "impl": a.impl, "torch": torch.__version__, "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
        "model": {"layers": a.layers, "hidden": a.hidden, "heads": a.heads, "kv_heads": a.kv_heads,
                  "intermediate": a.intermediate, "vocab": a.vocab, "parameters": n_params},
        "batch": {"seq": a.seq, "micro": a.micro, "accum": a.accum, "tokens_per_step": total},
        "dtype": a.dtype, "steps": a.steps, "warmup_steps": a.warmup,
        ("compile_s" if a.impl == "compile" else "warmup_s"): round(warmup_s, 2),
        "step_ms_median": statistics.median(step_ms), "wall_ms_per_step": 1e3 * wall / a.steps,
        "tokens_per_s": tps, "mfu": gg.mfu(tps, n_params, a.layers, a.hidden, a.seq, a.peak_tflops),
        "peak_tflops": a.peak_tflops, "final_loss": losses[-1],
        "peak_allocated_mib": torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None,
        "host_syncs_per_step": "1 by construction (loss.item())",
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
