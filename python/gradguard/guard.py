"""The Guard: gradguard's guarded step for a PyTorch loop.

What the guard decides and what the loop does stay apart, as in gradguard's own
trainer: the guard measures the gradients (one device->host read), unscales and clips
them in place, judges the step and decides what to do about an anomaly; the loop
applies that with ordinary calls -- ``optimizer.step()`` when ``out.applied``, its own
checkpoint restore when ``out.rollback``, stopping when ``out.halt``. Moment resets are
done by the guard when it was given the optimizer (``out.tensors_reset`` counts them),
else by the loop with :func:`reset_moments`.

Under ``torch.distributed`` the step's loss and micro-batch losses are all-reduced
inside :meth:`Guard.step` before the guard reads them (one all_reduce of a small vector
on the loss's device; no extra host read), so every rank sees the same numbers and
takes the same decisions; the gradients themselves are the loop's to all-reduce (DDP
does). Only rank 0 writes files.
"""
import json
import math
import os

import torch

from . import _C

_YAML_SPECIAL = set(":#{}[],&*!|>'\"%@`")


def _yaml_text(value, key):
    """A Python value as the YAML text of a --set override."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)  # shortest round-trip text; "inf", "-inf", "nan" are read as numbers too
    if isinstance(value, str):
        if value == "" or value != value.strip() or any(c in _YAML_SPECIAL for c in value):
            return json.dumps(value)  # a double-quoted YAML scalar
        return value
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml_text(v, key) for v in value) + "]"
    raise _C.BadInputError("--set %s: a value of type %s cannot be a config value (use bool, int, float, str "
                           "or a list of them)" % (key, type(value).__name__))


def config_overrides(config):
    """``{"clip.strategy": "agc", ...}`` (or a list of "key=value" strings) as --set strings."""
    if config is None:
        return []
    if isinstance(config, dict):
        out = []
        for key, value in config.items():
            if not isinstance(key, str):
                raise _C.BadInputError("config keys are 'section.key' strings, got %r" % (key,))
            out.append("%s=%s" % (key, _yaml_text(value, key)))
        return out
    if isinstance(config, (list, tuple)) and all(isinstance(s, str) for s in config):
        return list(config)
    raise TypeError("config must be a dict of 'section.key' -> value or a list of 'key=value' strings")


def effective_config(config=None):
    """The configuration the overrides give (defaults + overrides, validated), as YAML."""
    return _C.effective_config(config_overrides(config))


def _moments_of(optimizer, param):
    """(exp_avg, exp_avg_sq, momentum_buffer, step) from a torch optimizer's state."""
    state = optimizer.state.get(param)
    if not state:
        return None
    step = state.get("step", 0)
    if torch.is_tensor(step):
        step = int(step.item())  # snapshots only: they may read the device
    return (state.get("exp_avg"), state.get("exp_avg_sq"), state.get("momentum_buffer"), int(step))


def reset_moments(optimizer, params):
    """Forgets the optimizer state of ``params`` (tensors): their next update starts afresh
    (Adam's bias correction included). Returns how many had state."""
    count = 0
    for p in params:
        if p in optimizer.state and optimizer.state[p]:
            del optimizer.state[p]
            count += 1
    return count


def _unwrap(model):
    """The module inside a DistributedDataParallel / DataParallel wrapper."""
    wrappers = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    return model.module if isinstance(model, wrappers) else model


def _batch_parts(batch):
    """(inputs, targets, sample_index) of a batch given to step(); each may be None."""
    if batch is None:
        return None, None, None
    if isinstance(batch, dict):
        return batch.get("inputs"), batch.get("targets"), batch.get("sample_index")
    if isinstance(batch, (list, tuple)) and 2 <= len(batch) <= 3:
        parts = list(batch) + [None] * (3 - len(batch))
        return tuple(p if p is None or torch.is_tensor(p) else torch.as_tensor(p) for p in parts)
    raise TypeError("batch must be (inputs, targets[, sample_index]) or a dict with those keys")


