#!/usr/bin/env python3
"""Turns the files bench/gpu/run.sh left in its output folder into results.md + results.json.

Reads (each optional: a stage that did not run leaves its file out, and the report says
so): env.txt, stages.tsv, gtest-gpu.json (GoogleTest), parity.json, gpu_step_bf16.json,
gpu_step_fp16.json, torch_eager.json, torch_compile.json, logs/suite.log (ctest).
Standard library only.
"""
import argparse
import json
import os
import re
import sys


def load(out, name):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            text = f.read().strip()
        # A program may have printed progress before its JSON line: take the last object.
        for line in reversed(text.splitlines()):
            line = line.strip()
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except ValueError:
                    break
        return json.loads(text)
    except (OSError, ValueError) as e:
        return {"unreadable": str(e)}


def fmt(x, spec=".3g", none="—"):
    if x is None:
        return none
    if isinstance(x, (int, float)):
        return format(x, spec)
    return str(x)


def gtest_summary(g):
    if not g or "testsuites" not in g:
        return None
    rows = []
    for suite in g["testsuites"]:
        for t in suite.get("testsuite", []):
            if t.get("result") == "SKIPPED" or t.get("status") == "NOTRUN":
                status = "skipped"
            elif t.get("failures"):
                status = "FAILED"
            else:
                status = "passed"
            msg = ""
            if t.get("failures"):
                msg = t["failures"][0].get("failure", "").splitlines()[0:3]
                msg = " / ".join(m.strip() for m in msg)
            elif status == "skipped":
                msg = (t.get("skipped") or [{}])[0].get("message", "") if isinstance(t.get("skipped"), list) else ""
            rows.append({"test": "%s.%s" % (suite["name"], t["name"]), "status": status,
                         "time": t.get("time", ""), "message": msg[:300]})
    return rows


def skip_messages(log_path):
    """{test: message} from GoogleTest's text output (its JSON has no skip message)."""
    if not os.path.exists(log_path):
        return {}
    text = open(log_path, errors="replace").read()
    out = {}
    for m in re.finditer(r"^\[ RUN      \] (\S+)\n(?:.*\n)*?.*: Skipped\n((?:(?!\[).*\n)*?)\[  SKIPPED \] \1", text, re.M):
        out[m.group(1)] = " ".join(m.group(2).split())
    return out


