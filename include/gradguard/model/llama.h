// A Llama-style decoder-only transformer with Hugging Face parameter names, so that
// named_parameters() yields exactly the keys of an HF Llama checkpoint
// ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", ...,
// "model.norm.weight", "lm_head.weight").
//
// Architecture (as HF LlamaForCausalLM): token embedding; per layer
// x += o_proj(attn(rope(q), rope(k), v)) on RMSNorm(x), then x += SwiGLU MLP on RMSNorm(x);
// final RMSNorm; lm_head (or the embedding matrix when tie_embeddings). Rotary embeddings
// use HF's rotate-half convention; grouped-query attention shares each K/V head among
// num_heads / num_kv_heads query heads without materialising repeated K/V.
//
// The options also describe the Llama-shaped families that differ only in switches
// (docs/models.md): an explicit head_dim (q_proj out = num_heads x head_dim), projection
// biases (attention_bias: q/k/v/o as HF Llama; qkv_bias: q/k/v only, as Qwen2), MLP biases
// (mlp_bias), per-head RMSNorm of q and k before RoPE (qk_norm, Qwen3) and Llama 3.1's
// rotary frequency scaling (rope_scaling = llama3; model/rope.h). Every combination the
// options accept is one that some Hugging Face family expresses, so any model exports.
//
// Activation checkpointing (LlamaOptions::activation_checkpointing) trades compute for
// memory: in training with grad mode on, each decoder layer keeps only its input for
// backward and recomputes its internal activations there (one extra layer forward per
// layer per backward). Gradients are the same as without it; see
// DecoderLayerImpl::forward_checkpointed.
//
// Packed sequences: forward(input_ids, positions, segments) runs several samples in one
// row, each with its own rotary positions and with attention kept inside its segment,
// so every sample gets the logits it would get alone. The segment mask is built once per
// call and shared by all layers (and carried through activation checkpointing).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include "gradguard/core/choice.h"
#include "gradguard/model/lora.h"

namespace gradguard::model {

// Rotary frequency scaling (HF config.json rope_scaling, its rope_type).
enum class RopeScaling {
  kNone,    // plain RoPE: inv_freq = theta^(-2i / head_dim)
  kLlama3,  // Llama 3.1: long wavelengths divided by rope_scaling_factor, a blend in between
};
constexpr std::array<Choice<RopeScaling>, 2> choices(RopeScaling) {
  return {{{RopeScaling::kNone, "none"}, {RopeScaling::kLlama3, "llama3"}}};
}

struct LlamaOptions {
  int64_t vocab_size = 256;
  int64_t hidden_size = 128;
  int64_t intermediate_size = 384;
  int64_t num_layers = 4;
  int64_t num_heads = 4;
  int64_t num_kv_heads = 2;
  int64_t max_seq_len = 1024;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-5;
  bool tie_embeddings = false;
  double init_std = 0.02;
  std::string init_from;
  bool activation_checkpointing = false;
  int64_t head_dim = 0;         // per-head width; 0 = hidden_size / num_heads
  bool attention_bias = false;  // biases on q/k/v/o_proj (HF attention_bias)
  bool qkv_bias = false;        // biases on q/k/v_proj only (Qwen2)
  bool mlp_bias = false;        // biases on gate/up/down_proj (HF mlp_bias)
  bool qk_norm = false;         // RMSNorm over each head of q and k before RoPE (Qwen3)
  RopeScaling rope_scaling = RopeScaling::kNone;
  double rope_scaling_factor = 8.0;                  // llama3: divisor of the low frequencies; >= 1
  double rope_scaling_low_freq_factor = 1.0;         // llama3: wavelengths > original / this are divided
  double rope_scaling_high_freq_factor = 4.0;        // llama3: wavelengths < original / this are kept
  int64_t rope_scaling_original_max_seq_len = 8192;  // llama3: the context first trained at (tokens)
  int64_t sliding_window = 0;  // Mistral's attention window (tokens); 0 = none; longer sequences refused

  // The per-head width in use: head_dim, or hidden_size / num_heads when head_dim is 0.
  int64_t head_size() const { return head_dim > 0 ? head_dim : hidden_size / num_heads; }
  // Throws gradguard::Error (bad input) naming the key, e.g. "model.num_kv_heads".
  void validate() const;

