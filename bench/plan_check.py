#!/usr/bin/python3
"""`gradguard plan`'s memory estimate against the measured peak of real runs on this CPU.

For each layout (precision, sharding, offload, LoRA, activation checkpointing, sequence and
micro-batch) it asks `gradguard plan --cpu --json` for the peak per rank, runs the same
configuration with `gradguard train` (its ranks started by hand, as torchrun would) and
takes each process's peak RSS (ru_maxrss from wait4). A CPU process also holds the LibTorch
runtime, thread pools and the token data, which the plan does not model: that baseline is
measured once as the peak RSS of the same run on a model of negligible size, and added to
the estimate. The table gives the error of estimate + baseline against the measured peak,
and of the estimate alone against the measured peak less the baseline (the stricter
reading: the part the plan claims to predict).

  bench/plan_check.py                 # every layout, ~3 minutes on 2 cores
  bench/plan_check.py --json out.json
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from activation_memory import free_port  # noqa: E402

# The 30M model of bench/activation_memory.py.
MODEL = ["model.hidden_size=512", "model.intermediate_size=1536", "model.num_layers=10", "model.num_heads=8",
         "model.num_kv_heads=4", "model.max_seq_len=1024"]
TINY = ["model.hidden_size=16", "model.intermediate_size=32", "model.num_layers=1", "model.num_heads=2",
        "model.num_kv_heads=1"]

# name, ranks, settings
LAYOUTS = [
    ("fp32, seq 256 x micro 4", 1, ["data.seq_len=256", "batch.micro_batch=4"]),
    ("fp32, activation checkpointing", 1, ["data.seq_len=256", "batch.micro_batch=4",
                                           "model.activation_checkpointing=true"]),
    ("fp32, seq 512 x micro 2", 1, ["data.seq_len=512", "batch.micro_batch=2"]),
    ("LoRA r8 on q_proj, v_proj", 1, ["data.seq_len=256", "batch.micro_batch=4", "lora.rank=8"]),
    ("bf16 weights + fp32 masters", 1, ["data.seq_len=256", "batch.micro_batch=4", "amp.dtype=bf16",
                                        "memory.weights_dtype=bf16"]),
    ("fp32, optimizer offload", 1, ["data.seq_len=256", "batch.micro_batch=4", "memory.offload_optimizer=true"]),
    ("2 ranks, replicated", 2, ["data.seq_len=128", "batch.micro_batch=2"]),
    ("2 ranks, ZeRO-1", 2, ["data.seq_len=128", "batch.micro_batch=2", "memory.zero_stage=1"]),
    ("2 ranks, ZeRO-2", 2, ["data.seq_len=128", "batch.micro_batch=2", "memory.zero_stage=2", "dist.bucket_mb=4"]),
]

COMMON = ["batch.accum_steps=1", "schedule.total_steps=3", "schedule.warmup_steps=1", "data.val_path=\"\"",
          "checkpoint.every=0", "log.progress=quiet", "log.report=false", "log.tensorboard=false",
          "telemetry.enabled=false", "guard.noise_scale.every=0", "run.overwrite=true"]


def sets_args(sets):
    out = []
    for s in sets:
        out += ["--set", s]
    return out


def measure(exe, ranks, sets, tmp, name):
    """Peak RSS (MiB) of the largest rank of one training run."""
    argv = [exe, "train"] + sets_args(COMMON + sets + ["run.dir=%s" % tmp, "run.name=%s" % name])
    port = free_port()
    procs = []
    for r in range(ranks):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(ranks), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(ranks),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)) if ranks > 1 else dict(os.environ)
        out = tempfile.TemporaryFile()
        procs.append((subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env), out))
    peak = 0.0
    for p, out in procs:
        _, status, usage = os.wait4(p.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            out.seek(0)
            sys.exit("plan_check.py: %s failed:\n%s" % (name, out.read().decode(errors="replace")[-2000:]))
        peak = max(peak, usage.ru_maxrss / 1024.0)
    return peak


def planned(exe, ranks, sets):
    argv = [exe, "plan", "--cpu", "--json", "--gpus", str(ranks), "--memory", "1000"] + sets_args(COMMON + sets)
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("plan_check.py: plan failed: %s" % out.stderr)
    return json.loads(out.stdout)["estimate"]["total"] / 2**20


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gradguard", default=os.path.join(ROOT, "build", "gradguard"))
    p.add_argument("--json", help="also write the results here")
    a = p.parse_args()
    t0 = time.time()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        baseline = {}
        for ranks in sorted({r for _, r, _ in LAYOUTS}):
            baseline[ranks] = measure(a.gradguard, ranks, TINY + ["data.seq_len=16", "batch.micro_batch=2"], tmp,
                                      "baseline%d" % ranks)
            print("baseline (%d rank%s): %.0f MiB" % (ranks, "s" if ranks > 1 else "", baseline[ranks]),
                  file=sys.stderr, flush=True)
        for name, ranks, sets in LAYOUTS:
            est = planned(a.gradguard, ranks, MODEL + sets)
            got = measure(a.gradguard, ranks, MODEL + sets, tmp, "run")
            rows.append({"layout": name, "ranks": ranks, "estimate_mib": est, "baseline_mib": baseline[ranks],
                         "measured_mib": got, "error_total": (est + baseline[ranks]) / got - 1,
                         "error_model": est / (got - baseline[ranks]) - 1})
            print("%s: plan %.0f + %.0f MiB, measured %.0f MiB" % (name, est, baseline[ranks], got), file=sys.stderr,
                  flush=True)
    print("30M-parameter model (10 layers x 512 wide), %.0f s in all" % (time.time() - t0))
    print("| layout | ranks | plan MiB | + runtime MiB | measured peak MiB | error (total) | error (model part) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print("| %s | %d | %.0f | %.0f | %.0f | %+.1f%% | %+.1f%% |" % (
            r["layout"], r["ranks"], r["estimate_mib"], r["baseline_mib"], r["measured_mib"],
            100 * r["error_total"], 100 * r["error_model"]))
    worst = max(abs(r["error_total"]) for r in rows)
    worst_model = max(abs(r["error_model"]) for r in rows)
    print("largest error: %.1f%% of the peak (%.1f%% of the model part)" % (100 * worst, 100 * worst_model))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
