"""gradguard for PyTorch loops: the guarded step of `gradguard train` around your own loop.

One object, :class:`Guard`, dropped into a plain loop gives loss scaling, the fused
gradient statistics (one device->host read per step), the clipping strategies, anomaly
detection, snapshots with a diagnosis, the recovery ladder's decisions and a
metrics.jsonl that ``gradguard report`` draws::

    guard = gradguard.Guard(model, optimizer, run_dir="runs/mine", config={"clip.strategy": "agc"})
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step) * guard.lr_factor(step)
        optimizer.zero_grad(set_to_none=True)
        loss = model_loss(batch) ; (loss * guard.loss_scale).backward()
        out = guard.step(step, loss)
        if out.applied:
            optimizer.step()
        if out.halt:
            sys.exit(gradguard.EXIT_HALTED)

The C++ is the same library the `gradguard` executable is built from (gradguard._C);
docs/python.md describes the API and every field of a step's outcome.
"""
import torch  # noqa: F401  (loads LibTorch and its Python bindings before the extension)

from . import _C
from ._C import BadInputError, Error, HaltedError, HostReadCounter, StepOutcome, Anomaly
from .guard import Guard, reset_moments, effective_config, config_overrides

__version__ = _C.__version__

# The process exit code of a run the guard halted (gradguard's own convention: 0 done,
# 1 failure, 2 bad input, 3 halted).
EXIT_HALTED = 3

__all__ = [
    "Guard",
    "StepOutcome",
    "Anomaly",
    "reset_moments",
    "effective_config",
    "config_overrides",
    "HostReadCounter",
    "Error",
    "BadInputError",
    "HaltedError",
    "EXIT_HALTED",
]
