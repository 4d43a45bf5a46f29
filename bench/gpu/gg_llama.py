"""The Python side of the GPU comparisons: gradguard's Llama, numerics included, in torch.

Shared by bench/gpu/parity.py (one training step against `gradguard train` on the same
weights and batch) and bench/gpu/torch_ref.py (PyTorch eager / torch.compile throughput).

The model is tests/golden/llama_reference.py (Hugging Face's Llama, which the C++ model
is tested against) with the two places where gradguard computes differently from that
plain reference made to match gradguard:

* attention goes through F.scaled_dot_product_attention(is_causal=True, enable_gqa=...)
  as src/model/attention.cpp does from LibTorch 2.1/2.5 on (on an older torch, the
  reference's matmul attention);
* the rotary tables are cast to the query's dtype before use (src/model/llama.cpp
  apply_rope), which under autocast keeps q/k in the autocast dtype as HF does.

Also here: a minimal safetensors reader/writer and the llm.c token-file writer, so the
scripts need nothing but torch (no numpy, no safetensors package).
"""

import json
import math
import os
import struct
import sys
from array import array

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "golden"))
from llama_reference import LlamaAttention, LlamaConfig, LlamaForCausalLM, rotate_half  # noqa: E402

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")
TORCH_VERSION = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])


class GradguardAttention(LlamaAttention):
    """LlamaAttention computed the way gradguard's C++ attention is."""

    def forward(self, x, cos, sin):
        cfg = self.cfg
        b, t, _ = x.shape
        h, kvh, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        q = self.q_proj(x).view(b, t, h, d).transpose(1, 2)
        k = self.k_proj(x).view(b, t, kvh, d).transpose(1, 2)
        v = self.v_proj(x).view(b, t, kvh, d).transpose(1, 2)
        if cos.dtype != q.dtype:
            cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        scale = 1.0 / math.sqrt(d)
        if HAS_SDPA and TORCH_VERSION >= (2, 5):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=kvh != h)
        elif HAS_SDPA and TORCH_VERSION >= (2, 1):
            rep = h // kvh
            if rep > 1:
                k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        else:  # gradguard's portable path: masked softmax of scaled scores
            rep = h // kvh
            if rep > 1:
                k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            scores = torch.matmul(q * scale, k.transpose(2, 3))
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            out = torch.matmul(torch.softmax(scores.masked_fill(mask, float("-inf")), -1), v)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, h * d))


def build_model(cfg):
    """LlamaForCausalLM whose attention layers compute as gradguard's."""
    model = LlamaForCausalLM(cfg)
    for layer in model.model.layers:
        layer.self_attn.__class__ = GradguardAttention
    return model


@torch.no_grad()
def init_like_gradguard(model, num_layers, std=0.02, seed=0):
    """gradguard's init scheme (N(0, std); o_proj/down_proj std/sqrt(2L); norms 1)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if "norm" in name:
            p.fill_(1.0)
        else:
            s = std / math.sqrt(2.0 * num_layers) if ("o_proj" in name or "down_proj" in name) else std
            p.copy_(torch.randn(p.shape, generator=g) * s)


def token_mean_loss(model, inputs, targets, total_tokens):
    """sum(token cross-entropy) / total_tokens in float32, as src/train/step.cpp."""
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                           reduction="sum") / total_tokens


def param_groups(model, weight_decay):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def grad_scaler(init_scale):
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler("cuda", init_scale=init_scale, growth_interval=2000)
    return torch.cuda.amp.GradScaler(init_scale=init_scale, growth_interval=2000)


# ---- files -----------------------------------------------------------------------------
_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
              "I64": torch.int64, "I32": torch.int32}
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}


def save_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().to("cpu").contiguous()
        raw = _tensor_bytes(t)
        header[name] = {"dtype": _ST_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def _tensor_bytes(t):
    """Raw (little-endian) bytes of a contiguous CPU tensor."""
    flat = t.reshape(-1).view(torch.uint8)
    try:
        return flat.numpy().tobytes()
    except (ImportError, RuntimeError):  # a torch without numpy
        return bytes(flat.tolist())


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        b, e = meta["data_offsets"]
        buf = bytearray(data[base + b:base + e])
        dtype = _ST_DTYPES[meta["dtype"]]
        t = torch.frombuffer(buf, dtype=torch.uint8).view(dtype) if buf else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(meta["shape"]).clone()
    return out


def write_hf_dir(path, cfg, model):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg.to_hf_dict(), f, indent=2)
    save_safetensors(os.path.join(path, "model.safetensors"),
                     {k: v.float() for k, v in model.state_dict().items()})


def write_token_file(path, tokens):
    """llm.c's format: 256 int32 header (magic 20240520, version 1, count), uint16 tokens."""
    header = array("i", [0] * 256)
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    body = array("H", tokens)
    if sys.byteorder != "little":
        header.byteswap()
        body.byteswap()
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(body.tobytes())


def mfu(tokens_per_s, n_params, layers, hidden, seq, peak_tflops):
    """tokens/s x (6 N + 12 L d T) / peak (the formula bench/gpu_step.cpp uses)."""
    return tokens_per_s * (6.0 * n_params + 12.0 * layers * hidden * seq) / (peak_tflops * 1e12)


__all__ = ["LlamaConfig", "build_model", "init_like_gradguard", "token_mean_loss", "param_groups", "grad_scaler",
           "save_safetensors", "load_safetensors", "write_hf_dir", "write_token_file", "mfu", "HAS_SDPA",
           "TORCH_VERSION"]
