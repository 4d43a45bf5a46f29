#!/usr/bin/env python3
"""Writes the binary seed files in fuzz/corpus/ (safetensors and token files).

The YAML seeds in corpus/config_fuzz/ are hand-written (tiny.yaml is configs/tiny.yaml).
Seeds are a few small valid files plus one example of each kind of damage the readers
reject, so libFuzzer starts next to every validation branch. Keep the corpus tiny: it is
checked in and scripts/fuzz.sh copies it before fuzzing, so it never grows.
Run: python3 fuzz/make_seeds.py
"""
import json
import os
import struct

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def write(target, name, data):
    os.makedirs(os.path.join(HERE, target), exist_ok=True)
    with open(os.path.join(HERE, target, name), "wb") as f:
        f.write(data)


def safetensors(header, data):
    """8-byte little-endian header length, JSON padded to 8 bytes, data section."""
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text.encode() + data


def token_file(count, tokens, magic=20240520, version=1):
    """llm.c token file: 256 int32 header (magic, version, count, zeros), uint16 tokens."""
    header = struct.pack("<3i", magic, version, count) + bytes(4 * 253)
    return header + struct.pack("<%dH" % len(tokens), *tokens)


def token_file_v2(count, tokens, width=4, count_high=0, vocab=200000, flags=None):
    """Version 2: ints 5 (width), 6 (count >> 32), 7-8 (tokenizer hash), 9 (vocab size),
    10 (1 = a flags section of one byte per token follows the tokens)."""
    header = struct.pack("<3i", 20240520, 2, count & 0xFFFFFFFF) + bytes(8)
    header += struct.pack("<iIIIii", width, count_high, 0x12345678, 0x9ABCDEF0, vocab, 0 if flags is None else 1)
    header += bytes(1024 - len(header))
    fmt = "<%d%s" % (len(tokens), "I" if width == 4 else "H")
    return header + struct.pack(fmt, *tokens) + (bytes(flags) if flags is not None else b"")


st = "safetensors_header_fuzz"
write(st, "valid_four_tensors.safetensors", safetensors({
    "__metadata__": {"format": "pt"},
    "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
    "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]},
    "s": {"dtype": "I64", "shape": [], "data_offsets": [22, 30]},
    "e": {"dtype": "BOOL", "shape": [0, 4], "data_offsets": [30, 30]},
}, bytes(range(30))))
write(st, "valid_empty.safetensors", safetensors({}, b""))
write(st, "overlap.safetensors", safetensors({
    "a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
    "b": {"dtype": "I8", "shape": [4], "data_offsets": [2, 6]},
}, bytes(8)))
write(st, "bad_dtype.safetensors", safetensors(
    {"a": {"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]}}, b"\x01"))
write(st, "header_past_end.safetensors", struct.pack("<Q", 64) + b"{}")
write(st, "truncated.safetensors", b"\x10\x00\x00")

tf = "token_file_fuzz"
write(tf, "valid_16.bin", token_file(16, list(b"hello, gradguard")))
write(tf, "valid_empty.bin", token_file(0, []))
write(tf, "token_out_of_vocab.bin", token_file(2, [65, 300]))
write(tf, "count_lies.bin", token_file(100, [1, 2, 3]))
write(tf, "bad_magic.bin", token_file(1, [1], magic=1234))
write(tf, "truncated_header.bin", token_file(4, [1, 2, 3, 4])[:600])
write(tf, "v2_valid_wide.bin", token_file_v2(3, [70000, 1, 151000]))
write(tf, "v2_valid_narrow.bin", token_file_v2(2, [7, 8], width=2))
write(tf, "v2_count_high_bit.bin", token_file_v2(3, [1, 2, 3], count_high=0x80000001))
write(tf, "v2_bad_width.bin", token_file_v2(3, [1, 2, 3], width=3))
write(tf, "v2_flags.bin", token_file_v2(4, [5, 6, 7, 8], width=2, flags=[2, 1, 3, 1]))
write(tf, "v2_flags_bad_bits.bin", token_file_v2(2, [5, 6], width=2, flags=[2, 9]))
