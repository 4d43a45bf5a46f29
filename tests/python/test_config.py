"""The Guard's configuration, its errors, and one step's behaviour on a small model.

A bad config key or value raises gradguard.BadInputError (a ValueError) whose message
names the key, as `gradguard train --set` does. A guarded step measures and clips like
torch.nn.utils.clip_grad_norm_, makes one device->host read, skips a step whose
gradients are not finite, and the recovery ladder's decisions reach the loop (moment
resets through the optimizer it was given, halts with a message).
"""
import math
import os
import tempfile
import unittest

import torch

import gradguard


def small_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def backward(model, seed=1, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(32, 8, generator=g)
    y = torch.randn(32, 4, generator=g)
    loss = ((model(x) - y) ** 2).mean()
    (loss * scale).backward()
    return loss.detach()


class ConfigErrors(unittest.TestCase):
    def test_unknown_key_is_named(self):
        with self.assertRaises(gradguard.BadInputError) as ctx:
            gradguard.Guard(small_model(), config={"clip.stratgy": "agc"})
        self.assertIn("clip.stratgy", str(ctx.exception))
        self.assertIn("clip.strategy", str(ctx.exception))  # the nearest valid key is suggested
        self.assertIsInstance(ctx.exception, ValueError)
        self.assertIsInstance(ctx.exception, gradguard.Error)
        self.assertEqual(ctx.exception.exit_code, 2)
        self.assertIn("clip.stratgy", ctx.exception.where)

    def test_bad_value_is_named(self):
        with self.assertRaises(gradguard.BadInputError) as ctx:
            gradguard.Guard(small_model(), config={"clip.strategy": "sometimes"})
        self.assertIn("clip.strategy", str(ctx.exception))
        self.assertIn("agc", str(ctx.exception))  # what would be valid
        with self.assertRaises(gradguard.BadInputError) as ctx:
            gradguard.Guard(small_model(), config={"clip.max_norm": -1.0})
        self.assertIn("clip.max_norm", str(ctx.exception))
        with self.assertRaises(gradguard.BadInputError) as ctx:
            gradguard.Guard(small_model(), config={"guard.loss_window": object()})
        self.assertIn("guard.loss_window", str(ctx.exception))

    def test_values_reach_the_config(self):
        text = gradguard.effective_config({"clip.strategy": "agc", "clip.agc_lambda": 0.02,
                                           "guard.recovery.ladder": ["skip", "halt"], "run.name": "a b"})
        self.assertIn("strategy: agc", text)
        self.assertIn("agc_lambda: 0.02", text)
        self.assertIn("ladder: [skip, halt]", text)
        self.assertEqual(gradguard.config_overrides({"a.b": float("inf"), "c.d": True, "e.f": "",
                                                     "g.h": "x: y", "i.j": (1, 2.5)}),
                         ["a.b=inf", "c.d=true", 'e.f=""', 'g.h="x: y"', "i.j=[1, 2.5]"])
        guard = gradguard.Guard(small_model(), config=["clip.strategy=layerwise"])
        self.assertIn("strategy: layerwise", guard.config_yaml)
        # No precision fallback under way: the configured dtype (the C++ ladder's window
        # logic is tested in tests/guard/recovery_test.cpp).
        self.assertEqual(guard.compute_dtype(0), "fp32")
        bf16 = gradguard.Guard(small_model(), config={"amp.dtype": "bf16"})
        self.assertEqual(bf16.compute_dtype(5), "bf16")

    def test_used_run_directory_is_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            gradguard.Guard(small_model(), run_dir=tmp)
            with self.assertRaises(gradguard.BadInputError) as ctx:
                gradguard.Guard(small_model(), run_dir=tmp)
            self.assertIn("run_dir", str(ctx.exception))
            gradguard.Guard(small_model(), run_dir=tmp, resume=True)  # appending is fine


class OneStep(unittest.TestCase):
    def test_global_clip_matches_clip_grad_norm(self):
        model, twin = small_model(), small_model()
        guard = gradguard.Guard(model, config={"clip.max_norm": 0.05}, count_host_reads=True)
        loss = backward(model)
        backward(twin)
        expected = torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.05).item()
        out = guard.step(0, loss, lr=0.1)
        self.assertTrue(out.applied)
        self.assertEqual(out.host_reads, 1)
        self.assertAlmostEqual(out.grad_norm, expected, delta=expected * 1e-6)
        self.assertLess(out.clip_coef, 1.0)
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=0)
        self.assertAlmostEqual(out.loss, loss.item(), places=6)
        self.assertEqual(out.lr, 0.1)
        self.assertEqual(out.loss_scale, 1.0)
        self.assertEqual(out.anomalies, [])
        self.assertIsNone(out.action)
        self.assertFalse(out.halt)
        self.assertEqual(set(out.layer_grad_norms), set(guard.layer_names))
        self.assertEqual(guard.layer_names, ["0", "2"])
        # The forecast needs five healthy steps before it has a band.
        self.assertIsNone(out.grad_norm_forecast)
        self.assertEqual(out.forecast_breach, 0)
        self.assertEqual(out.forecast_breach_layers, [])

    def test_gradient_norm_forecast_has_a_band_after_five_steps(self):
        model = small_model()
        guard = gradguard.Guard(model, count_host_reads=True)
        for step in range(6):
            model.zero_grad()
            out = guard.step(step, backward(model), lr=0.0)
            self.assertEqual(out.host_reads, 1)
        band = out.grad_norm_forecast
        self.assertIsNotNone(band)
        # The same batch each step: the norm sits on its forecast, inside the band.
        self.assertLess(band["low"], out.grad_norm)
        self.assertLess(out.grad_norm, band["high"])
        self.assertAlmostEqual(band["expected"], out.grad_norm, delta=out.grad_norm * 1e-4)
        self.assertEqual(out.forecast_breach, 0)

    def test_nonfinite_gradients_are_skipped(self):
        model = small_model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        guard = gradguard.Guard(model, optimizer, count_host_reads=True)
        loss = backward(model)
        with torch.no_grad():
            model[0].weight.grad[0, 0] = math.inf
        out = guard.step(0, loss)
        self.assertFalse(out.applied)
        self.assertTrue(out.skipped)
        self.assertTrue(out.nonfinite)
        self.assertEqual(out.host_reads, 1)
        self.assertEqual(out.action, "skip")
        self.assertEqual([a.kind for a in out.anomalies], ["nonfinite"])
        self.assertTrue(out.anomalies[0].critical)
        self.assertEqual(out.snapshot_skipped, "no run directory")

    def test_reset_moments_and_halt_reach_the_loop(self):
        model = small_model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        guard = gradguard.Guard(model, optimizer, config={"guard.recovery.ladder": ["reset_moments", "halt"]})
        backward(model)
        self.assertTrue(guard.step(0, torch.tensor(1.0)).applied)
        optimizer.step()
        self.assertEqual(len(optimizer.state), 4)
        optimizer.zero_grad()
        backward(model)
        with torch.no_grad():
            model[2].bias.grad[0] = math.nan
        out = guard.step(1, torch.tensor(1.0))
        self.assertEqual(out.action, "reset_moments")
        self.assertEqual(out.anomalies[0].layers, ["2"])  # the layer whose gradients are not finite
        self.assertEqual(out.reset_params, ["2.weight", "2.bias"])
        self.assertEqual(out.tensors_reset, 2)
        self.assertEqual(len(optimizer.state), 2)
        self.assertLess(guard.lr_factor(2), 1.0)  # a reset comes with a cool-down
        optimizer.zero_grad()
        backward(model)
        with torch.no_grad():
            model[2].bias.grad[0] = math.nan
        out = guard.step(2, torch.tensor(1.0))
        self.assertTrue(out.halt)
        self.assertEqual(out.action, "halt")
        self.assertIn("recovery ladder is spent", out.halt_message)

    def test_loop_resets_moments_without_an_optimizer_hook(self):
        model = small_model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        guard = gradguard.Guard(model, config={"guard.recovery.ladder": ["reset_moments", "halt"]})
        backward(model)
        guard.step(0, torch.tensor(1.0))
        optimizer.step()
        optimizer.zero_grad()
        backward(model)
        with torch.no_grad():
            model[0].weight.grad.fill_(math.inf)
        out = guard.step(1, torch.tensor(1.0))
        self.assertEqual(out.action, "reset_moments")
        self.assertEqual(out.tensors_reset, 0)
        self.assertEqual(out.reset_params, ["0.weight", "0.bias"])
        self.assertEqual(guard.reset_moments(optimizer, out), 2)
        self.assertEqual(len(optimizer.state), 2)

    def test_state_round_trip(self):
        model = small_model()
        guard = gradguard.Guard(model)
        for step in range(3):
            model.zero_grad()
            guard.step(step, backward(model, seed=step))
        state = guard.state_dict()
        self.assertIn("scaler", state)
        self.assertIn("detector", state["guard"])
        other = gradguard.Guard(small_model())
        other.load_state_dict(state)
        self.assertEqual(other.state_dict(), state)
        other.load_state_dict(state, rollback=True)
        with self.assertRaises(gradguard.BadInputError):
            other.load_state_dict({"nonsense": 1})

    def test_metrics_and_events_in_the_run_directory(self):
        with tempfile.TemporaryDirectory() as tmp:
            model = small_model()
            guard = gradguard.Guard(model, run_dir=tmp, config={"log.tensorboard": False}, tokens_per_step=123)
            for step in range(2):
                model.zero_grad()
                guard.step(step, backward(model, seed=step), lr=0.5)
            guard.log_validation(2, 0.25)
            guard.log_rollback(1, 0, checkpoint="mem")
            import json
            with open(os.path.join(tmp, "metrics.jsonl")) as f:
                lines = [json.loads(s) for s in f]
            self.assertEqual([j["step"] for j in lines], [0, 1, 2, 1])
            self.assertEqual(lines[0]["tokens"], 123)
            self.assertEqual(lines[0]["lr"], 0.5)
            self.assertIn("layer_grad_norms", lines[0])
            self.assertEqual(lines[2], {"step": 2, "val_loss": 0.25})
            self.assertEqual(lines[3]["event"], "rollback")
            self.assertTrue(os.path.exists(os.path.join(tmp, "config.yaml")))


if __name__ == "__main__":
    unittest.main()