def suite_summary(log_path):
    if not os.path.exists(log_path):
        return None
    text = open(log_path, errors="replace").read()
    m = re.search(r"(\d+)% tests passed, (\d+) tests failed out of (\d+)", text)
    failed = re.findall(r"^\s*\d+ - (\S+) \((Failed|Timeout|SEGFAULT|Subprocess aborted|Not Run|Exception)\)",
                        text, re.M)
    summary = {"finished": bool(m)}
    if m:
        summary.update({"percent_passed": int(m.group(1)), "failed": int(m.group(2)), "total": int(m.group(3))})
    else:
        done = re.findall(r"Test +#\d+: +\S+ \.+\**\s*(Passed|Failed|\*\*\*Failed|Not Run|Skipped)", text)
        summary.update({"seen": len(done), "passed_so_far": sum(1 for d in done if d == "Passed")})
    summary["failures"] = [{"test": t, "kind": k} for t, k in failed]
    return summary


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--command", default="bench/gpu/run.sh")
    p.add_argument("--budget", type=int, default=0)
    p.add_argument("--elapsed", type=int, default=0)
    a = p.parse_args()
    out = a.out

    env = open(os.path.join(out, "env.txt")).read() if os.path.exists(os.path.join(out, "env.txt")) else ""
    stages = []
    if os.path.exists(os.path.join(out, "stages.tsv")):
        lines = open(os.path.join(out, "stages.tsv")).read().splitlines()[1:]
        for line in lines:
            parts = line.split("\t") + [""] * 4
            stages.append({"stage": parts[0], "status": parts[1], "seconds": parts[2], "note": parts[3]})
    gtests = gtest_summary(load(out, "gtest-gpu.json"))
    skips = skip_messages(os.path.join(out, "logs", "gputests.log"))
    for r in gtests or []:
        if r["status"] == "skipped" and not r["message"]:
            r["message"] = skips.get(r["test"], "")[:300]
    parity = load(out, "parity.json")
    steps = {k: load(out, "gpu_step_%s.json" % k) for k in ("bf16", "fp16")}
    torch_runs = {k: load(out, "torch_%s.json" % k) for k in ("eager", "compile")}
    suite = suite_summary(os.path.join(out, "logs", "suite.log"))
    date = re.search(r"^date: (.*)$", env, re.M)
    results = {"date": date.group(1) if date else None, "command": a.command, "budget_s": a.budget,
               "elapsed_s": a.elapsed, "env": env.splitlines(), "stages": stages, "gpu_tests": gtests,
               "parity": parity, "gradguard": steps, "torch": torch_runs, "suite": suite}
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)

    md = []
    md.append("# gradguard on a GPU: results of bench/gpu/run.sh\n")
    md.append("- date: %s" % (results["date"] or "?"))
    md.append("- command: `%s` (from the repository root; %ss of a %ss budget)" % (a.command, a.elapsed, a.budget))
    for line in env.splitlines():
        if line.split(":")[0] in ("commit", "host", "gpu", "torch", "nvcc", "cmake", "deps", "wheel gloo headers"):
            md.append("- %s" % line)
    md.append("\n## Stages\n")
    md.append("| stage | status | seconds | note |\n|---|---|---|---|")
    for s in stages:
        md.append("| %s | %s | %s | %s |" % (s["stage"], s["status"], s["seconds"], s["note"]))

    md.append("\n## GPU test cases (gtest filter `*Device*:*Cuda*:*CUDA*:*Gpu*:*GPU*`)\n")
    if gtests is None:
        md.append("Not run (see the stages table).")
    else:
        n = {k: sum(1 for r in gtests if r["status"] == k) for k in ("passed", "FAILED", "skipped")}
        md.append("%d passed, %d failed, %d skipped\n" % (n["passed"], n["FAILED"], n["skipped"]))
        md.append("| test | status | time | message |\n|---|---|---|---|")
        for r in gtests:
            md.append("| %s | %s | %s | %s |" % (r["test"], r["status"], r["time"], r["message"].replace("|", "/")))

    md.append("\n## Parity: one training step, gradguard vs PyTorch (bench/gpu/parity.py)\n")
    if not parity or "modes" not in parity:
        md.append("Not run (see the stages table).")
    else:
        md.append("torch %s on %s; model %s; batch %s; lr %s; fp16 init scale %s.\n" % (
            parity.get("torch"), parity.get("device"), parity.get("model"), parity.get("batch"), parity.get("lr"),
            parity.get("init_scale")))
        md.append("| mode | ok | loss gg / torch (rel) | grad norm gg / torch (rel) | update rel | sign agreement | tolerances |")
        md.append("|---|---|---|---|---|---|---|")
        for mode, r in parity["modes"].items():
            if "error" in r:
                md.append("| %s | ERROR | %s | | | | |" % (mode, r["error"].splitlines()[0][:200]))
                continue
            tol = parity["tolerances"][mode]
            md.append("| %s | %s | %.6f / %.6f (%.1e) | %.5f / %.5f (%.1e) | %.2e | %.4f | loss %.0e, norm %.0e, update %.2g, sign %.3g |" % (
                mode, "yes" if r["ok"] else "**NO**", r["gradguard"]["loss"], r["torch"]["loss"], r["loss_rel"],
                r["gradguard"]["grad_norm"], r["torch"]["grad_norm"], r["grad_norm_rel"], r["update_rel"],
                r["sign_agreement"], tol["loss"], tol["grad_norm"], tol["update"], tol["sign"]))

    shape = next((x for x in list(steps.values()) + list(torch_runs.values())
                  if x and "model" in x and "batch" in x), None)
    if shape:
        m, b = shape["model"], shape["batch"]
        md.append("\n## Throughput: Llama %d x %d, %d heads (%d K/V), SwiGLU %d, vocab %d, %s parameters; seq %d, "
                  "micro %d x accum %d = %d tokens/step\n" % (
                      m["layers"], m["hidden"], m["heads"], m["kv_heads"], m["intermediate"], m["vocab"],
                      format(m.get("parameters", 0), ","), b["seq"], b["micro"], b["accum"],
                      b.get("tokens_per_step", b["seq"] * b["micro"] * b["accum"])))
    else:
        md.append("\n## Throughput\n")
    rows = []
    for dt, s in steps.items():
        if not s or "unreadable" in s:
            continue
        for variant in ("guarded", "bare"):
            v = s.get(variant)
            if v:
                rows.append(("gradguard %s (%s)" % (variant, dt), v.get("tokens_per_s"), v.get("mfu"),
                             v.get("step_ms_median"), v.get("host_syncs_per_step"), s.get("peak_allocated_mib"), ""))
    for impl, t in torch_runs.items():
        if not t or "unreadable" in t:
            continue
        extra = "compile %ss" % t["compile_s"] if "compile_s" in t else ""
        rows.append(("PyTorch %s (%s)" % (impl, t.get("dtype")), t.get("tokens_per_s"), t.get("mfu"),
                     t.get("step_ms_median"), "1 (loss.item(), not counted)", t.get("peak_allocated_mib"), extra))
    if not rows:
        md.append("Not run (see the stages table).")
    else:
        md.append("| run | tokens/s | MFU | step ms (median, events) | host syncs/step | peak alloc MiB | note |")
        md.append("|---|---|---|---|---|---|---|")
        for r in rows:
            md.append("| %s | %s | %s | %s | %s | %s | %s |" % (r[0], fmt(r[1], ",.0f"), fmt(r[2], ".1%"),
                                                              fmt(r[3], ".1f"), fmt(r[4]), fmt(r[5], ",.0f"), r[6]))
        bf = steps.get("bf16") or {}
        if "guard_overhead_pct" in bf:
            md.append("\nGuard overhead (bf16, guarded vs bare wall time per step): %+.1f%%." % bf["guard_overhead_pct"])
        md.append("\nMFU = tokens/s x (6 N + 12 L d T) / peak, N = all parameters, L layers, d width, T sequence "
                  "length; the attention term counts QK^T and AV forward and backward without halving for the causal "
                  "mask; peak = %s TFLOP/s (dense BF16 of an H100/H200 SXM). The fp16 row uses the same peak. "
                  "tokens/s from the wall time of the timed steps between two device synchronizations; step ms "
                  "is the median of per-step device events." % fmt((bf or {}).get("peak_tflops", 989.0), "g"))

    md.append("\n## Whole test suite (ctest, with the time left)\n")
    if suite is None:
        md.append("Not run (see the stages table).")
    elif suite["finished"]:
        md.append("%d%% passed, %d failed of %d." % (suite["percent_passed"], suite["failed"], suite["total"]))
    else:
        md.append("Cut short by the time budget: %d tests finished, %d passed so far." % (suite["seen"],
                                                                                        suite["passed_so_far"]))
    for f in (suite or {}).get("failures", []):
        md.append("- %s: %s" % (f["test"], f["kind"]))
    md.append("\nRaw files: stages.tsv, env.txt, gtest-gpu.json, parity.json, gpu_step_*.json, torch_*.json, logs/.")
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
