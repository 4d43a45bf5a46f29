"""Data parallelism: 2 ranks on Gloo (examples/pytorch_loop.py, DDP) with an inf injected
into rank 0's gradients at one step. DDP's all-reduce carries it to rank 1; the guard on
both ranks sees non-finite gradients and both skip that step (and only that one), with
the same loss, norm and decision on every step, one device->host read per step (the
all-reduce of the losses inside step() adds none); rank 0 records the skip in
metrics.jsonl.
"""
import json
import os
import subprocess
import tempfile
import unittest

import gg_test_util as util

STEPS, INF_AT = 6, 3


class TwoRanks(unittest.TestCase):
    def test_injected_inf_is_skipped_on_both_ranks(self):
        with tempfile.TemporaryDirectory(prefix="gg-ddp-") as tmp:
            run_dir = os.path.join(tmp, "run")
            cmd = [util.PYTHON, util.EXAMPLE, "--nproc", "2", "--steps", str(STEPS), "--inject-inf", str(INF_AT),
                   "--threads", "1", "--micro", "4", "--seq", "16", "--width", "32", "--json", "--count-host-reads", "--run-dir", run_dir,
                   "--set", "log.tensorboard=false"]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=util.child_env())
            self.assertEqual(proc.returncode, 0, "example failed:\n%s\n%s" % (proc.stdout, proc.stderr))
            lines = [json.loads(s) for s in proc.stdout.splitlines() if s.startswith("{")]
            by_rank = {r: {j["step"]: j for j in lines if j["rank"] == r} for r in (0, 1)}
            for r in (0, 1):
                self.assertEqual(sorted(by_rank[r]), list(range(STEPS)), "rank %d's steps" % r)
            for step in range(STEPS):
                a, b = by_rank[0][step], by_rank[1][step]
                self.assertEqual(a["applied"], step != INF_AT, "rank 0 step %d: %r" % (step, a))
                self.assertEqual(b["applied"], step != INF_AT, "rank 1 step %d: %r" % (step, b))
                self.assertEqual(a["action"], b["action"])
                self.assertEqual(a["anomalies"], b["anomalies"])
                self.assertEqual(a["loss"], b["loss"])  # averaged over the ranks inside step()
                self.assertEqual(a["grad_norm"], b["grad_norm"])
                if step != INF_AT:  # one read per step; the critical one also asks rank 0 about checkpoints
                    self.assertEqual((a["host_reads"], b["host_reads"]), (1, 1), "step %d" % step)
            self.assertEqual(by_rank[1][INF_AT]["action"], "skip")
            self.assertIn("nonfinite", by_rank[1][INF_AT]["anomalies"])
            self.assertIsNone(by_rank[1][INF_AT]["snapshot"])  # rank 0 writes
            self.assertIsNotNone(by_rank[0][INF_AT]["snapshot"])

            metrics = util.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
            skips = [j for j in metrics if j.get("event") == "skip"]
            self.assertEqual([j["step"] for j in skips], [INF_AT])
            steps = util.step_lines(os.path.join(run_dir, "metrics.jsonl"))
            self.assertEqual([s for s in sorted(steps) if steps[s]["skipped"]], [INF_AT])
            self.assertFalse(os.path.exists(os.path.join(run_dir, "metrics.jsonl.rank1")))


if __name__ == "__main__":
    unittest.main()