  template <class Field>
  void fields(Field&& field) {
    field("vocab_size", vocab_size, "tokens in the vocabulary (256 for byte-level data); >= 1");
    field("hidden_size", hidden_size, "model width d; >= 1");
    field("intermediate_size", intermediate_size, "SwiGLU hidden width; >= 1");
    field("num_layers", num_layers, "decoder layers; >= 1");
    field("num_heads", num_heads, "attention query heads; divides hidden_size, with an even head size (RoPE)");
    field("num_kv_heads", num_kv_heads, "K/V heads (grouped-query attention); divides num_heads; = num_heads is MHA");
    field("max_seq_len", max_seq_len, "longest sequence the model accepts (HF max_position_embeddings); >= 1");
    field("rope_theta", rope_theta, "rotary embedding base; finite, > 0");
    field("rms_norm_eps", rms_norm_eps, "RMSNorm epsilon; finite, > 0");
    field("tie_embeddings", tie_embeddings, "lm_head shares the embedding matrix");
    field("head_dim", head_dim,
          "per-head width (HF head_dim): q_proj has num_heads x head_dim outputs; even; 0 = hidden_size / num_heads");
    field("attention_bias", attention_bias, "biases on q_proj, k_proj, v_proj and o_proj (HF attention_bias)");
    field("qkv_bias", qkv_bias, "biases on q_proj, k_proj and v_proj only (Qwen2); not with mlp_bias or qk_norm");
    field("mlp_bias", mlp_bias, "biases on gate_proj, up_proj and down_proj (HF mlp_bias); not with qk_norm");
    field("qk_norm", qk_norm, "RMSNorm over each head of q and k before the rotary embedding (Qwen3)");
    field("rope_scaling", rope_scaling,
          "rotary frequency scaling: none, or llama3 (Llama 3.1: long wavelengths divided by rope_scaling_factor)");
    field("rope_scaling_factor", rope_scaling_factor, "llama3: divisor of the low frequencies; >= 1");
    field("rope_scaling_low_freq_factor", rope_scaling_low_freq_factor,
          "llama3: wavelengths above original / this are divided by the factor; > 0");
    field("rope_scaling_high_freq_factor", rope_scaling_high_freq_factor,
          "llama3: wavelengths below original / this are kept, those between blended; > low_freq_factor");
    field("rope_scaling_original_max_seq_len", rope_scaling_original_max_seq_len,
          "llama3: the context length first trained at (HF original_max_position_embeddings); >= 1");
    field("sliding_window", sliding_window,
          "Mistral's attention window (HF sliding_window); sequences up to it are plain causal attention, longer "
          "ones are refused; 0 = none");
    field("init_std", init_std, "N(0, std) initialisation; residual projections get std / sqrt(2 x num_layers); > 0");
    field("init_from", init_from,
          "HF directory (config.json + model.safetensors) to start from; its architecture wins; \"\" = random init");
    field("activation_checkpointing", activation_checkpointing,
          "keep only each decoder layer's input in training and recompute its activations in backward (less "
          "memory, more compute)");
  }
};

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);  // [..., dim] -> [..., dim]
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

// The keys and values of the tokens a sequence has seen so far, per decoder layer, so that
// generation feeds only each new token (LlamaForCausalLMImpl::forward_cached).
struct KvCache {
  std::vector<torch::Tensor> k, v;  // [layer] -> [B, KV, length, head_dim], keys after RoPE
  int64_t length = 0;               // tokens cached
};

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const LlamaOptions& o);
  // x [B, T, d]; cos/sin [T, head_dim] or [B, T, head_dim]; allowed undefined (causal) or
  // [B, T, T] bool (attention.h) -> [B, T, d]
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& allowed = {});
  // x [B, T, d] of new tokens at positions cache.length .. + T-1 (cos/sin for those);
  // appends their keys and values to layer `layer` of the cache. T may be > 1 only while
  // the cache is empty (the prompt). -> [B, T, d]
  torch::Tensor forward_cached(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                               KvCache& cache, size_t layer);
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // [head_dim] each; only with qk_norm
  LoraAdapter q_lora, k_lora, v_lora, o_lora;  // active only where add_lora put one (model/lora.h)

 private:
  int64_t num_heads_, num_kv_heads_, head_dim_;
};
TORCH_MODULE(Attention);

