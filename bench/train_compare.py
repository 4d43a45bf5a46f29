#!/usr/bin/python3
"""Side by side: gradguard's training step versus PyTorch's Python loop on this CPU.

For each model size, runs interleaved rounds of three processes, A B C A B C ...:
  A  gradguard, guard off  (guard.enabled=false, no telemetry, no noise scale, no
     TensorBoard; metrics.jsonl only)
  B  bench/python_loop.py  (python3-torch: the same Llama, AdamW, clip_grad_norm_,
     warmup + cosine, foreach AdamW) with its two sane thread splits, both run:
       B1 the threads in OpenBLAS's pool (OPENBLAS_NUM_THREADS=cores, torch threads 1)
       B2 the threads in ATen's pool (torch.set_num_threads(cores), OPENBLAS_NUM_THREADS=1)
     "vs python" compares against the faster of the two, so the reference always has
     its best setting (both pools at full width oversubscribe the cores and are slower
     than either; docs/performance.md)
  C  gradguard, guard fully on (the defaults: fused statistics and per-layer norms,
     anomaly detection, noise scale, telemetry sampler, metrics and TensorBoard)
Each process drops its first --skip steps (warm-up: allocator, thread pools, caches);
the table reports the median step time over all kept steps of all rounds, tokens/s,
each process's peak RSS (wait4), and the ratios. gradguard runs with
run.thread_pool=--pool (default auto: OpenBLAS's pool where the BLAS is OpenBLAS). Interleaving spreads the machine's
noise over all three instead of favouring whichever ran in a quiet minute.

  bench/train_compare.py                       # both sizes, 3 rounds
  bench/train_compare.py --sizes tiny --rounds 5 --json out.json
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

# name: (hidden, intermediate, layers, heads, kv_heads, seq, micro, accum, steps)
SIZES = {
    "tiny": (128, 384, 4, 4, 2, 64, 32, 4, 14),      # the default model: 0.85M parameters
    "30m": (512, 1536, 10, 8, 4, 128, 8, 2, 6),      # 31.7M parameters
}


def params(h, i, layers, heads, kv):
    head = h // heads
    per_layer = h * h * 2 + 2 * h * kv * head + 3 * h * i + 2 * h
    return 256 * h * 2 + layers * per_layer + h


def run(args, env=None):
    """Runs a process; returns (stdout, peak RSS MiB, wall s)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode(errors="replace")
    if p.returncode != 0:
        sys.exit("train_compare.py: %s failed (exit %d):\n%s" % (args[0], p.returncode, text[-2000:]))
    return text, usage.ru_maxrss / 1024.0, time.perf_counter() - t0


