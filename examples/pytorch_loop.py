#!/usr/bin/python3
"""A plain PyTorch training loop with gradguard's guard dropped in.

The loop is ordinary PyTorch: its own small causal Transformer language model, its own
data (a synthetic token stream with learnable structure, or an llm.c token file), AdamW
with weight decay on matrices only, linear warmup then cosine decay, gradient
accumulation, and DistributedDataParallel on Gloo for 2 processes (spawned here, or
started by torchrun). The lines marked `# guard` are all gradguard adds:

    guard = gradguard.Guard(model, optimizer, run_dir=..., config=...)   # guard
    lr = lr_at(step) * guard.lr_factor(step)                             # guard
    (loss * guard.loss_scale).backward()                                 # guard
    out = guard.step(step, loss, micro_losses, lr=lr, batch=batch)       # guard
    if out.applied: optimizer.step()                                     # guard
    if out.rollback: restore the last checkpoint                         # guard
    if out.halt: exit 3                                                  # guard

Faults can be injected to watch the guard work: --inject-inf STEP puts an inf into one
gradient of rank --inject-rank during the last backward (DDP's all-reduce carries it to
every rank, and every rank skips the step); --inject-spike STEP replaces that rank's
batch with uniform random tokens (a loss spike: a snapshot with its diagnosis is
written under RUN_DIR/snapshots/). `gradguard report RUN_DIR` draws the run.

    /usr/bin/python3 examples/pytorch_loop.py --nproc 2 --steps 60 --run-dir runs/py-demo --inject-spike 40
"""
import argparse
import copy
import json
import math
import os
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import gradguard


# ---- the model: a small causal Transformer of the loop's own -----------------------------
class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x, mask):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab, width, layers, heads, context):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.randn(context, width) * 0.02)
        self.blocks = nn.ModuleList([Block(width, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens):
        t = tokens.shape[1]
        mask = torch.ones(t, t, dtype=torch.bool, device=tokens.device).triu(1)
        x = self.embed(tokens) + self.pos[:t]
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))


# ---- the data ----------------------------------------------------------------------------
def synthetic_tokens(vocab, length, seed):
    """A token stream a small model can learn: each token has two likely successors."""
    rng = np.random.default_rng(seed)
    successors = rng.integers(0, vocab, size=(vocab, 2))
    out = np.empty(length, dtype=np.int64)
    out[0] = 0
    choice = rng.random(length) < 0.8
    noise = rng.integers(0, vocab, size=length)
    for i in range(1, length):
        out[i] = successors[out[i - 1], 0 if choice[i] else 1] if rng.random() < 0.95 else noise[i]
    return out


def file_tokens(path):
    header = np.fromfile(path, dtype=np.int32, count=256)
    if header.size < 256 or header[0] != 20240520:
        sys.exit("pytorch_loop.py: %s is not an llm.c token file" % path)
    return np.memmap(path, dtype=np.uint16, mode="r", offset=1024, shape=(int(header[2]),))


def micro_batch(tokens, step, m, rank, a):
    """Rows k = ((step * accum + m) * world + rank) * micro + b: sample k is tokens[k*T : k*T+T+1]."""
    samples = (len(tokens) - 1) // a.seq
    first = ((step * a.accum + m) * a.world + rank) * a.micro
    rows = [tokens[((first + b) % samples) * a.seq:][:a.seq + 1] for b in range(a.micro)]
    window = torch.from_numpy(np.stack(rows).astype(np.int64))
    return window[:, :-1], window[:, 1:]


