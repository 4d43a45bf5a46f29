"""Golden model directories for the families beyond plain Llama (tests/model/llama_test.cpp).

Each directory is what Hugging Face would load with the family's own class: config.json
with that family's keys, model.safetensors with its tensor names, and forward.json with
the logits, mean loss and per-parameter gradient norms of a plain torch.nn model written
here from the published architectures (Hugging Face transformers' eager code paths):

* llama3_bias_tiny -- LlamaForCausalLM with an explicit head_dim (16, not hidden/heads =
  8), attention_bias (q/k/v/o biases), mlp_bias (gate/up/down biases) and Llama-3.1
  rope_scaling ("llama3": inv_freq rescaled by wavelength, Meta's apply_scaling in
  llama-models, which HF's _compute_llama3_parameters reproduces).  The scaling constants
  put the 8 frequencies in all three regimes (kept, smoothed, divided by factor).
* qwen2_tiny -- Qwen2ForCausalLM: biases on q/k/v, none on o_proj, tied embeddings,
  use_sliding_window false (the sliding_window value is then unused, as in HF).
* qwen3_tiny -- Qwen3ForCausalLM: explicit head_dim, per-head RMSNorm q_norm/k_norm on
  q and k before the rotary embedding, no biases.

It reuses llama_reference.py (RMSNorm, rotate-half RoPE, repeat_kv) and the
safetensors/JSON writers of make_golden.py.  Run from the repository root:
``/usr/bin/python3 tests/golden/make_family_golden.py`` (torch only; deterministic).
"""

import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import llama_reference as ref  # noqa: E402
import make_golden as mg  # noqa: E402


def default_inv_freq(head_dim, theta):
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim))


def llama3_scaling(inv_freq, rs):
    """Meta's Llama 3.1 apply_scaling, one frequency at a time."""
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for freq in inv_freq.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(freq)
        elif wavelen > low_wavelen:
            out.append(freq / factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append((1 - smooth) * freq / factor + smooth * freq)
    return torch.tensor(out, dtype=torch.float32)


class Cfg:
    def __init__(self, d):
        self.d = d
        self.model_type = d["model_type"]
        self.hidden_size = d["hidden_size"]
        self.vocab_size = d["vocab_size"]
        self.heads = d["num_attention_heads"]
        self.kv_heads = d["num_key_value_heads"]
        self.head_dim = d.get("head_dim") or self.hidden_size // self.heads
        self.eps = d["rms_norm_eps"]
        self.tie = d.get("tie_word_embeddings", False)
        qwen2 = self.model_type == "qwen2"
        self.qkv_bias = qwen2 or d.get("attention_bias", False)
        self.o_bias = (not qwen2) and d.get("attention_bias", False)
        self.mlp_bias = self.model_type == "llama" and d.get("mlp_bias", False)
        self.qk_norm = self.model_type == "qwen3"
        inv = default_inv_freq(self.head_dim, d.get("rope_theta", 10000.0))
        rs = d.get("rope_scaling")
        self.inv_freq = llama3_scaling(inv, rs) if rs else inv


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        h, kv, d = c.heads, c.kv_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, h * d, bias=c.qkv_bias)
        self.k_proj = nn.Linear(c.hidden_size, kv * d, bias=c.qkv_bias)
        self.v_proj = nn.Linear(c.hidden_size, kv * d, bias=c.qkv_bias)
        self.o_proj = nn.Linear(h * d, c.hidden_size, bias=c.o_bias)
        if c.qk_norm:
            self.q_norm = ref.RMSNorm(d, c.eps)
            self.k_norm = ref.RMSNorm(d, c.eps)

    def forward(self, x, cos, sin):
        c = self.c
        b, t, _ = x.shape
        h, kv, d = c.heads, c.kv_heads, c.head_dim
        q = self.q_proj(x).view(b, t, h, d)
        k = self.k_proj(x).view(b, t, kv, d)
        if c.qk_norm:  # Qwen3: per head, before RoPE
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v_proj(x).view(b, t, kv, d).transpose(1, 2)
        q, k = ref.apply_rotary(q, cos, sin), ref.apply_rotary(k, cos, sin)
        k, v = ref.repeat_kv(k, h // kv), ref.repeat_kv(v, h // kv)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(d)
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        out = torch.matmul(F.softmax(scores, dim=-1, dtype=torch.float32), v)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, h * d))


