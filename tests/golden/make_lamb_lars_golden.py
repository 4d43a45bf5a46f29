"""Generate tests/golden/lamb_lars.json, the reference for gradguard's LAMB and LARS.

Rerun from the repository root with

    /usr/bin/python3 tests/golden/make_lamb_lars_golden.py

(torch >= 1.13, no other packages; seeded with torch.manual_seed, so reruns
reproduce the file bit for bit on the same torch build).

Neither optimizer exists in torch.optim, so this script is the reference: a
plain float64 transcription of the papers' update rules, written from the
formulas below and not from gradguard's C++.  Per parameter tensor w with
gradient g:

LAMB -- You et al. 2019, "Large Batch Optimization for Deep Learning: Training
BERT in 76 minutes", Algorithm 2, at step t (1-based):
    m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
    m_hat = m / (1-b1^t);  v_hat = v / (1-b2^t)      (bias_correction; else m, v)
    u = m_hat / (sqrt(v_hat) + eps) + weight_decay * w
    trust = clamp(||w|| / ||u||, 0, max_trust_ratio);
            trust = 1 if ||w|| == 0 or ||u|| == 0 or the group is not adaptive
    w -= lr * trust * u

LARS -- You, Gitman, Ginsburg 2017, "Large Batch Training of Convolutional
Networks":
    local_lr = trust_coefficient * ||w|| / (||g|| + weight_decay * ||w|| + eps);
               local_lr = 1 if ||w|| == 0 or ||g|| == 0 or not adaptive
    buf = momentum * buf + lr * local_lr * (g + weight_decay * w)
          (first step: buf = lr * local_lr * (g + weight_decay * w))
    w -= buf

Every case has two parameter groups: "w", a [4,3] tensor in a group with
adaptive=True and the case's weight_decay, and "b", a [3] tensor in a group
with adaptive=False and weight_decay 0 (the usual treatment of norm weights
and biases).  Each case runs 6 steps with the same per-step lr on both groups
and fixed random float32 gradients.  Initial values and gradients are float32
(what the C++ test feeds in); the reference arithmetic is float64.  Cases
named *_zero_weight start "w" at all zeros, which takes the trust = 1 /
local_lr = 1 path on the first step; lamb_clamped starts "w" at 50x a random
tensor so the LAMB trust ratio hits max_trust_ratio.

lamb_lars.json holds {"cases": [...]}, each case with "optimizer" ("lamb" or
"lars"), "name", "options" (the "w" group's options; the "b" group uses the
same with adaptive false and weight_decay 0), "shapes", "init", "lrs", and
"steps": for each step the "grads" fed in and the "params" after the step.
Floats are Python repr of float64 (round-trip exactly).
"""

import json
import math
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = {"w": [4, 3], "b": [3]}
STEPS = 6


def norm(x):
    return math.sqrt(float((x * x).sum()))


def lamb_step(w, g, st, lr, o, adaptive, wd):
    b1, b2 = o["betas"]
    st["t"] += 1
    t = st["t"]
    st["m"] = b1 * st["m"] + (1 - b1) * g
    st["v"] = b2 * st["v"] + (1 - b2) * g * g
    m_hat, v_hat = st["m"], st["v"]
    if o["bias_correction"]:
        m_hat = m_hat / (1 - b1 ** t)
        v_hat = v_hat / (1 - b2 ** t)
    u = m_hat / (torch.sqrt(v_hat) + o["eps"]) + wd * w
    trust = 1.0
    if adaptive:
        wn, un = norm(w), norm(u)
        if wn > 0 and un > 0:
            trust = min(max(wn / un, 0.0), o["max_trust_ratio"])
    return w - lr * trust * u


def lars_step(w, g, st, lr, o, adaptive, wd):
    local_lr = 1.0
    if adaptive:
        wn, gn = norm(w), norm(g)
        if wn > 0 and gn > 0:
            local_lr = o["trust_coefficient"] * wn / (gn + wd * wn + o["eps"])
    d = lr * local_lr * (g + wd * w)
    st["buf"] = d if st["buf"] is None else o["momentum"] * st["buf"] + d
    return w - st["buf"]