class Guard:
    """gradguard's guarded step for the parameters of ``model`` (or ``params``/``names``).

    Args:
        model: an ``nn.Module`` (DDP-wrapped or not); its trainable named_parameters()
            are guarded. Or give ``params`` (tensors) and ``names`` instead.
        optimizer: the ``torch.optim`` optimizer over those parameters (optional). With
            it, snapshots and diagnoses see its moments (exp_avg, exp_avg_sq, step), the
            guard resets moments itself, and step() records its learning rate.
        run_dir: where config.yaml, metrics.jsonl, TensorBoard events and snapshots go
            (rank 0 only); None writes nothing.
        config: overrides of gradguard's configuration, ``{"section.key": value}`` or
            ``["section.key=value", ...]`` -- the same keys and checks as
            ``gradguard train --set`` (docs/config.md). A bad key or value raises
            BadInputError naming it.
        warmup_steps, peak_lr: the loop's schedule warmup and peak learning rate (the
            detector's warmup and the diagnosis); default schedule.warmup_steps / optim.lr.
        global_batch: sequences per optimizer step over all ranks (event lines, noise
            scale); default batch.global_batch.
        tokens_per_step: metrics "tokens" when step() is not told; default
            global_batch x data.seq_len.
        rollback_available: a callable saying whether the loop has a checkpoint to roll
            back to (rank 0's answer counts); None: never, so the ladder passes rollback by.
        write_model: a callable (dir) that writes a snapshot's model/ directory; default
            the weights as model/model.safetensors.
        resume: append to run_dir's metrics.jsonl instead of refusing a used directory.
        process_group: the torch.distributed group of the data-parallel ranks (default
            the world when torch.distributed is initialised).
        count_host_reads: count the device->host reads of every step() (out.host_reads);
            for tests -- counting watches every operator and slows the step.
    """

    def __init__(self, model=None, optimizer=None, run_dir=None, config=None, *, params=None, names=None,
                 warmup_steps=None, peak_lr=None, global_batch=None, tokens_per_step=None,
                 rollback_available=None, write_model=None, resume=False, process_group=None,
                 count_host_reads=False):
        if model is not None:
            if params is not None or names is not None:
                raise TypeError("give either model or params/names, not both")
            named = [(n, p) for n, p in _unwrap(model).named_parameters() if p.requires_grad]
            names = [n for n, _ in named]
            params = [p for _, p in named]
        elif params is not None:
            params = list(params)
            names = list(names) if names is not None else ["params.%d" % i for i in range(len(params))]
        else:
            raise TypeError("Guard needs a model or params")
        self.params = params
        self.optimizer = optimizer

        dist = torch.distributed
        self._group = process_group
        if dist.is_available() and dist.is_initialized():
            self.rank = dist.get_rank(process_group)
            self.world_size = dist.get_world_size(process_group)
        else:
            self.rank, self.world_size = 0, 1
        self._count = bool(count_host_reads)
        self._noise = None  # (squared norm tensor, share, micro batch) of this step's sample
        self._user_rollback = rollback_available

        moments = None
        reset = None
        if optimizer is not None:
            moments = lambda i: _moments_of(optimizer, params[i])  # noqa: E731
            reset = lambda i: reset_moments(optimizer, [params[i]]) == 1  # noqa: E731
        self._core = _C.GuardCore(
            params, names, config_overrides(config), "" if run_dir is None else os.fspath(run_dir),
            self.rank == 0, self.world_size,
            -1 if warmup_steps is None else int(warmup_steps),
            -1.0 if peak_lr is None else float(peak_lr),
            0 if global_batch is None else int(global_batch),
            0 if tokens_per_step is None else int(tokens_per_step),
            bool(resume), moments, reset,
            None if rollback_available is None else self._rollback_available,
            write_model)

    # ---- before backward ----------------------------------------------------------------
    @property
    def loss_scale(self):
        """Multiply the loss by this before backward (1.0 unless loss scaling is on)."""
        return self._core.loss_scale

    def lr_factor(self, step):
        """The recovery ladder's learning-rate factor at ``step`` (cooldown_factor in a cool-down, else 1)."""
        return self._core.lr_factor(step)

    def compute_dtype(self, step):
        """The dtype ("fp32", "bf16" or "fp16") this step's forward and backward should compute
        in: amp.dtype, made wider (fp16 -> bf16 -> fp32) while the recovery ladder's
        ``precision`` rung lasts. A loop with autocast passes it on."""
        return self._core.compute_dtype(step)

    def noise_due(self, step):
        """Whether ``step`` samples the gradient noise scale (guard.noise_scale.every)."""
        return self._core.noise_due(step)

    def sample_noise(self, share, micro_batch):
        """Records the gradient-noise-scale sample of this step: call right after the first
        micro-batch's backward, before any gradient all-reduce (inside DDP's no_sync).
        ``share``: that micro-batch's share of the global batch's tokens (1 / (accum x ranks)
        for equal micro-batches); ``micro_batch``: its sequences. No host read."""
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return
        with torch.no_grad():
            sq = torch.stack(torch._foreach_norm(grads)).float().pow(2).sum()
        self._noise = (sq, float(share), float(micro_batch))

    # ---- after backward -----------------------------------------------------------------
    def step(self, step, loss, micro_losses=None, lr=None, batch=None, tokens=None, injected=None, z_loss=None):
        """Runs the guard on the gradients in ``.grad`` (scaled by loss_scale).

        Args:
            step: the 0-based optimizer step.
            loss: this rank's mean loss of its share of the global batch (a 0-dim tensor,
                unscaled; a float works too). Averaged over the ranks here.
            micro_losses: this rank's mean loss of each micro-batch (tensors or a 1-D
                tensor), gathered over the ranks here (global order m x ranks + rank).
            lr: the learning rate of this step (default: the optimizer's first group).
            batch: (inputs, targets[, sample_index]) kept in a snapshot; rank 0's.
            tokens: target tokens of the global batch, for metrics.
            injected: the name of a fault the loop injected on purpose (the diagnosis says so).
            z_loss: this rank's auxiliary z-loss term (PaLM: c x logsumexp(logits)^2 over the
                trained targets, as a mean like ``loss``), when the loop adds one to its
                objective: averaged over the ranks, logged as ``z_loss``, kept out of ``loss``.

        Returns the step's StepOutcome. Unscales and clips ``.grad`` in place; never
        steps the optimizer (``if out.applied: optimizer.step()``).
        """
        counter = _C.HostReadCounter() if self._count else None
        if counter is not None:
            counter.__enter__()
        try:
            out = self._step(step, loss, micro_losses, lr, batch, tokens, injected, z_loss)
        finally:
            if counter is not None:
                counter.__exit__(None, None, None)
        if counter is not None:
            out.host_reads = counter.count
        return out

    def _step(self, step, loss, micro_losses, lr, batch, tokens, injected, z_loss):
        loss_t = loss.detach().reshape(()) if torch.is_tensor(loss) else torch.tensor(float(loss))
        z_t = None
        if z_loss is not None:
            z_t = (z_loss.detach().reshape(()) if torch.is_tensor(z_loss) else torch.tensor(float(z_loss))).to(
                loss_t.device)
        micro = None
        if micro_losses is not None:
            if torch.is_tensor(micro_losses):
                micro = micro_losses.detach().reshape(-1)
            elif len(micro_losses) > 0:
                micro = torch.stack([torch.as_tensor(m).detach().reshape(()).to(loss_t.device)
                                     for m in micro_losses])
        noise, self._noise = self._noise, None
        noise_sq, share, micro_batch = (noise if noise is not None else (None, 0.0, 0.0))
        if self.world_size > 1:
            loss_t, micro, noise_sq, z_t = self._all_reduce(loss_t, micro, noise_sq, z_t)
        if lr is None and self.optimizer is not None:
            lr = self.optimizer.param_groups[0]["lr"]
        inputs, targets, sample_index = _batch_parts(batch) if self.rank == 0 else (None, None, None)
        return self._core.step(step, loss_t, micro, math.nan if lr is None else float(lr), noise_sq, share,
                               micro_batch, float(self._core.global_batch), injected or "", inputs, targets,
                               sample_index, 0 if tokens is None else int(tokens), z_t)

    def _all_reduce(self, loss, micro, noise_sq, z):
        """One all_reduce (sum) of [loss / W | micro losses in slots m x W + rank | noise / W | z / W]."""
        w, r = self.world_size, self.rank
        parts = [loss.float().reshape(1) / w]
        n = 0 if micro is None else micro.numel()
        if n:
            grid = torch.zeros(n, w, dtype=torch.float32, device=loss.device)
            grid[:, r] = micro.float()
            parts.append(grid.reshape(-1))
        if noise_sq is not None:
            parts.append(noise_sq.float().reshape(1) / w)
        if z is not None:
            parts.append(z.float().reshape(1) / w)
        side = torch.cat(parts)
        torch.distributed.all_reduce(side, group=self._group)
        micro = side[1:1 + n * w] if n else None
        at = 1 + n * w + (1 if noise_sq is not None else 0)
        return (side[0], micro, (side[1 + n * w] if noise_sq is not None else None),
                (side[at] if z is not None else None))

    def _rollback_available(self):
        ok = bool(self._user_rollback())
        if self.world_size > 1:  # rank 0 holds the checkpoints: its answer decides for all
            flag = torch.tensor([1.0 if ok else 0.0])
            if torch.distributed.get_backend(self._group) == "nccl":
                flag = flag.cuda()
            src = 0 if self._group is None else torch.distributed.distributed_c10d._get_global_rank(self._group, 0)
            torch.distributed.broadcast(flag, src=src, group=self._group)
            ok = bool(flag.item())  # on critical steps only
        return ok

    # ---- acting on the outcome -----------------------------------------------------------
    def reset_moments(self, optimizer, outcome):
        """Resets the moments of the tensors ``outcome.reset_params`` names (for a Guard
        made without the optimizer). Returns how many had state."""
        return reset_moments(optimizer, [self.params[i] for i in outcome.reset_indices])

    # ---- the run directory ---------------------------------------------------------------
    def log_validation(self, step, val_loss):
        """A {"step", "val_loss"} line in metrics.jsonl (rank 0)."""
        self._core.write_validation(int(step), float(val_loss))

    def log_event(self, step, event, **fields):
        """An event line {"step", "event", ...fields} in metrics.jsonl (rank 0)."""
        line = {"step": int(step), "event": event}
        line.update(fields)
        self._core.write_event(json.dumps(line))

    def log_rollback(self, step, to_step, checkpoint=""):
        """The line a rollback leaves in metrics.jsonl (what `gradguard report` marks)."""
        self.log_event(step, "rollback", checkpoint=str(checkpoint), to_step=int(to_step))

    def state_dict(self):
        """The guard's state (loss scaler, clipper, detector windows, ladder budgets, noise
        scale, snapshot budget) as a JSON-able dict: save it with the loop's checkpoint."""
        return json.loads(self._core.state_dict())

    def load_state_dict(self, state, rollback=False):
        """Restores state_dict(). ``rollback=True`` after a rollback: only what describes the
        weights (scaler, clipper, detector windows), not the budgets spent."""
        self._core.load_state_dict(json.dumps(state), bool(rollback))

    @property
    def config_yaml(self):
        """The effective configuration (what config.yaml holds)."""
        return self._core.config_yaml

    @property
    def layer_names(self):
        """The layer groups of the per-layer norms (metrics' layer_grad_norms)."""
        return list(self._core.layer_names)

    @property
    def param_names(self):
        return list(self._core.param_names)

    @property
    def run_dir(self):
        return self._core.run_dir or None

    @property
    def metrics_path(self):
        """<run_dir>/metrics.jsonl on rank 0, else None."""
        return self._core.metrics_path or None
