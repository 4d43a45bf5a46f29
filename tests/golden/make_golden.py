"""Generate gradguard's golden reference files from PyTorch.

Rerun from the repository root with

    /usr/bin/python3 tests/golden/make_golden.py

(torch >= 1.13, no other packages).  Everything is seeded with
torch.manual_seed, so reruns reproduce the files bit for bit on the same torch
build.  It writes, under tests/golden/:

schedule.json
    Learning rate per 0-based step from torch.optim.lr_scheduler on a dummy SGD
    optimizer (lr read from optimizer.param_groups[0]["lr"] before each
    optimizer.step()/scheduler.step()).  Warmup is LinearLR(start_factor=1/W,
    end_factor=1, total_iters=W-1); decay is CosineAnnealingLR(T_max=N-W,
    eta_min=min_lr), LinearLR(1, min_lr/lr, total_iters=N-W) or
    ConstantLR(factor=1, total_iters=0); they are chained with
    SequentialLR(milestones=[W]) (W=0: the decay scheduler alone).  In torch
    1.13 SequentialLR restarts the decay scheduler with step(0) at the
    milestone, so step W gets exactly the decay scheduler's epoch-0 value and
    no off-by-one occurs; no LambdaLR workaround is needed.  The script asserts
    that every value matches gradguard's closed form to 1e-6 relative:
        s < W:       lr * (s+1) / W
        W <= s < N:  p = (s-W)/(N-W);
                     cosine  min_lr + (lr-min_lr) * 0.5 * (1 + cos(pi p))
                     linear  lr - (lr-min_lr) * p
                     constant lr

clip.json
    torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=2.0) on float32
    gradients.  Note torch scales by max_norm / (total_norm + 1e-6) (clamped
    to 1), not max_norm / total_norm; the file stores torch's result.

adamw.json
    torch.optim.AdamW (betas (0.9, 0.95), eps 1e-8) with two param groups
    (weight: weight_decay 0.1, bias: weight_decay 0.0), 5 steps, lr set on both
    groups before every step.

llama_tiny/, llama_tiny_tied/
    Hugging Face style model directories (config.json, model.safetensors
    written by the small safetensors writer below, forward.json with logits,
    cross-entropy loss and per-parameter gradient L2 norms) for the reference
    model in tests/golden/llama_reference.py.

Floats are written as the float64 value of each float32 result (Python repr,
round-trips exactly).
"""

import json
import math
import os
import struct
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # keep tests/golden free of __pycache__
sys.path.insert(0, HERE)

import llama_reference as ref  # noqa: E402


# ----------------------------------------------------------------------------
# JSON output: objects one key per line, flat number lists on one line.

def _dump(obj, indent=0):
    pad = " " * indent
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f'{pad} {json.dumps(k)}: {_dump(v, indent + 1)}' for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, (list, tuple)):
        if all(not isinstance(v, (dict, list, tuple)) for v in obj):
            return "[" + ",".join(_scalar(v) for v in obj) + "]"
        items = [pad + " " + _dump(v, indent + 1) for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return _scalar(obj)


def _scalar(v):
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError("non-finite float in golden data")
        return repr(v)
    return json.dumps(v)


def write_json(path, obj):
    with open(path, "w") as f:
        f.write(_dump(obj) + "\n")
    print(f"wrote {os.path.relpath(path, os.path.dirname(os.path.dirname(HERE)))}"
          f" ({os.path.getsize(path)} bytes)")


def flat(t):
    """float64 values of a float32 tensor, flattened row-major."""
    return t.detach().to(torch.float64).reshape(-1).tolist()


def scalar(t):
    return float(t.detach().to(torch.float64).item())


# ----------------------------------------------------------------------------
# 1. Learning-rate schedules.

def closed_form_lr(lr, min_lr, W, N, decay, s):
    if s < W:
        return lr * (s + 1) / W
    p = (s - W) / (N - W)
    if decay == "cosine":
        return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * p))
    if decay == "linear":
        return lr - (lr - min_lr) * p
    if decay == "constant":
        return lr
    raise ValueError(decay)


