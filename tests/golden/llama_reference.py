"""Plain torch.nn reference of a Hugging Face style Llama decoder (LlamaForCausalLM).

This module encodes the reference forward pass that gradguard's C++ Llama model
is checked against.  It follows the computation of Hugging Face's
``modeling_llama.py`` (eager attention path) without importing ``transformers``:

* token embedding ``model.embed_tokens``;
* per decoder layer ``i``:
    ``x = x + self_attn(input_layernorm(x))``
    ``x = x + mlp(post_attention_layernorm(x))``;
* RMSNorm ``y = w * (x * rsqrt(mean(x^2, -1) + eps))`` computed in float32;
* attention with bias-free ``q_proj/k_proj/v_proj/o_proj``, grouped-query
  attention (K/V heads repeated per group like HF ``repeat_kv``), rotary
  embeddings in the rotate-half convention, causal softmax scaled by
  ``1/sqrt(head_dim)``;
* MLP ``down_proj(silu(gate_proj(x)) * up_proj(x))``;
* final RMSNorm ``model.norm`` and ``lm_head`` (tied to ``embed_tokens`` when
  ``tie_word_embeddings`` is set, in which case no ``lm_head.weight`` exists).

Parameter names (``named_parameters()``) are exactly Hugging Face's.  Linear
weights are stored ``[out_features, in_features]`` as in torch.

It is imported by ``tests/golden/make_golden.py``; rerun everything with
``/usr/bin/python3 tests/golden/make_golden.py`` from the repository root.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class LlamaConfig:
    """The subset of Hugging Face's LlamaConfig that the model needs."""

    def __init__(self, vocab_size, hidden_size, intermediate_size,
                 num_hidden_layers, num_attention_heads, num_key_value_heads,
                 max_position_embeddings=2048, rms_norm_eps=1e-6,
                 rope_theta=10000.0, tie_word_embeddings=False):
        assert hidden_size % num_attention_heads == 0
        assert num_attention_heads % num_key_value_heads == 0
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.tie_word_embeddings = tie_word_embeddings

    @property
    def head_dim(self):
        return self.hidden_size // self.num_attention_heads

    def to_hf_dict(self):
        """config.json contents with Hugging Face's key names."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "torch_dtype": "float32",
        }


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        in_dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        return self.weight * x.to(in_dtype)


def rotary_cos_sin(seq_len, head_dim, theta, device=None):
    """cos/sin tables of shape [seq_len, head_dim] (HF rotate-half layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64)
                                .to(device=device, dtype=torch.float32) / head_dim))
    positions = torch.arange(seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(positions, inv_freq)          # [T, head_dim/2]
    emb = torch.cat((freqs, freqs), dim=-1)           # [T, head_dim]
    return emb.cos(), emb.sin()


def rotate_half(x):
    half = x.shape[-1] // 2
    x1 = x[..., :half]
    x2 = x[..., half:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x, cos, sin):
    """x: [B, H, T, D]; cos/sin: [T, D]."""
    return x * cos + rotate_half(x) * sin


def repeat_kv(x, n_rep):
    """[B, KVH, T, D] -> [B, KVH * n_rep, T, D], each kv head repeated n_rep times in a row."""
    if n_rep == 1:
        return x
    b, kvh, t, d = x.shape
    return x[:, :, None, :, :].expand(b, kvh, n_rep, t, d).reshape(b, kvh * n_rep, t, d)


class LlamaAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        h, d = cfg.num_attention_heads, cfg.head_dim
        kvh = cfg.num_key_value_heads
        self.q_proj = nn.Linear(cfg.hidden_size, h * d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, kvh * d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, kvh * d, bias=False)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)

    def forward(self, x, cos, sin):
        cfg = self.cfg
        b, t, _ = x.shape
        h, kvh, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        q = self.q_proj(x).view(b, t, h, d).transpose(1, 2)
        k = self.k_proj(x).view(b, t, kvh, d).transpose(1, 2)
        v = self.v_proj(x).view(b, t, kvh, d).transpose(1, 2)
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)
        k = repeat_kv(k, h // kvh)
        v = repeat_kv(v, h // kvh)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(d)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(causal, float("-inf"))
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, v)                       # [B, H, T, D]
        out = out.transpose(1, 2).reshape(b, t, h * d)
        return self.o_proj(out)


class LlamaMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x


class LlamaModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([LlamaDecoderLayer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids):
        t = input_ids.shape[1]
        cos, sin = rotary_cos_sin(t, self.cfg.head_dim, self.cfg.rope_theta, input_ids.device)
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = LlamaModel(cfg)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids):
        h = self.model(input_ids)
        if self.cfg.tie_word_embeddings:
            return F.linear(h, self.model.embed_tokens.weight)
        return self.lm_head(h)

    @torch.no_grad()
    def init_weights(self, generator=None):
        """Deterministic test init: N(0, 0.1) everywhere, norm weights 1 + 0.1*N(0, 1)."""
        for name, p in self.named_parameters():
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float32)
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.copy_(0.1 * noise)


def causal_lm_loss(logits, targets):
    """Mean cross-entropy over all B*T positions."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