# ---- one process ---------------------------------------------------------------------------
def train(rank, a):
    if a.world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=a.world)
    torch.set_num_threads(a.threads or max(1, (os.cpu_count() or 1) // a.world))
    torch.manual_seed(a.seed)
    tokens = file_tokens(a.data) if a.data else synthetic_tokens(a.vocab, 200_000, a.seed)
    vocab = a.vocab if not a.data else 256
    model = TinyLM(vocab, a.width, a.layers, a.heads, a.seq)
    if a.world > 1:
        model = DDP(model)
        _ALIVE_UNTIL_EXIT.append(model)  # see _exit_without_teardown
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=a.lr, betas=(0.9, 0.95), eps=1e-8)

    def lr_at(step):
        if step < a.warmup:
            return a.lr * (step + 1) / a.warmup
        t = min(1.0, (step - a.warmup) / max(1, a.steps - a.warmup))
        return a.min_lr + 0.5 * (a.lr - a.min_lr) * (1 + math.cos(math.pi * t))

    checkpoint = None  # the last good state, kept in memory: (step, model, optimizer, guard)
    global_batch = a.micro * a.accum * a.world
    guard = gradguard.Guard(model, optimizer, run_dir=a.run_dir, config=dict(kv.split("=", 1) for kv in a.set),  # guard
                            warmup_steps=a.warmup, peak_lr=a.lr, global_batch=global_batch,
                            tokens_per_step=global_batch * a.seq,
                            rollback_available=lambda: checkpoint is not None,
                            count_host_reads=a.count_host_reads)
    model.train()
    data_offset = 0  # steps of data a rollback skips
    step = 0
    while step < a.steps:
        lr = lr_at(step) * guard.lr_factor(step)  # guard
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        spike = step == a.inject_spike and a.inject_rank in (-1, rank)
        inf = step == a.inject_inf and a.inject_rank in (-1, rank)
        losses, inputs_all, targets_all = [], [], []
        for m in range(a.accum):
            inputs, targets = micro_batch(tokens, step + data_offset, m, rank, a)
            if spike:
                g = torch.Generator().manual_seed(a.seed * 1000003 + step)
                window = torch.randint(0, vocab, (a.micro, a.seq + 1), generator=g)
                inputs, targets = window[:, :-1], window[:, 1:]
            last = m + 1 == a.accum
            hook = None
            if inf and last:  # before the all-reduce: DDP carries the inf to every rank
                first = next(model.parameters())
                hook = first.register_hook(lambda grad: grad.index_fill(0, torch.tensor([0]), float("inf")))
            with model.no_sync() if a.world > 1 and not last else _nothing():
                logits = model(inputs)
                loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
                (loss / a.accum * guard.loss_scale).backward()  # guard
            if hook is not None:
                hook.remove()
            if m == 0 and a.accum > 1 and guard.noise_due(step):
                guard.sample_noise(share=1.0 / (a.accum * a.world), micro_batch=a.micro)
            losses.append(loss.detach())
            inputs_all.append(inputs)
            targets_all.append(targets)
        mean_loss = torch.stack(losses).mean()
        out = guard.step(step, mean_loss, losses, lr=lr, batch=(torch.stack(inputs_all), torch.stack(targets_all)),  # guard
                         injected="nonfinite_gradients" if inf else "spike_batch" if spike else None)
        if out.applied:  # guard
            optimizer.step()
        if a.json:
            _emit(json.dumps({"rank": rank, "step": step, "loss": _num(out.loss), "grad_norm": _num(out.grad_norm),
                              "lr": out.lr, "applied": out.applied, "action": out.action,
                              "anomalies": [x.kind for x in out.anomalies], "snapshot": out.snapshot_dir,
                              "host_reads": out.host_reads}))
        elif rank == 0 and (step % 10 == 0 or out.anomalies or not out.applied):
            print("step %4d | loss %.4f | grad_norm %.3f | lr %.2e%s" % (
                step, out.loss, out.grad_norm, lr,
                "" if out.action is None else " | %s: %s -> %s" % (
                    out.anomalies[0].kind, out.anomalies[0].message, out.action)), flush=True)
        if out.halt:  # guard
            print("halted: %s" % out.halt_message, file=sys.stderr, flush=True)
            return gradguard.EXIT_HALTED
        if out.rollback:  # guard: restore the last good state and skip the data that led here
            to, model_state, optim_state, guard_state = checkpoint
            _unwrapped(model).load_state_dict(model_state)
            optimizer.load_state_dict(optim_state)
            guard.load_state_dict(guard_state, rollback=True)
            data_offset += step + 1 - to
            guard.log_rollback(step, to)
            step = to
            continue
        step += 1
        if a.checkpoint_every > 0 and step % a.checkpoint_every == 0:
            checkpoint = (step, copy.deepcopy(_unwrapped(model).state_dict()),
                          copy.deepcopy(optimizer.state_dict()), guard.state_dict())
    if rank == 0 and a.run_dir:
        print("run directory: %s (draw it: build/gradguard report %s)" % (a.run_dir, a.run_dir), flush=True)
    del guard  # closes its files (metrics.jsonl is flushed line by line, TensorBoard's events here)
    if a.world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _unwrapped(model):
    return model.module if isinstance(model, DDP) else model


def _emit(line):
    """One line in one write, so the lines of two processes sharing stdout do not mix."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _num(x):
    return x if math.isfinite(x) else None


# DDP models of this process, kept referenced until os._exit below.
_ALIVE_UNTIL_EXIT = []


def _exit_without_teardown(code):
    """Ends a data-parallel process once its work is done and its files are closed.

    PyTorch 1.13 can deadlock freeing DDP's reducer, whether when train() returns or at
    interpreter exit: the Gloo process group's destructor waits for its worker threads
    while holding the GIL, and a worker waits for the GIL to free a tensor it was the
    last to hold (seen about once in fifteen 2-rank runs). So the DDP model is never
    freed: it stays referenced until the process ends here, without teardown.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _spawned(rank, a):
    _exit_without_teardown(train(rank, a))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=2, help="processes to spawn (DDP on Gloo when > 1)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--micro", type=int, default=8)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr", type=float, default=3e-4)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--data", default="", help="an llm.c token file (default: synthetic tokens)")
    p.add_argument("--run-dir", default=None, help="metrics, snapshots and config.yaml go here")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a gradguard config override, e.g. clip.strategy=agc (repeatable)")
    p.add_argument("--checkpoint-every", type=int, default=0, help="keep a rollback point every N steps")
    p.add_argument("--inject-inf", type=int, default=-1, metavar="STEP")
    p.add_argument("--inject-spike", type=int, default=-1, metavar="STEP")
    p.add_argument("--inject-rank", type=int, default=0, help="rank the faults hit; -1 = every rank")
    p.add_argument("--threads", type=int, default=0, help="torch threads per process (0 = cores / processes)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--json", action="store_true", help="one JSON line per step and rank")
    p.add_argument("--count-host-reads", action="store_true",
                   help="count each guarded step's device->host reads (the JSON lines' host_reads; slows steps)")
    a = p.parse_args()

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun
        a.world = int(os.environ["WORLD_SIZE"])
        _exit_without_teardown(train(int(os.environ["RANK"]), a))
    a.world = a.nproc
    if a.world == 1:
        sys.exit(train(0, a))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    try:
        torch.multiprocessing.spawn(_spawned, args=(a,), nprocs=a.world)
    except torch.multiprocessing.ProcessExitedException as e:
        sys.exit(e.exit_code if e.exit_code and e.exit_code > 0 else 1)


if __name__ == "__main__":
    main()