def run_case(optimizer, name, options, lrs, seed, w_init="randn"):
    torch.manual_seed(seed)
    init = {k: torch.randn(s, dtype=torch.float32) for k, s in SHAPES.items()}
    if w_init == "zeros":
        init["w"] = torch.zeros(SHAPES["w"], dtype=torch.float32)
    elif w_init == "large":
        init["w"] = init["w"] * 50
    grads = [{k: torch.randn(s, dtype=torch.float32) for k, s in SHAPES.items()}
             for _ in range(STEPS)]
    assert len(lrs) == STEPS
    step_fn = lamb_step if optimizer == "lamb" else lars_step
    params = {k: v.double() for k, v in init.items()}
    states = {}
    for k, p in params.items():
        if optimizer == "lamb":
            states[k] = {"t": 0, "m": torch.zeros_like(p), "v": torch.zeros_like(p)}
        else:
            states[k] = {"buf": None}
    steps = []
    for lr, gs in zip(lrs, grads):
        for k in params:
            adaptive = k == "w"
            wd = options["weight_decay"] if adaptive else 0.0
            params[k] = step_fn(params[k], gs[k].double(), states[k], lr, options, adaptive, wd)
        steps.append({
            "grads": {k: v.tolist() for k, v in ((k, g.flatten()) for k, g in gs.items())},
            "params": {k: p.flatten().tolist() for k, p in params.items()},
        })
    return {
        "optimizer": optimizer,
        "name": name,
        "options": options,
        "shapes": SHAPES,
        "init": {k: v.flatten().tolist() for k, v in init.items()},
        "lrs": lrs,
        "steps": steps,
    }


def lamb_options(**kw):
    o = {"betas": [0.9, 0.999], "eps": 1e-6, "weight_decay": 0.01,
         "max_trust_ratio": 10.0, "bias_correction": True}
    o.update(kw)
    return o


def lars_options(**kw):
    o = {"momentum": 0.9, "weight_decay": 1e-4, "trust_coefficient": 0.001, "eps": 1e-9}
    o.update(kw)
    return o


def cases():
    lamb_lrs = [0.01, 0.02, 0.05, 0.05, 0.03, 0.01]
    lars_lrs = [0.5, 1.0, 2.0, 2.0, 1.0, 0.5]
    return [
        run_case("lamb", "lamb", lamb_options(), lamb_lrs, seed=1),
        run_case("lamb", "lamb_zero_weight", lamb_options(weight_decay=0.1), lamb_lrs,
                 seed=2, w_init="zeros"),
        run_case("lamb", "lamb_clamped", lamb_options(betas=[0.8, 0.99], max_trust_ratio=5.0,
                                                      bias_correction=False),
                 lamb_lrs, seed=3, w_init="large"),
        run_case("lars", "lars", lars_options(trust_coefficient=0.05, weight_decay=5e-3),
                 [lr * 0.1 for lr in lars_lrs], seed=4),
        run_case("lars", "lars_zero_weight", lars_options(), [lr * 0.1 for lr in lars_lrs],
                 seed=5, w_init="zeros"),
        run_case("lars", "lars_no_momentum", lars_options(momentum=0.0, trust_coefficient=0.02,
                                                          weight_decay=1e-2, eps=1e-6),
                 [lr * 0.1 for lr in lars_lrs], seed=6),
    ]


# JSON output: objects one key per line, flat number lists on one line.
def _dump(obj, indent=0):
    pad = " " * indent
    if isinstance(obj, dict):
        items = [f"{pad} {json.dumps(k)}: {_dump(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, (list, tuple)):
        if all(not isinstance(v, (dict, list, tuple)) for v in obj):
            return "[" + ",".join(json.dumps(v) for v in obj) + "]"
        items = [pad + " " + _dump(v, indent + 1) for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return json.dumps(obj)


def main():
    out = os.path.join(HERE, "lamb_lars.json")
    with open(out, "w") as f:
        f.write(_dump({"cases": cases()}) + "\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
