"""Generate tests/golden/scaler.json: PyTorch's dynamic loss-scale trajectory.

Rerun from the repository root with

    /usr/bin/python3 tests/golden/make_scaler_golden.py

(torch 1.13, no other packages; deterministic).

The reference.  GradScaler.update() calls torch._amp_update_scale_, but in
torch 1.13 that op has only a CUDA kernel (on CPU tensors it raises "Could not
run 'aten::_amp_update_scale_' with arguments from the 'CPU' backend").  Torch
1.13 ships its own CPU version of the same algorithm:
torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler._amp_update_scale_cpu_,
which ShardedGradScaler.update() uses when the scale tensor lives on the CPU.
This script compiles that method from torch's installed source, unmodified
(see _reference_update_fn: the fsdp package itself does not import on Python
3.11 with torch 1.13), and calls it as a plain function on a small
stand-in object carrying the attributes it reads and writes (_scale as a
float32 CPU tensor exactly as GradScaler keeps it, _growth_tracker,
_growth_factor, _backoff_factor, _growth_interval), so no process group and no
GPU are needed.  When torch._amp_update_scale_ does run on CPU (a torch that
has the kernel) the script uses it instead and says so in the file.  Both
implement, per optimizer step:

    if found_inf: scale *= backoff_factor; growth_tracker = 0
    else:         growth_tracker += 1
                  if growth_tracker == growth_interval:
                      scale *= growth_factor; growth_tracker = 0

The scale is float32 in PyTorch; all factors used here are powers of two and
the scales stay far inside float32's range, so every value is exact and
gradguard's double-precision scaler must match bit for bit.

Each case stores the options and, per step, found_inf (bool), the scale after
the update and growth_tracker after the update.  Floats are written with
Python repr (exact).
"""

import ast
import json
import os
import random
import types

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def _cpu_op_available():
    try:
        s = torch.tensor([1.0])
        t = torch.tensor([0], dtype=torch.int32)
        torch._amp_update_scale_(s, t, torch.tensor([0.0]), 2.0, 0.5, 1)
        return True
    except (RuntimeError, NotImplementedError):
        return False


USE_NATIVE_OP = _cpu_op_available()


def _reference_update_fn():
    """ShardedGradScaler._amp_update_scale_cpu_, compiled from torch's own source file.

    Importing torch.distributed.fsdp fails on Python 3.11 with torch 1.13 (a
    dataclass with a mutable default in torch.distributed._shard), so the method is
    taken from the installed sharded_grad_scaler.py with `ast` and compiled as a
    plain function, its text unchanged.
    """
    path = os.path.join(os.path.dirname(torch.__file__), "distributed", "fsdp",
                        "sharded_grad_scaler.py")
    with open(path) as f:
        tree = ast.parse(f.read(), filename=path)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "ShardedGradScaler":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "_amp_update_scale_cpu_":
                    item.decorator_list = []
                    module = ast.Module(body=[item], type_ignores=[])
                    namespace = {"torch": torch}
                    exec(compile(module, path, "exec"), namespace)
                    return namespace["_amp_update_scale_cpu_"]
    raise RuntimeError(path + " has no ShardedGradScaler._amp_update_scale_cpu_")


def run_case(name, init_scale, growth_factor, backoff_factor, growth_interval, pattern):
    """Drive PyTorch's update over `pattern` (a string of 'F' finite / 'I' inf steps)."""
    steps = []
    if USE_NATIVE_OP:
        scale = torch.full((1,), init_scale, dtype=torch.float32)
        tracker = torch.zeros((1,), dtype=torch.int32)
        for ch in pattern:
            found_inf = torch.full((1,), 1.0 if ch == "I" else 0.0)
            torch._amp_update_scale_(scale, tracker, found_inf, growth_factor,
                                     backoff_factor, growth_interval)
            steps.append({"found_inf": ch == "I", "scale": float(scale.item()),
                          "growth_tracker": int(tracker.item())})
    else:
        update = _reference_update_fn()
        state = types.SimpleNamespace(
            _scale=torch.full((1,), init_scale, dtype=torch.float32),
            _growth_tracker=torch.zeros((1,), dtype=torch.int32),
            _growth_factor=growth_factor, _backoff_factor=backoff_factor,
            _growth_interval=growth_interval)
        for ch in pattern:
            found_inf = torch.full((1,), 1.0 if ch == "I" else 0.0)
            update(state, found_inf)
            assert state._scale.dtype == torch.float32
            steps.append({"found_inf": ch == "I", "scale": float(state._scale.item()),
                          "growth_tracker": int(state._growth_tracker)})
    return {"name": name, "init_scale": init_scale, "growth_factor": growth_factor,
            "backoff_factor": backoff_factor, "growth_interval": growth_interval,
            "steps": steps}


def main():
    random.seed(1234)
    cases = []
    # Interval 3: inf right before growth (FFI), several consecutive infs, long finite
    # runs (many growths), inf right after a growth, alternating.
    p = "FFI" + "FFF" + "FFI" + "FFF" + "IIII" + "F" * 13 + "IFIFIF" + "FFFI" + "FFFFFF" + "IIIIII" + "F" * 9
    cases.append(run_case("interval3_scripted", 65536.0, 2.0, 0.5, 3, p))
    # Interval 1: grows on every finite step.
    cases.append(run_case("interval1_every_step", 1024.0, 2.0, 0.5, 1,
                          "FFFFIFFIIFFFFFIIIFFF" * 2 + "IIIII" + "F" * 10))
    # Other power-of-two factors, interval 4.
    cases.append(run_case("factor4_backoff_quarter", 4096.0, 4.0, 0.25, 4,
                          "FFFFFFFFIFFFIFFFFIIFFFFFFFFFFFFFIFFFFFFFFIIIFFFFFFFF"))
    # Seeded random pattern (20% overflow), PyTorch's default options but interval 5.
    rnd = "".join("I" if random.random() < 0.2 else "F" for _ in range(200))
    cases.append(run_case("random_interval5", 65536.0, 2.0, 0.5, 5, rnd))
    for c in cases:
        assert len(c["steps"]) >= 40, c["name"]
        assert any(s["found_inf"] for s in c["steps"]), c["name"]
    out = {
        "reference": ("torch._amp_update_scale_ (CPU kernel)" if USE_NATIVE_OP else
                      "torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler."
                      "_amp_update_scale_cpu_, compiled from torch's installed source "
                      "(torch._amp_update_scale_ has no CPU kernel)"),
        "torch_version": torch.__version__,
        "cases": cases,
    }
    path = os.path.join(HERE, "scaler.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("wrote", path, "reference:", out["reference"])


if __name__ == "__main__":
    main()