class Mlp(nn.Module):
    def __init__(self, c, inter):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, inter, bias=c.mlp_bias)
        self.up_proj = nn.Linear(c.hidden_size, inter, bias=c.mlp_bias)
        self.down_proj = nn.Linear(inter, c.hidden_size, bias=c.mlp_bias)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = ref.RMSNorm(c.hidden_size, c.eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = ref.RMSNorm(c.hidden_size, c.eps)
        self.mlp = Mlp(c, c.d["intermediate_size"])

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList([Layer(c) for _ in range(c.d["num_hidden_layers"])])
        self.norm = ref.RMSNorm(c.hidden_size, c.eps)


class CausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = Backbone(c)
        if not c.tie:
            self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def forward(self, ids):
        t = ids.shape[1]
        freqs = torch.outer(torch.arange(t, dtype=torch.float32), self.c.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        x = self.model.norm(x)
        return F.linear(x, self.model.embed_tokens.weight) if self.c.tie else self.lm_head(x)

    @torch.no_grad()
    def init_weights(self, gen):
        """N(0, 0.1) everywhere (biases included, so that they matter), norms 1 + 0.1 N(0, 1)."""
        for name, p in self.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            p.copy_(1.0 + 0.1 * noise if name.endswith("norm.weight") else 0.1 * noise)


def make(dirname, config, seed):
    out_dir = os.path.join(HERE, dirname)
    os.makedirs(out_dir, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    model = CausalLM(Cfg(config))
    model.init_weights(gen)
    state = {n: p.detach().clone() for n, p in model.named_parameters()}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    mg.write_safetensors(os.path.join(out_dir, "model.safetensors"), state)
    back, _ = mg.read_safetensors(os.path.join(out_dir, "model.safetensors"))
    assert all(torch.equal(back[n], t) for n, t in state.items())

    B, T = 2, 12
    ids = torch.randint(0, config["vocab_size"], (B, T), generator=gen)
    targets = torch.randint(0, config["vocab_size"], (B, T), generator=gen)
    logits = model(ids)
    loss = ref.causal_lm_loss(logits, targets)
    loss.backward()
    mg.write_json(os.path.join(out_dir, "forward.json"), {
        "input_ids": ids.tolist(),
        "targets": targets.tolist(),
        "logits_shape": list(logits.shape),
        "loss": mg.scalar(loss),
        "grad_norms": {n: mg.scalar(p.grad.norm(2)) for n, p in model.named_parameters()},
        "inv_freq": [float(v) for v in model.c.inv_freq.tolist()],
        "logits": mg.flat(logits),
    })
    print(f"{dirname}: {len(state)} tensors, loss {loss.item():.6f}")


COMMON = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
          "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32",
          "transformers_version": "4.51.0", "use_cache": True, "initializer_range": 0.02}


def main():
    torch.set_num_threads(1)
    make("llama3_bias_tiny", dict(
        COMMON, architectures=["LlamaForCausalLM"], model_type="llama", head_dim=16,
        attention_bias=True, mlp_bias=True, attention_dropout=0.0, pretraining_tp=1,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32}), seed=21)
    make("qwen2_tiny", dict(
        COMMON, architectures=["Qwen2ForCausalLM"], model_type="qwen2", rms_norm_eps=1e-6,
        rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False,
        sliding_window=64, max_window_layers=2, attention_dropout=0.0, rope_scaling=None), seed=22)
    make("qwen3_tiny", dict(
        COMMON, architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=16,
        attention_bias=False, rms_norm_eps=1e-6, rope_theta=1000000, tie_word_embeddings=False,
        use_sliding_window=False, sliding_window=None, max_window_layers=2,
        attention_dropout=0.0, rope_scaling=None), seed=23)


if __name__ == "__main__":
    main()
