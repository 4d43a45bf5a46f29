#!/usr/bin/env python3
"""One training step of `gradguard train` against PyTorch on the same weights and batch.

For each precision mode (fp32, bf16 autocast, fp16 autocast with dynamic loss scaling):

1. Python makes a Llama (gg_llama.build_model: tests/golden/llama_reference.py computing
   as gradguard does), initialises it with gradguard's scheme from a seed, and writes it
   as a Hugging Face directory (config.json + model.safetensors) next to an llm.c token
   file of random tokens.
2. `gradguard train` runs ONE optimizer step from those weights (model.init_from) on that
   file (data.shuffle false: micro-batch m, row b reads tokens[k*T : k*T+T+1] with
   k = m*micro + b), accumulating `accum` micro-batches; its metrics.jsonl gives the loss
   and the gradient norm, its final checkpoint the updated weights.
3. Python runs the same step: token-mean loss over the global batch, autocast, for fp16
   GradScaler(init_scale) with unscale_, clip_grad_norm_(1.0), AdamW (decay 0.1 on
   matrices only, betas 0.9/0.95, eps 1e-8; fused on CUDA), lr = optim.lr at step 0
   (no warmup).
4. Compared: the loss and the global gradient norm (relative difference), and the
   update of every tensor: rel = ||dW_gg - dW_py|| / ||dW_py|| over all tensors, and the
   share of elements whose update has the same sign. Adam's first step is about
   lr * sign(g), so elements with near-zero gradients can flip sign between two correct
   implementations under bf16/fp16; the tolerances allow for that.

Tolerances (per mode: loss rel, grad-norm rel, update rel, sign agreement):
  fp32  1e-5, 1e-4, 2e-2, 0.995
  bf16  1e-2, 3e-2, 0.25, 0.97
  fp16  5e-3, 2e-2, 0.20, 0.98
They are first estimates, set before any GPU run; the numbers measured are always
reported beside them.

Writes parity.json (and prints one line per mode); exits 1 if a mode fails its
tolerance, 2 on a setup error. Runs on the CPU too (fp32 and bf16), which is how it is
tested on machines without a GPU.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gg_llama as gg  # noqa: E402

TOLERANCES = {
    "fp32": {"loss": 1e-5, "grad_norm": 1e-4, "update": 2e-2, "sign": 0.995},
    "bf16": {"loss": 1e-2, "grad_norm": 3e-2, "update": 0.25, "sign": 0.97},
    "fp16": {"loss": 5e-3, "grad_norm": 2e-2, "update": 0.20, "sign": 0.98},
}


def run_gradguard(args, mode, hf_dir, token_file, run_dir):
    overrides = {
        "run.device": args.device, "run.dir": run_dir, "run.name": mode, "run.overwrite": "true", "run.seed": "7",
        "model.init_from": hf_dir, "data.train_path": token_file, "data.val_path": "", "data.seq_len": args.seq,
        "data.shuffle": "false", "batch.micro_batch": args.micro, "batch.accum_steps": args.accum,
        "optim.lr": args.lr, "schedule.warmup_steps": 0, "schedule.total_steps": 1, "schedule.min_lr": args.lr,
        "amp.dtype": mode, "amp.scaler.init_scale": args.init_scale, "clip.strategy": "global", "clip.max_norm": 1.0,
        "checkpoint.every": 0, "log.progress": "quiet", "log.report": "false", "log.tensorboard": "false",
        "telemetry.enabled": "false",
    }
    cmd = [args.gradguard, "train"]
    for k, v in overrides.items():
        cmd += ["--set", "%s=%s" % (k, v)]
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        raise RuntimeError("gradguard train (%s) exited %d:\n%s\ncommand: %s" % (mode, p.returncode, p.stdout[-4000:],
                                                                               " ".join(cmd)))
    steps = [json.loads(line) for line in open(os.path.join(run_dir, mode, "metrics.jsonl"))]
    steps = [s for s in steps if s.get("step") == 0 and "loss" in s and "grad_norm" in s]
    if not steps:
        raise RuntimeError("no step-0 metrics line in %s/%s/metrics.jsonl" % (run_dir, mode))
    ckpt = os.path.join(run_dir, mode, "checkpoints", "step-0000001", "model.safetensors")
    return steps[0], gg.load_safetensors(ckpt), time.time() - t0, cmd


def run_torch(args, mode, cfg, init_weights, tokens, device):
    model = gg.build_model(cfg).to(device)
    model.load_state_dict({k: v.to(device) for k, v in init_weights.items()})
    model.train()
    fused = device.type == "cuda" and gg.TORCH_VERSION >= (2, 0)
    opt = torch.optim.AdamW(gg.param_groups(model, 0.1), lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            **({"fused": True} if fused else {}))
    scaler = gg.grad_scaler(args.init_scale) if mode == "fp16" else None
    T, B, A = args.seq, args.micro, args.accum
    total = A * B * T
    loss_sum = 0.0
    for m in range(A):
        rows = [tokens[(m * B + b) * T:(m * B + b) * T + T + 1] for b in range(B)]
        window = torch.tensor(rows, dtype=torch.long, device=device)
        inputs, targets = window[:, :T].contiguous(), window[:, 1:].contiguous()
        if mode == "fp32":
            loss = gg.token_mean_loss(model, inputs, targets, total)
        else:
            dtype = torch.bfloat16 if mode == "bf16" else torch.float16
            with torch.autocast(device_type=device.type, dtype=dtype):
                logits = model(inputs)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                                     targets.reshape(-1), reduction="sum") / total
        loss_sum += loss.item()
        (scaler.scale(loss) if scaler else loss).backward()
    if scaler:
        scaler.unscale_(opt)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
    if scaler:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    return loss_sum, grad_norm, {k: v.detach().float().cpu() for k, v in model.state_dict().items()}, fused


def compare(init, gg_w, py_w):
    num = den = 0.0
    agree = total = 0
    worst = ("", 0.0)
    for name, w0 in init.items():
        d_gg = gg_w[name].float() - w0
        d_py = py_w[name] - w0
        diff = (d_gg - d_py).double().pow(2).sum().item()
        ref = d_py.double().pow(2).sum().item()
        num += diff
        den += ref
        agree += (torch.sign(d_gg) == torch.sign(d_py)).sum().item()
        total += d_py.numel()
        rel = math.sqrt(diff / ref) if ref > 0 else (0.0 if diff == 0 else float("inf"))
        if rel > worst[1]:
            worst = (name, rel)
    return math.sqrt(num / den) if den > 0 else 0.0, agree / max(total, 1), worst


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gradguard", default=os.path.join(here, "..", "..", "build", "gradguard"))
    p.add_argument("--device", default="cuda")
    p.add_argument("--modes", default="fp32,bf16,fp16")
    p.add_argument("--work", default="/tmp/gradguard-parity")
    p.add_argument("--out", default="", help="where to write parity.json (default: --work)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--intermediate", type=int, default=688)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--micro", type=int, default=8)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--init-scale", type=float, default=1024.0)
    p.add_argument("--seed", type=int, default=1234)
    a = p.parse_args()
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("parity.py: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    if not os.path.exists(a.gradguard):
        print("parity.py: gradguard binary %s not found" % a.gradguard, file=sys.stderr)
        return 2
    modes = [m for m in a.modes.split(",") if m]
    if device.type == "cuda":  # as LibTorch's default: exact fp32 matmuls on both sides
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    cfg = gg.LlamaConfig(256, a.hidden, a.intermediate, a.layers, a.heads, a.kv_heads,
                         max_position_embeddings=max(1024, a.seq), rms_norm_eps=1e-5, rope_theta=10000.0)
    torch.manual_seed(a.seed)
    model = gg.build_model(cfg)
    gg.init_like_gradguard(model, a.layers, seed=a.seed)
    hf_dir = os.path.join(a.work, "init")
    gg.write_hf_dir(hf_dir, cfg, model)
    init = {k: v.detach().float().clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(a.seed + 1)
    n_tokens = a.accum * a.micro * a.seq + 1 + a.seq
    tokens = torch.randint(0, 256, (n_tokens,), generator=g).tolist()
    token_file = os.path.join(a.work, "train.bin")
    gg.write_token_file(token_file, tokens)

    results = {"torch": torch.__version__, "device": str(device), "sdpa": gg.HAS_SDPA,
               "model": {"hidden": a.hidden, "intermediate": a.intermediate, "layers": a.layers, "heads": a.heads,
                         "kv_heads": a.kv_heads, "vocab": 256},
               "batch": {"seq": a.seq, "micro": a.micro, "accum": a.accum}, "lr": a.lr, "init_scale": a.init_scale,
               "tolerances": TOLERANCES, "modes": {}}
    failed = False
    for mode in modes:
        print("parity %-4s running gradguard train and the PyTorch step ..." % mode, flush=True)
        try:
            gg_metrics, gg_w, gg_s, cmd = run_gradguard(a, mode, hf_dir, token_file, os.path.join(a.work, "runs"))
            py_loss, py_norm, py_w, fused = run_torch(a, mode, cfg, init, tokens, device)
        except Exception as e:  # one failing mode does not hide the others
            results["modes"][mode] = {"ok": False, "error": str(e)}
            print("parity %-4s ERROR %s" % (mode, str(e).splitlines()[0]))
            failed = True
            continue
        upd, sign, worst = compare(init, gg_w, py_w)
        r = {
            "gradguard": {"loss": gg_metrics["loss"], "grad_norm": gg_metrics["grad_norm"],
                          "loss_scale": gg_metrics.get("loss_scale"), "skipped": gg_metrics.get("skipped"),
                          "seconds": round(gg_s, 2)},
            "torch": {"loss": py_loss, "grad_norm": py_norm, "fused_adamw": fused},
            "loss_rel": abs(gg_metrics["loss"] - py_loss) / abs(py_loss),
            "grad_norm_rel": abs(gg_metrics["grad_norm"] - py_norm) / abs(py_norm),
            "update_rel": upd, "sign_agreement": sign, "worst_tensor": {"name": worst[0], "update_rel": worst[1]},
        }
        tol = TOLERANCES[mode]
        r["ok"] = bool(r["loss_rel"] <= tol["loss"] and r["grad_norm_rel"] <= tol["grad_norm"] and
                       upd <= tol["update"] and sign >= tol["sign"] and not gg_metrics.get("skipped"))
        failed |= not r["ok"]
        results["modes"][mode] = r
        print("parity %-4s %s  loss %.6f vs %.6f (rel %.2e <= %.0e)  grad_norm %.5f vs %.5f (rel %.2e <= %.0e)  "
              "update rel %.3e (<= %.2g), sign agreement %.4f (>= %.3g), worst %s %.2e" %
              (mode, "ok  " if r["ok"] else "FAIL", gg_metrics["loss"], py_loss, r["loss_rel"], tol["loss"],
               gg_metrics["grad_norm"], py_norm, r["grad_norm_rel"], tol["grad_norm"], upd, tol["update"], sign,
               tol["sign"], worst[0], worst[1]), flush=True)
    results["ok"] = not failed
    out = os.path.join(a.out or a.work, "parity.json")
    with open(out, "w") as f:
        json.dump(results, f, indent=2)
    print("parity.py: wrote %s" % out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
