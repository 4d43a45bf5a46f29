"""Parity: a PyTorch loop guarded by the Python module trains exactly as `gradguard train`.

Both start from the same tiny random Llama (written here as a Hugging Face directory:
config.json + model.safetensors, read by `gradguard train --set model.init_from=DIR`;
the Python side is tests/golden/llama_reference.py, the model the C++ one is checked
against), read the same token file in the same order (docs/design.md "Data order"),
and use the same settings: fp32, AdamW with weight decay on the weight matrices only (not
norms, biases or the token embedding),
warmup + cosine to min_lr, global clipping at 1.0, the loss as the token mean of the
global batch. Per step, loss, grad_norm and lr agree to 1e-5 relative over 30 steps,
and every guarded step makes exactly one device->host read. A second pair adds PaLM's
z-loss, written here in PyTorch, against `loss.z_loss`.
"""
import math
import os
import subprocess
import tempfile
import unittest

import torch
import torch.nn.functional as F

import gg_test_util as util
import gradguard
from llama_reference import LlamaConfig, LlamaForCausalLM

STEPS, WARMUP, LR, MIN_LR = 30, 5, 3e-3, 3e-4
MICRO, ACCUM, SEQ, VOCAB = 4, 2, 16, 64
RTOL = 1e-5

# The settings both runs share, as --set overrides (the CLI) and as the Guard's config.
SHARED = {
    "schedule.total_steps": STEPS,
    "schedule.warmup_steps": WARMUP,
    "schedule.decay": "cosine",
    "schedule.min_lr": MIN_LR,
    "optim.lr": LR,
    "optim.betas": [0.9, 0.95],
    "optim.eps": 1e-8,
    "optim.weight_decay": 0.1,
    "clip.strategy": "global",
    "clip.max_norm": 1.0,
    "amp.dtype": "fp32",
    "data.seq_len": SEQ,
    "batch.micro_batch": MICRO,
    "batch.accum_steps": ACCUM,
    "batch.global_batch": MICRO * ACCUM,
}


def lr_at(step):
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    t = min(1.0, (step - WARMUP) / (STEPS - WARMUP))
    return MIN_LR + 0.5 * (LR - MIN_LR) * (1 + math.cos(math.pi * t))


