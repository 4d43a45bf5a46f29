"""A loss spike in a guarded PyTorch loop (examples/pytorch_loop.py, one process): the
batch of one step is replaced by uniform random tokens; the guard finds the spike,
skips the update and writes a snapshot directory with the evidence and its diagnosis
(diagnosis.md, diagnosis.json), and `gradguard report` draws the run directory.
"""
import json
import os
import subprocess
import tempfile
import unittest

import gg_test_util as util

STEPS, SPIKE_AT = 26, 22


class Spike(unittest.TestCase):
    def test_spike_writes_snapshot_with_diagnosis(self):
        with tempfile.TemporaryDirectory(prefix="gg-spike-") as tmp:
            run_dir = os.path.join(tmp, "run")
            cmd = [util.PYTHON, util.EXAMPLE, "--nproc", "1", "--steps", str(STEPS), "--inject-spike", str(SPIKE_AT),
                   "--threads", "2", "--micro", "4", "--seq", "16", "--width", "32", "--json", "--run-dir", run_dir]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=util.child_env())
            self.assertEqual(proc.returncode, 0, "example failed:\n%s\n%s" % (proc.stdout, proc.stderr))
            lines = {j["step"]: j for j in (json.loads(s) for s in proc.stdout.splitlines() if s.startswith("{"))}
            spike = lines[SPIKE_AT]
            self.assertIn("loss_spike", spike["anomalies"], spike)
            self.assertFalse(spike["applied"])
            self.assertEqual(spike["action"], "skip")
            snap = spike["snapshot"]
            self.assertIsNotNone(snap)
            self.assertTrue(os.path.basename(snap).startswith("step-%07d-loss_spike" % SPIKE_AT), snap)
            for name in ("diagnosis.md", "diagnosis.json", "state.json", "metrics.jsonl", "config.yaml",
                         "gradients.safetensors", "optimizer.safetensors", "batch.safetensors",
                         os.path.join("model", "model.safetensors")):
                self.assertTrue(os.path.isfile(os.path.join(snap, name)), "snapshot lacks " + name)
            with open(os.path.join(snap, "diagnosis.json")) as f:
                diagnosis = json.load(f)
            self.assertEqual(diagnosis["step"], SPIKE_AT)
            with open(os.path.join(snap, "diagnosis.md")) as f:
                self.assertIn("loss_spike", f.read())
            with open(os.path.join(snap, "state.json")) as f:
                state = json.load(f)
            self.assertEqual(state["injected"], "spike_batch")
            self.assertEqual(state["loop"], "python")
            recent = util.read_jsonl(os.path.join(snap, "metrics.jsonl"))
            self.assertEqual([j["step"] for j in recent if "event" not in j], list(range(SPIKE_AT)))  # the steps before

            # The run directory is one `gradguard report` reads.
            report = subprocess.run([util.CLI, "report", run_dir], capture_output=True, text=True, timeout=120)
            self.assertEqual(report.returncode, 0, report.stdout + report.stderr)
            self.assertTrue(os.path.isfile(os.path.join(run_dir, "report.html")))


if __name__ == "__main__":
    unittest.main()