def gradguard(exe, size, guard, skip, tmp, threads, pool):
    h, i, layers, heads, kv, seq, micro, accum, steps = SIZES[size]
    sets = ["model.hidden_size=%d" % h, "model.intermediate_size=%d" % i, "model.num_layers=%d" % layers,
            "model.num_heads=%d" % heads, "model.num_kv_heads=%d" % kv, "data.seq_len=%d" % seq,
            "batch.micro_batch=%d" % micro, "batch.accum_steps=%d" % accum, "schedule.total_steps=%d" % steps,
            "schedule.warmup_steps=2",
            "data.val_path=\"\"", "checkpoint.every=0", "log.progress=quiet", "log.report=false",
            "run.dir=%s" % tmp, "run.name=%s" % ("on" if guard else "off"), "run.overwrite=true",
            "run.threads=%d" % threads, "run.thread_pool=%s" % pool, "optim.weight_decay=0.1"]
    if not guard:
        sets += ["guard.enabled=false", "telemetry.enabled=false", "guard.noise_scale.every=0",
                 "log.tensorboard=false"]
    argv = [exe, "train"]
    for s in sets:
        argv += ["--set", s]
    _, rss, _ = run(argv)
    times = []
    with open(os.path.join(tmp, "on" if guard else "off", "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if "loss" in j and "event" not in j and j["step"] >= skip:
                times.append(j["tokens"] / j["tokens_per_s"])
    return times, rss


def python_loop(size, skip, data, threads, pool):
    h, i, layers, heads, kv, seq, micro, accum, steps = SIZES[size]
    argv = ["/usr/bin/python3", os.path.join(ROOT, "bench", "python_loop.py"), "--data", data,
            "--hidden", str(h), "--intermediate", str(i), "--layers", str(layers), "--heads", str(heads),
            "--kv-heads", str(kv), "--seq", str(seq), "--micro", str(micro), "--accum", str(accum),
            "--steps", str(steps), "--total-steps", str(steps), "--warmup", "2", "--threads", str(1 if pool == "blas" else threads), "--foreach"]
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads if pool == "blas" else 1))
    text, rss, _ = run(argv, env)
    times = [j["step_s"] for j in map(json.loads, text.splitlines()) if "step_s" in j and j["step"] >= skip]
    return times, rss


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="tiny,30m")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--skip", type=int, default=2, help="steps dropped at the start of each process")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--pool", default="auto", choices=["auto", "aten", "blas"], help="gradguard's run.thread_pool")
    p.add_argument("--data", default=os.path.join(ROOT, "data", "brown", "train.bin"))
    p.add_argument("--gradguard", default=os.path.join(ROOT, "build", "gradguard"))
    p.add_argument("--json", help="also write the results here")
    a = p.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in a.sizes.split(","):
            if size not in SIZES:
                sys.exit("train_compare.py: unknown size %r (known: %s)" % (size, ", ".join(SIZES)))
            h, i, layers, heads, kv, seq, micro, accum, steps = SIZES[size]
            tokens = seq * micro * accum
            runs = {"A gradguard, guard off": ([], []), "B1 python loop, threads in BLAS": ([], []),
                    "B2 python loop, threads in ATen": ([], []), "C gradguard, guard on": ([], [])}
            for r in range(a.rounds):
                print("%s: round %d/%d" % (size, r + 1, a.rounds), file=sys.stderr, flush=True)
                for name in runs:
                    if name.startswith("A"):
                        t, rss = gradguard(a.gradguard, size, False, a.skip, tmp, a.threads, a.pool)
                    elif name.startswith("B"):
                        t, rss = python_loop(size, a.skip, a.data, a.threads, "blas" if name.startswith("B1") else "aten")
                    else:
                        t, rss = gradguard(a.gradguard, size, True, a.skip, tmp, a.threads, a.pool)
                    runs[name][0].extend(t)
                    runs[name][1].append(rss)
            med = {n: statistics.median(t) for n, (t, _) in runs.items()}
            py = min(med[n] for n in runs if n.startswith("B"))  # the reference at its best split
            print("\n%s: %d layers x %d wide (%.1fM parameters), %d tokens/step (micro %d x accum %d x seq %d), "
                  "%d threads (gradguard run.thread_pool=%s), %d rounds x %d kept steps" % (size, layers, h, params(h, i, layers, heads, kv) / 1e6,
                                                            tokens, micro, accum, seq, a.threads, a.pool, a.rounds,
                                                            steps - a.skip))
            print("| run | median step s | tokens/s | vs python (best B) | peak RSS MiB |")
            print("|---|---:|---:|---:|---:|")
            for n, (t, rss) in runs.items():
                print("| %s | %.4f | %.0f | %.3fx | %.0f |" % (n, med[n], tokens / med[n], py / med[n], max(rss)))
            off, on = med["A gradguard, guard off"], med["C gradguard, guard on"]
            print("guard on vs off: %+.2f%% step time" % (100 * (on / off - 1)))
            results[size] = {n: {"median_step_s": med[n], "tokens_per_s": tokens / med[n], "vs_python": py / med[n],
                                 "peak_rss_mb": max(rss), "steps": len(t)} for n, (t, rss) in runs.items()}
            results[size]["guard_overhead"] = on / off - 1
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