def torch_schedule(lr, min_lr, W, N, decay):
    sched = torch.optim.lr_scheduler
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=lr)
    if decay == "cosine":
        dec = sched.CosineAnnealingLR(opt, T_max=N - W, eta_min=min_lr)
    elif decay == "linear":
        dec = sched.LinearLR(opt, start_factor=1.0, end_factor=min_lr / lr, total_iters=N - W)
    elif decay == "constant":
        dec = sched.ConstantLR(opt, factor=1.0, total_iters=0)
    else:
        raise ValueError(decay)
    if W > 0:
        warm = sched.LinearLR(opt, start_factor=1.0 / W, end_factor=1.0, total_iters=W - 1)
        s = sched.SequentialLR(opt, schedulers=[warm, dec], milestones=[W])
    else:
        s = dec
    lrs = []
    for _ in range(N):
        lrs.append(float(opt.param_groups[0]["lr"]))
        opt.step()
        s.step()
    return lrs


def make_schedule():
    import warnings
    cases = [
        (3e-3, 3e-4, 10, 50, "cosine"),
        (1e-3, 0.0, 5, 40, "linear"),
        (6e-4, 6e-5, 0, 30, "cosine"),
        (1e-2, 1e-3, 8, 24, "constant"),
        (3e-3, 3e-4, 1, 12, "linear"),
    ]
    out = []
    worst = 0.0
    for lr, min_lr, W, N, decay in cases:
        with warnings.catch_warnings():
            # SequentialLR calls scheduler.step(0), which emits a deprecation warning.
            warnings.simplefilter("ignore")
            lrs = torch_schedule(lr, min_lr, W, N, decay)
        for s, got in enumerate(lrs):
            want = closed_form_lr(lr, min_lr, W, N, decay, s)
            rel = abs(got - want) / max(abs(want), 1e-300)
            worst = max(worst, rel)
            assert rel <= 1e-6, (lr, min_lr, W, N, decay, s, got, want)
        out.append({"lr": lr, "min_lr": min_lr, "warmup_steps": W, "total_steps": N,
                    "decay": decay, "lrs": lrs})
    print(f"schedule: torch matches closed form, worst relative difference {worst:.3g}")
    write_json(os.path.join(HERE, "schedule.json"), {"cases": out})


# ----------------------------------------------------------------------------
# 2. Gradient clipping.

def make_clip():
    torch.manual_seed(1234)
    shapes = [[4, 3], [3], [2, 2, 2]]
    base = [torch.randn(s) for s in shapes]
    cases = []

    def case(max_norm, grads):
        params = [torch.nn.Parameter(torch.randn(g.shape)) for g in grads]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        total = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=2.0)
        cases.append({
            "max_norm": max_norm,
            "shapes": [list(g.shape) for g in grads],
            "grads": [flat(g) for g in grads],
            "total_norm": scalar(total),
            "clipped": [flat(p.grad) for p in params],
        })
        return scalar(total)

    norm = case(100.0, base)                       # well below max: unchanged
    assert norm < 100.0
    case(1.0, [3.0 * g for g in base])             # above: clipped to ~1
    case(1e-3, base)                               # strong clipping
    with_zero = [base[0], torch.zeros(5), base[1], base[2]]
    case(0.5, with_zero)                           # a zero gradient among others
    write_json(os.path.join(HERE, "clip.json"), {"cases": cases})


# ----------------------------------------------------------------------------
# 3. AdamW with two param groups.

