#!/usr/bin/python3
"""Peak memory and step time of two settings of one model, side by side, on this machine.

--compare checkpointing (the default): activation checkpointing's memory saved and step time
paid. Runs `gradguard train` on the 30M-parameter model of bench/train_compare.py (10 layers
x 512 wide) with a long sequence so that activations, not weights and optimizer state,
dominate memory, alternating model.activation_checkpointing=false / true, A B A B ...
(interleaved so the shared machine's noise falls on both). The losses of the two settings
must agree: checkpointing recomputes, it does not approximate.

--compare lora: full fine-tuning against LoRA (lora.rank, on --lora-targets) of the same
model from the same start, where the frozen base has no gradients and no optimizer state;
its default sequence is short so that weights, gradients and moments, not activations, are
what differs. The losses differ by design (other parameters train).

Each process is one run; the table reports its peak RSS (ru_maxrss from wait4: the honest
measure on the CPU, where everything lives in process memory) and the median step time
over the kept steps of all rounds (each process drops its first --skip steps: allocator,
thread pools).

  bench/activation_memory.py                         # 2 rounds, seq 512 x micro 4
  bench/activation_memory.py --rounds 3 --seq 1024 --micro 2 --json out.json
  bench/activation_memory.py --compare lora          # seq 64 x micro 4, rank 8 on q_proj,v_proj
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# The "30m" size of bench/train_compare.py: hidden, intermediate, layers, heads, kv heads.
HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS = 512, 1536, 10, 8, 4


def params(h, i, layers, heads, kv):
    head = h // heads
    per_layer = h * h * 2 + 2 * h * kv * head + 3 * h * i + 2 * h
    return 256 * h * 2 + layers * per_layer + h


def setting(on, a):
    """The --set for the second (on) or first setting of the comparison."""
    if a.compare == "lora":
        return ["lora.rank=%d" % (a.lora_rank if on else 0), "lora.targets=[%s]" % a.lora_targets]
    return ["model.activation_checkpointing=%s" % ("true" if on else "false")]


def train(exe, on, a, tmp):
    """One `gradguard train` process; returns (kept step times s, losses, peak RSS MiB)."""
    name = "%s-%s" % (a.compare, "on" if on else "off")
    sets = ["model.hidden_size=%d" % HIDDEN, "model.intermediate_size=%d" % INTERMEDIATE,
            "model.num_layers=%d" % LAYERS, "model.num_heads=%d" % HEADS, "model.num_kv_heads=%d" % KV_HEADS,
            "model.max_seq_len=%d" % max(1024, a.seq), "data.seq_len=%d" % a.seq,
            "batch.micro_batch=%d" % a.micro, "batch.accum_steps=%d" % a.accum,
            "schedule.total_steps=%d" % a.steps, "schedule.warmup_steps=1",
            "data.val_path=\"\"", "checkpoint.every=0", "log.progress=quiet", "log.report=false",
            "log.tensorboard=false", "guard.enabled=false", "telemetry.enabled=false", "guard.noise_scale.every=0",
            "run.dir=%s" % tmp, "run.name=%s" % name, "run.overwrite=true", "run.threads=%d" % a.threads] + setting(on, a)
    argv = [exe, "train"]
    for s in sets:
        argv += ["--set", s]
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        _, status, usage = os.wait4(p.pid, 0)
        code = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode(errors="replace")
    if code != 0:
        sys.exit("activation_memory.py: %s failed (exit %d):\n%s" % (exe, code, text[-2000:]))
    times, losses = step_times_and_losses(os.path.join(tmp, name, "metrics.jsonl"), a.skip)
    return times, losses, usage.ru_maxrss / 1024.0


def step_times_and_losses(metrics_path, skip):
    """Step seconds (steps >= skip) and every step's loss from a run's metrics.jsonl."""
    times, losses = [], []
    with open(metrics_path) as f:
        for line in f:
            j = json.loads(line)
            if "loss" in j and "event" not in j:
                losses.append(j["loss"])
                if j["step"] >= skip:
                    times.append(j["tokens"] / j["tokens_per_s"])
    return times, losses


def free_port():
    """A TCP port free on this host right now, for a rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--compare", choices=["checkpointing", "lora"], default="checkpointing")
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--lora-targets", default="q_proj,v_proj")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seq", type=int, help="default: 512 (checkpointing), 64 (lora)")
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--skip", type=int, default=1, help="steps dropped at the start of each process")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--gradguard", default=os.path.join(ROOT, "build", "gradguard"))
    p.add_argument("--json", help="also write the results here")
    a = p.parse_args()
    if a.seq is None:
        a.seq = 64 if a.compare == "lora" else 512
    label = {"checkpointing": ("model.activation_checkpointing", "false", "true"),
             "lora": ("fine-tuning", "full", "LoRA rank %d on %s" % (a.lora_rank, a.lora_targets))}[a.compare]
    runs = {False: ([], [], []), True: ([], [], [])}  # on -> (step times, peak RSS per process, losses)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for on in (False, True):
                print("round %d/%d, %s" % (r + 1, a.rounds, label[2 if on else 1]), file=sys.stderr, flush=True)
                times, losses, rss = train(a.gradguard, on, a, tmp)
                runs[on][0].extend(times)
                runs[on][1].append(rss)
                runs[on][2].append(losses)
    tokens = a.seq * a.micro * a.accum
    med = {on: statistics.median(runs[on][0]) for on in runs}
    peak = {on: statistics.median(runs[on][1]) for on in runs}
    print("%d layers x %d wide (%.1fM parameters), %d tokens/step (seq %d x micro %d x accum %d), %d threads, "
          "%d rounds x %d kept steps, %.0f s in all" % (LAYERS, HIDDEN, params(HIDDEN, INTERMEDIATE, LAYERS, HEADS,
                                                                                 KV_HEADS) / 1e6, tokens, a.seq,
                                                       a.micro, a.accum, a.threads, a.rounds, a.steps - a.skip,
                                                       time.time() - t0))
    print("| %s | median step s | tokens/s | peak RSS MiB (each process) |" % label[0])
    print("|---|---:|---:|---:|")
    for on in (False, True):
        print("| %s | %.3f | %.0f | %s |" % (label[2 if on else 1], med[on], tokens / med[on],
                                             ", ".join("%.0f" % x for x in runs[on][1])))
    saved = peak[False] - peak[True]
    print("peak RSS: %.0f MiB saved (%.1f%% of %.0f MiB); step time: %+.1f%%" %
          (saved, 100 * saved / peak[False], peak[False], 100 * (med[True] / med[False] - 1)))
    same = all(x == y for x, y in zip(runs[False][2][0], runs[True][2][0]))
    diff = max(abs(x - y) for x, y in zip(runs[False][2][0], runs[True][2][0]))
    if a.compare == "checkpointing":
        print("losses off vs on: %s (max |diff| %.2e)" % ("identical" if same else "differ", diff))
    else:
        print("losses: full %s, LoRA %s (first step equal: %s)" % (
            " ".join("%.4f" % x for x in runs[False][2][0]), " ".join("%.4f" % x for x in runs[True][2][0]),
            runs[False][2][0][0] == runs[True][2][0][0]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({("on" if on else "off"): {"median_step_s": med[on], "tokens_per_s": tokens / med[on],
                                                 "peak_rss_mb": runs[on][1], "step_times_s": runs[on][0],
                                                 "losses": runs[on][2]} for on in runs}, f, indent=2)


if __name__ == "__main__":
    main()