class Parity(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.set_num_threads(1)
        cls.tmp = tempfile.TemporaryDirectory(prefix="gg-parity-")
        root = cls.tmp.name
        cls.cfg = LlamaConfig(VOCAB, 32, 64, 2, 4, 2, max_position_embeddings=64, rms_norm_eps=1e-5)
        model = LlamaForCausalLM(cls.cfg)
        model.init_weights(torch.Generator().manual_seed(7))
        cls.hf_dir = os.path.join(root, "tiny-llama")
        os.makedirs(cls.hf_dir)
        with open(os.path.join(cls.hf_dir, "config.json"), "w") as f:
            import json
            json.dump(cls.cfg.to_hf_dict(), f)
        util.write_safetensors(os.path.join(cls.hf_dir, "model.safetensors"), list(model.state_dict().items()))
        cls.initial = {k: v.clone() for k, v in model.state_dict().items()}
        # Fewer samples than 30 steps read, so both runs wrap around the end of the data.
        cls.tokens = util.structured_tokens(VOCAB, 3000, seed=3)
        cls.token_file = os.path.join(root, "train.bin")
        util.write_token_file(cls.token_file, cls.tokens)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def run_cli(self, name="cli", z_loss=0.0):
        overrides = dict(SHARED)
        overrides.update({"loss.z_loss": z_loss} if z_loss else {})
        overrides.update({
            "model.init_from": self.hf_dir,
            "data.train_path": self.token_file,
            "data.val_path": "",
            "run.dir": self.tmp.name,
            "run.name": name,
            "run.threads": 1,
            "telemetry.enabled": False,
            "log.tensorboard": False,
            "log.report": False,
        })
        cmd = [util.CLI, "train", "-q"]
        for s in gradguard.config_overrides(overrides):
            cmd += ["--set", s]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        self.assertEqual(proc.returncode, 0, "gradguard train failed:\n%s\n%s" % (proc.stdout, proc.stderr))
        return util.step_lines(os.path.join(self.tmp.name, name, "metrics.jsonl"))

    def run_python(self, name="py", z_loss=0.0):
        model = LlamaForCausalLM(self.cfg)
        model.load_state_dict(self.initial)
        decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed_tokens" not in n]
        no_decay = [p for n, p in model.named_parameters() if p.dim() < 2 or "embed_tokens" in n]
        optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                       {"params": no_decay, "weight_decay": 0.0}],
                                      lr=LR, betas=(0.9, 0.95), eps=1e-8, foreach=False)
        run_dir = os.path.join(self.tmp.name, name)
        config = dict(SHARED, **({"loss.z_loss": z_loss} if z_loss else {}))
        guard = gradguard.Guard(model, optimizer, run_dir=run_dir, config=config, warmup_steps=WARMUP, peak_lr=LR,
                                count_host_reads=True)
        tokens = torch.from_numpy(self.tokens)
        samples = (len(self.tokens) - 1) // SEQ
        total_tokens = MICRO * ACCUM * SEQ
        outcomes = []
        for step in range(STEPS):
            lr = lr_at(step) * guard.lr_factor(step)
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.zero_grad(set_to_none=True)
            loss_sum, z_sum, micro = torch.zeros(()), torch.zeros(()), []
            for m in range(ACCUM):
                first = (step * ACCUM + m) * MICRO
                rows = [tokens[((first + b) % samples) * SEQ:][:SEQ + 1] for b in range(MICRO)]
                window = torch.stack(rows)
                logits = model(window[:, :-1])
                summed = F.cross_entropy(logits.reshape(-1, VOCAB), window[:, 1:].reshape(-1), reduction="sum")
                loss = summed / total_tokens
                objective = loss
                if z_loss:  # PaLM's z-loss: c x log^2 Z per target, the token mean of the global batch
                    z = z_loss * torch.logsumexp(logits.float(), dim=-1).square().sum() / total_tokens
                    objective = loss + z
                    z_sum += z.detach()
                (objective * guard.loss_scale).backward()
                loss_sum += loss.detach()
                micro.append(summed.detach() / window[:, 1:].numel())
            out = guard.step(step, loss_sum, micro, lr=lr, z_loss=z_sum if z_loss else None)
            if out.applied:
                optimizer.step()
            outcomes.append(out)
        return outcomes, util.step_lines(os.path.join(run_dir, "metrics.jsonl"))

    def test_trajectories_match_gradguard_train(self):
        cli = self.run_cli()
        outcomes, py_metrics = self.run_python()
        self.assertEqual(sorted(cli), list(range(STEPS)))
        self.assertEqual(sorted(py_metrics), list(range(STEPS)))
        worst = {"loss": 0.0, "grad_norm": 0.0, "lr": 0.0}
        for step, out in enumerate(outcomes):
            self.assertTrue(out.applied, "step %d was not applied: %r" % (step, out))
            self.assertEqual(out.host_reads, 1, "step %d made %d host reads" % (step, out.host_reads))
            ref = cli[step]
            for key, mine in (("loss", out.loss), ("grad_norm", out.grad_norm), ("lr", out.lr)):
                rel = abs(mine - ref[key]) / abs(ref[key])
                worst[key] = max(worst[key], rel)
                self.assertLess(rel, RTOL, "step %d %s: python %.9g, gradguard train %.9g (rel %.2e)"
                                % (step, key, mine, ref[key], rel))
                # The Python run's own metrics.jsonl says the same as its outcomes.
                self.assertAlmostEqual(py_metrics[step][key], mine, delta=abs(mine) * 1e-12)
            self.assertEqual(py_metrics[step]["skipped"], cli[step]["skipped"])
            self.assertAlmostEqual(out.clip_coef, ref["clip_coef"], delta=RTOL)
        print("\nworst relative difference over %d steps: loss %.2e, grad_norm %.2e, lr %.2e"
              % (STEPS, worst["loss"], worst["grad_norm"], worst["lr"]))

    def test_z_loss_matches_gradguard_train(self):
        # The same loop with PaLM's z-loss written in PyTorch against loss.z_loss in the
        # trainer: the objective changes the trajectory (so loss and grad_norm check the
        # gradient it adds), and the logged term is the same number.
        c = 1e-2
        cli = self.run_cli("cli-z", c)
        outcomes, py_metrics = self.run_python("py-z", c)
        plain = self.run_cli("cli-plain")
        self.assertNotAlmostEqual(cli[STEPS - 1]["loss"], plain[STEPS - 1]["loss"], delta=1e-4)
        for step, out in enumerate(outcomes):
            ref = cli[step]
            for key, mine in (("loss", out.loss), ("grad_norm", out.grad_norm), ("z_loss", out.z_loss)):
                rel = abs(mine - ref[key]) / abs(ref[key])
                self.assertLess(rel, RTOL, "step %d %s: python %.9g, gradguard train %.9g (rel %.2e)"
                                % (step, key, mine, ref[key], rel))
            self.assertAlmostEqual(py_metrics[step]["z_loss"], out.z_loss, delta=abs(out.z_loss) * 1e-6)
            self.assertNotIn("z_loss", plain[step])


if __name__ == "__main__":
    unittest.main()
