"""Helpers shared by the Python module's tests: paths, files in gradguard's formats.

safetensors are written by hand (torch 1.13 may lack the safetensors package): an
8-byte little-endian header length, the JSON header naming each tensor's dtype, shape
and byte range, then the raw little-endian data. Token files follow llm.c: a 256-int32
header (magic 20240520, version 1, token count) and uint16 tokens.
"""
import json
import os
import struct
import sys

import numpy as np
import torch

SOURCE_DIR = os.environ.get("GRADGUARD_SOURCE_DIR",
                            os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
CLI = os.environ.get("GRADGUARD_CLI", os.path.join(SOURCE_DIR, "build", "gradguard"))
PYTHON = "/usr/bin/python3"
EXAMPLE = os.path.join(SOURCE_DIR, "examples", "pytorch_loop.py")

sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "golden"))


def child_env():
    """The environment for a child process: the built package on PYTHONPATH."""
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", os.path.join(SOURCE_DIR, "build", "python"))
    return env


_DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64", torch.int32: "I32"}


def write_safetensors(path, tensors):
    """tensors: [(name, tensor)] written in that order."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors:
        data = t.detach().contiguous().cpu().numpy().tobytes()
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def write_token_file(path, tokens):
    header = np.zeros(256, dtype="<i4")
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype="<u2").tobytes())


def structured_tokens(vocab, length, seed):
    """A token stream with learnable structure (each token has two likely successors)."""
    rng = np.random.default_rng(seed)
    successors = rng.integers(0, vocab, size=(vocab, 2))
    pick = rng.random(length) < 0.8
    out = np.zeros(length, dtype=np.int64)
    for i in range(1, length):
        out[i] = successors[out[i - 1], 0 if pick[i] else 1]
    return out


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def step_lines(path):
    """The per-step lines of a metrics.jsonl (no events, no validation), by step."""
    return {j["step"]: j for j in read_jsonl(path) if "event" not in j and "loss" in j}