def make_adamw():
    torch.manual_seed(42)
    weight = torch.nn.Parameter(torch.randn(3, 4))
    bias = torch.nn.Parameter(torch.randn(4))
    init = {"weight": flat(weight), "bias": flat(bias)}
    lrs = [1e-2, 2e-2, 3e-2, 2e-2, 1e-2]
    opt = torch.optim.AdamW(
        [{"params": [weight], "weight_decay": 0.1},
         {"params": [bias], "weight_decay": 0.0}],
        lr=lrs[0], betas=(0.9, 0.95), eps=1e-8, foreach=False)
    steps = []
    for lr in lrs:
        gw, gb = torch.randn(3, 4), torch.randn(4)
        for group in opt.param_groups:
            group["lr"] = lr
        weight.grad = gw.clone()
        bias.grad = gb.clone()
        opt.step()
        steps.append({"lr": lr,
                      "grads": {"weight": flat(gw), "bias": flat(gb)},
                      "params": {"weight": flat(weight), "bias": flat(bias)}})
    write_json(os.path.join(HERE, "adamw.json"), {
        "betas": [0.9, 0.95], "eps": 1e-8,
        "weight_decay": {"weight": 0.1, "bias": 0.0},
        "shapes": {"weight": [3, 4], "bias": [4]},
        "init": init, "lrs": lrs, "steps": steps})


# ----------------------------------------------------------------------------
# 4. safetensors writer / reader (float32 only).

def write_safetensors(path, tensors):
    header = {}
    chunks = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].detach().to(torch.float32).contiguous()
        data = struct.pack("<%df" % t.numel(), *t.reshape(-1).tolist())
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hbytes += b" " * ((8 - len(hbytes) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hbytes)))
        f.write(hbytes)
        for c in chunks:
            f.write(c)


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    out = {}
    end_max = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32"
        b, e = info["data_offsets"]
        count = (e - b) // 4
        assert count == math.prod(info["shape"]) and (e - b) % 4 == 0
        vals = struct.unpack("<%df" % count, data[b:e])
        out[name] = torch.tensor(vals, dtype=torch.float32).reshape(info["shape"])
        end_max = max(end_max, e)
    assert end_max == len(data), "trailing bytes in safetensors data section"
    return out, header


# ----------------------------------------------------------------------------
# 5. Tiny Llama models.

def make_llama(dirname, cfg, seed):
    out_dir = os.path.join(HERE, dirname)
    os.makedirs(out_dir, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = ref.LlamaForCausalLM(cfg)
    model.init_weights(gen)
    state = {n: p.detach().clone() for n, p in model.named_parameters()}
    if cfg.tie_word_embeddings:
        assert "lm_head.weight" not in state
    else:
        assert "lm_head.weight" in state

    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg.to_hf_dict(), f, indent=2)
        f.write("\n")

    st_path = os.path.join(out_dir, "model.safetensors")
    write_safetensors(st_path, state)
    back, header = read_safetensors(st_path)
    assert sorted(back) == sorted(state)
    for name, t in state.items():
        assert back[name].shape == t.shape and torch.equal(back[name], t), name
    by_offset = sorted(back, key=lambda k: header[k]["data_offsets"][0])
    assert by_offset == sorted(state), "tensors not laid out in sorted-name order"
    print(f"{dirname}: safetensors round trip OK ({len(state)} tensors,"
          f" {os.path.getsize(st_path)} bytes)")

    B, T = 2, 12
    input_ids = torch.randint(0, cfg.vocab_size, (B, T), generator=gen)
    targets = torch.randint(0, cfg.vocab_size, (B, T), generator=gen)
    model.zero_grad()
    logits = model(input_ids)
    loss = ref.causal_lm_loss(logits, targets)
    loss.backward()
    grad_norms = {n: scalar(p.grad.norm(2)) for n, p in model.named_parameters()}
    write_json(os.path.join(out_dir, "forward.json"), {
        "input_ids": input_ids.tolist(),
        "targets": targets.tolist(),
        "logits_shape": list(logits.shape),
        "loss": scalar(loss),
        "grad_norms": grad_norms,
        "logits": flat(logits),
    })


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)  # keep reductions in one order across machines
    make_schedule()
    make_clip()
    make_adamw()
    make_llama("llama_tiny", ref.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=88, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False), seed=7)
    make_llama("llama_tiny_tied", ref.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=88, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True), seed=11)


if __name__ == "__main__":
    main()
