#!/usr/bin/python3
"""Peak memory per rank of data-parallel training with the optimizer state replicated, sharded,
and sharded with the gradients (memory.zero_stage 0, 1, 2), side by side, on this machine.

Starts --ranks Gloo ranks of `gradguard train` by hand (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, as torchrun would), each its own process, so wait4 gives every rank's own
peak RSS (ru_maxrss). The model is the 30M-parameter one of bench/activation_memory.py with
a short sequence, so weights, gradients and AdamW moments (16 bytes per parameter when
replicated) dominate and activations are small. Settings alternate A B A B ... so the
shared machine's noise falls on both. The arithmetic predicts that ZeRO-1 saves
8 (P - S) bytes per rank (the moments other ranks keep, S = ceil(P / W)) plus 4 (P - S)
of AdamW's sqrt(v) temporary (the replicated step makes it for all P), less the
all-gather's buffers ((W + 1) chunks of at most 4 MiB). ZeRO-2 saves on top the whole
gradient buffers, 4 (P - S) bytes, less the buckets in flight (up to 3 of dist.bucket_mb,
set with --bucket-mb for every stage). The losses of stages 0 and 1 must be identical
(sharding moves the state, not the arithmetic); stage 2 sums the same gradients in another
order, so its losses must agree to 1e-5.

  bench/zero_memory.py                   # 2 ranks, 2 rounds
  bench/zero_memory.py --ranks 3 --json out.json
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from activation_memory import (HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, ROOT, free_port, params,  # noqa: E402
                               step_times_and_losses)


def train(exe, stage, a, tmp):
    """One run of --ranks processes; returns (kept step times s, losses, peak RSS MiB per rank)."""
    name = "zero%d" % stage
    sets = ["model.hidden_size=%d" % HIDDEN, "model.intermediate_size=%d" % INTERMEDIATE,
            "model.num_layers=%d" % LAYERS, "model.num_heads=%d" % HEADS, "model.num_kv_heads=%d" % KV_HEADS,
            "data.seq_len=%d" % a.seq, "batch.micro_batch=%d" % a.micro, "batch.accum_steps=1",
            "schedule.total_steps=%d" % a.steps, "schedule.warmup_steps=1", "data.val_path=\"\"",
            "checkpoint.every=0", "log.progress=quiet", "log.report=false", "log.tensorboard=false",
            "telemetry.enabled=false", "guard.noise_scale.every=0", "run.dir=%s" % tmp, "run.name=%s" % name,
            "run.overwrite=true", "memory.zero_stage=%d" % stage, "dist.bucket_mb=%g" % a.bucket_mb]
    argv = [exe, "train"]
    for s in sets:
        argv += ["--set", s]
    port = free_port()
    procs = []
    for r in range(a.ranks):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.ranks), LOCAL_RANK=str(r),
                   LOCAL_WORLD_SIZE=str(a.ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        out = tempfile.TemporaryFile()
        procs.append((subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env), out))
    rss = []
    for p, out in procs:
        _, status, usage = os.wait4(p.pid, 0)
        code = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode(errors="replace")
        if code != 0:
            sys.exit("zero_memory.py: a rank of %s failed (exit %d):\n%s" % (name, code, text[-2000:]))
        rss.append(usage.ru_maxrss / 1024.0)
    times, losses = step_times_and_losses(os.path.join(tmp, name, "metrics.jsonl"), a.skip)
    return times, losses, rss


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--micro", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--skip", type=int, default=1, help="steps dropped at the start of each run")
    p.add_argument("--bucket-mb", type=float, default=4, help="dist.bucket_mb of every run")
    p.add_argument("--gradguard", default=os.path.join(ROOT, "build", "gradguard"))
    p.add_argument("--json", help="also write the results here")
    a = p.parse_args()
    stages = (0, 1, 2)
    runs = {s: ([], [], []) for s in stages}  # stage -> (step times, peak RSS per rank per round, losses)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for stage in stages:
                print("round %d/%d, memory.zero_stage=%d" % (r + 1, a.rounds, stage), file=sys.stderr, flush=True)
                times, losses, rss = train(a.gradguard, stage, a, tmp)
                runs[stage][0].extend(times)
                runs[stage][1].append(rss)
                runs[stage][2].append(losses)
    P = params(HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS)
    tokens = a.seq * a.micro * a.ranks
    med = {s: statistics.median(runs[s][0]) for s in runs}
    peak = {s: statistics.median(max(x) for x in runs[s][1]) for s in runs}  # the largest rank of each run
    print("%d layers x %d wide (%.1fM parameters), %d ranks (Gloo), %d tokens/step (seq %d x micro %d x ranks), "
          "dist.bucket_mb %g, %d rounds x %d kept steps, %.0f s in all" %
          (LAYERS, HIDDEN, P / 1e6, a.ranks, tokens, a.seq, a.micro, a.bucket_mb, a.rounds, a.steps - a.skip,
           time.time() - t0))
    names = {0: "replicated (zero_stage 0)", 1: "optimizer state sharded (zero_stage 1)",
             2: "optimizer state and gradients sharded (zero_stage 2)"}
    print("| layout | median step s | peak RSS MiB per rank (each round: rank 0, 1, ...) |")
    print("|---|---:|---|")
    for s in stages:
        print("| %s | %.3f | %s |" % (names[s], med[s],
                                      "; ".join(", ".join("%.0f" % x for x in rnd) for rnd in runs[s][1])))
    shard = -(-P // a.ranks)
    moments = 8 * (P - shard) / 2**20
    temporary = 4 * (P - shard) / 2**20
    buffers = (a.ranks + 1) * min(shard * 4, 4 << 20) / 2**20
    saved = peak[0] - peak[1]
    print("zero_stage 1, largest rank: %.0f MiB saved (%.1f%% of %.0f MiB); arithmetic: %.0f MiB of moments held "
          "elsewhere + %.0f MiB of sqrt(v) temporary - %.0f MiB of all-gather buffers = %.0f MiB; step time %+.1f%%" %
          (saved, 100 * saved / peak[0], peak[0], moments, temporary, buffers, moments + temporary - buffers,
           100 * (med[1] / med[0] - 1)))
    grads = 4 * (P - shard) / 2**20
    in_flight = 3 * min(a.bucket_mb, 4 * P / 2**20)
    saved2 = peak[1] - peak[2]
    print("zero_stage 2 vs 1, largest rank: %.0f MiB saved (%.1f%% of %.0f MiB; %.1f%% of stage 0's %.0f MiB); "
          "arithmetic: %.0f MiB of gradients held elsewhere - up to %.0f MiB of buckets in flight; step time %+.1f%% "
          "vs stage 1" % (saved2, 100 * saved2 / peak[1], peak[1], 100 * (peak[0] - peak[2]) / peak[0], peak[0], grads,
                          in_flight, 100 * (med[2] / med[1] - 1)))
    same = runs[0][2][0] == runs[1][2][0]
    print("losses stage 0 vs 1: %s" % ("identical" if same else "DIFFER: %s vs %s" % (runs[0][2][0], runs[1][2][0])))
    worst = max(abs(x - y) / abs(x) for x, y in zip(runs[0][2][0], runs[2][2][0]))
    close = worst < 1e-5
    print("losses stage 0 vs 2: largest relative difference %.1e (%s)" % (worst, "within 1e-5" if close else "TOO FAR"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"zero_stage_%d" % s: {"median_step_s": med[s], "peak_rss_mb": runs[s][1],
                                             "losses": runs[s][2]} for s in runs}, f, indent=2)
    if not same or not close:
        sys.exit(1)


if __name__ == "__main__":
    main()