class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const LlamaOptions& o);
  torch::Tensor forward(const torch::Tensor& x);  // down(silu(gate(x)) * up(x))
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  LoraAdapter gate_lora, up_lora, down_lora;  // active only where add_lora put one (model/lora.h)
};
TORCH_MODULE(Mlp);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit DecoderLayerImpl(const LlamaOptions& o);
  // x [B, T, d]; cos/sin [T, head_dim] or [B, T, head_dim]; allowed undefined (causal) or
  // [B, T, T] bool (attention.h) -> [B, T, d]
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& allowed = {});
  // forward() with activation checkpointing: under grad mode the layer runs without
  // recording a graph and only x, cos, sin and allowed are kept; backward re-runs forward() (under
  // the autocast state of the original call) and hands the parameters and x the same
  // gradients plain autograd would, through the parameters' usual AccumulateGrad nodes
  // (so .grad accumulates and gradient hooks fire as without checkpointing). Without
  // grad mode it is forward(). First-order only: the gradients are not differentiable
  // (no double backward). The layer has no dropout, so there is no RNG state to replay.
  torch::Tensor forward_checkpointed(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                     const torch::Tensor& allowed = {});
  torch::Tensor forward_cached(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                               KvCache& cache, size_t layer);
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  Attention self_attn{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(DecoderLayer);

// The "model." part of the HF names.
class LlamaBackboneImpl : public torch::nn::Module {
 public:
  explicit LlamaBackboneImpl(const LlamaOptions& o);
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
};
TORCH_MODULE(LlamaBackbone);

class LlamaForCausalLMImpl : public torch::nn::Module {
 public:
  // Validates the options and initialises the weights (scaled normal, norms = 1).
  explicit LlamaForCausalLMImpl(const LlamaOptions& o);
  // input_ids [B, T] int64 with T <= max_seq_len -> logits [B, T, vocab] (float32, or the
  // autocast dtype when autocast is on). Checkpoints the decoder layers when
  // options().activation_checkpointing, the module is in training mode and grad mode is on.
  torch::Tensor forward(const torch::Tensor& input_ids);
  // Packed rows. positions [B, T] int64: the rotary position of each token (a sample
  // packed at column 40 typically restarts at 0); undefined = 0..T-1 in every row.
  // segments [B, T] int64: query i attends key j only when j <= i and segments[b, i] ==
  // segments[b, j] (ids are compared, not ordered; give padding its own id); undefined =
  // each row is one segment. Both undefined is forward(input_ids), same kernels. Positions
  // are not range-checked (no host read); any int64 gives a well-defined rotation. Throws
  // gradguard::Error naming "positions" or "segments" when one is not an int64 [B, T]
  // tensor on input_ids' device.
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& positions,
                        const torch::Tensor& segments);
  // The final normed hidden states [B, T, hidden] that forward() multiplies by the output
  // projection (same arguments and checks), and that projection's weight [vocab, hidden]:
  // lm_head's, or the token embedding's when tie_embeddings. The chunked loss
  // (train/chunked_loss.h) computes the logits from them a chunk at a time.
  torch::Tensor hidden_states(const torch::Tensor& input_ids, const torch::Tensor& positions,
                              const torch::Tensor& segments);
  const torch::Tensor& output_weight() const;
  // Generation: logits [B, T, vocab] of input_ids [B, T], the tokens that follow the
  // cache's, which grows by T. The first call (empty cache) takes the prompt, later ones
  // one token each; the logits equal forward() over the whole sequence up to rounding
  // (the one-token attention is a plain matmul). Throws gradguard::Error (bad input)
  // naming model.max_seq_len (or model.sliding_window) when the sequence would pass it.
  torch::Tensor forward_cached(const torch::Tensor& input_ids, KvCache& cache);
  const LlamaOptions& options() const { return options_; }
  // Turns activation checkpointing on or off for later forward calls (the weights stay).
  // Throws gradguard::Error (bad input) turning it on for a model with LoRA dropout.
  void set_activation_checkpointing(bool on);
  // The adapters' settings (rank 0 = none; model/lora.h).
  const LoraOptions& lora() const { return lora_; }
  // (Re)initialises every parameter from the current torch RNG.
  void reset_parameters();

  LlamaBackbone model{nullptr};
  torch::nn::Linear lm_head{nullptr};  // null when tie_embeddings

 private:
  // Rotary tables for T positions on `device`, cached across calls.
  std::pair<torch::Tensor, torch::Tensor> rope_tables(int64_t T, const torch::Device& device);
  // Rotary tables for explicit positions [B, T] -> cos, sin [B, T, head_dim], computed per
  // call (as HF does from position_ids) with the same float32 products as the cached table.
  std::pair<torch::Tensor, torch::Tensor> rope_at(const torch::Tensor& positions);

  friend void add_lora(LlamaForCausalLMImpl& model, const LoraOptions& options);

  LlamaOptions options_;
  LoraOptions lora_;         // rank 0 until add_lora
  torch::Tensor cos_, sin_;  // [cached T, head_dim]
  torch::Tensor inv_freq_;   // [head_dim / 2] on the device of the last rope_at call
};
TORCH_MODULE(LlamaForCausalLM);

// Number of parameters (tied weights counted once), adapters included.
int64_t count_parameters(LlamaForCausalLMImpl& model);
// Number of parameters that train (requires_grad): all of them, or the adapters with LoRA.
int64_t count_trainable_parameters(LlamaForCausalLMImpl& model);

}  // namespace gradguard::model
