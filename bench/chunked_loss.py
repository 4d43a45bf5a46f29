#!/usr/bin/python3
"""Chunked linear + cross-entropy (loss.chunk_tokens) against whole logits, side by side.

A small model with Qwen3's vocabulary (151,936), where the logits dominate the step's
memory, trains a few steps with `gradguard train` for each setting, alternating the
settings over rounds on the same machine. For each: the largest peak RSS (wait4's
ru_maxrss, MiB), the median step time (elapsed_s between step lines, the first step left
out) and `gradguard plan --cpu`'s estimate of the peak plus the measured runtime baseline
(a 1-layer, 16-wide model with a vocabulary of 256), and the ratios to whole logits.

  bench/chunked_loss.py                    # 3 rounds, ~4 minutes on 2 cores
  bench/chunked_loss.py --rounds 1 --chunks 0 1024
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plan_check import sets_args  # noqa: E402
MODEL = ["model.vocab_size=151936", "model.hidden_size=128", "model.intermediate_size=384", "model.num_layers=2",
         "model.num_heads=4", "model.num_kv_heads=2", "model.max_seq_len=512"]
TINY = ["model.hidden_size=16", "model.intermediate_size=32", "model.num_layers=1", "model.num_heads=2",
        "model.num_kv_heads=1", "model.vocab_size=256"]
BATCH = ["data.seq_len=256", "batch.micro_batch=4", "batch.accum_steps=1"]
COMMON = ["schedule.total_steps=6", "schedule.warmup_steps=1", "data.val_path=\"\"", "checkpoint.every=0",
          "log.progress=quiet", "log.report=false", "log.tensorboard=false", "telemetry.enabled=false",
          "guard.noise_scale.every=0", "run.overwrite=true", "data.train_path=data/brown/train.bin"]


def run(exe, sets, tmp, name):
    """(peak RSS MiB, median step seconds) of one training run."""
    argv = [exe, "train"] + sets_args(COMMON + sets + ["run.dir=%s" % tmp, "run.name=%s" % name])
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        _, status, usage = os.wait4(p.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            out.seek(0)
            sys.exit("chunked_loss.py: %s failed:\n%s" % (name, out.read().decode(errors="replace")[-2000:]))
    elapsed = []
    with open(os.path.join(tmp, name, "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if "event" not in j and "elapsed_s" in j:
                elapsed.append(j["elapsed_s"])
    steps = [b - a for a, b in zip(elapsed, elapsed[1:])]
    return usage.ru_maxrss / 1024.0, statistics.median(steps) if steps else float("nan")


def planned(exe, sets):
    argv = [exe, "plan", "--cpu", "--json", "--memory", "1000"] + sets_args(COMMON + sets)
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("chunked_loss.py: plan failed: %s" % out.stderr)
    return json.loads(out.stdout)["estimate"]["total"] / 2**20


def cpu_name():
    name = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        text = f.read()
    for line in text.splitlines():
        if line.startswith("model name"):
            name = line.split(":", 1)[1].strip()
            break
    isa = "AVX-512" if " avx512f" in text else ("AVX2" if " avx2" in text else "no AVX2")
    return "%s (%s), %d cores" % (name, isa, os.cpu_count())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gradguard", default=os.path.join(ROOT, "build", "gradguard"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--chunks", type=int, nargs="+", default=[0, 256, 1024])
    a = p.parse_args()
    t0 = time.time()
    peaks = {c: [] for c in a.chunks}
    times = {c: [] for c in a.chunks}
    with tempfile.TemporaryDirectory() as tmp:
        baseline, _ = run(a.gradguard, TINY + BATCH, tmp, "baseline")
        plans = {c: planned(a.gradguard, MODEL + BATCH + ["loss.chunk_tokens=%d" % c]) for c in a.chunks}
        for r in range(a.rounds):
            order = a.chunks if r % 2 == 0 else list(reversed(a.chunks))
            for c in order:
                peak, step = run(a.gradguard, MODEL + BATCH + ["loss.chunk_tokens=%d" % c], tmp, "c%d" % c)
                peaks[c].append(peak)
                times[c].append(step)
                print("round %d, chunk_tokens %d: peak %.0f MiB, step %.3f s" % (r + 1, c, peak, step),
                      file=sys.stderr, flush=True)
    base = a.chunks[0]
    print("%s; %s; %d rounds, %.0f s in all" % (cpu_name(), time.strftime("%Y-%m-%d"), a.rounds, time.time() - t0))
    print("model: 2 layers x 128 wide, vocabulary 151936; seq 256 x micro 4 (1024 tokens per step); "
          "runtime baseline %.0f MiB" % baseline)
    print("| loss.chunk_tokens | peak RSS MiB (max over rounds) | vs %d | median step s | vs %d | plan + baseline MiB "
          "| plan error |" % (base, base))
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for c in a.chunks:
        peak = max(peaks[c])
        step = statistics.median(times[c])
        est = plans[c] + baseline
        print("| %d | %.0f | %.2f | %.3f | %.2f | %.0f | %+.1f%% |" % (
            c, peak, peak / max(peaks[base]), step, step / statistics.median(times[base]), est,
            100 * (est / peak - 1)))


if __name__ == "__main__":
    main()
