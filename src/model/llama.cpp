// Llama decoder implementation. Shapes are annotated at each step; the math follows HF
// LlamaForCausalLM so that checkpoints and logits match the Python ecosystem (checked by
// tests/model/llama_test.cpp against tests/golden/llama_reference.py).
//
// Activation checkpointing is a custom autograd Function per decoder layer
// (CheckpointedLayer below; LibTorch's C++ API has no torch.utils.checkpoint). Its node
// takes the layer's parameters as inputs, so their gradients reach .grad through their
// ordinary AccumulateGrad nodes in the outer backward: accumulation across micro-batches
// and the post hooks data parallelism hangs there (src/dist/grad_sync.cpp) behave as
// without checkpointing. The recomputation inside backward uses torch::autograd::grad
// with the parameters as the wanted inputs, which captures their gradients without
// touching .grad or firing those hooks a second time.
//
// Packed rows (forward with positions/segments) change only two inputs of the layers:
// per-token rotary tables [B, T, hd] instead of the shared [T, hd] table, and a boolean
// attention mask [B, T, T] built once per call. Both are plain tensors without history,
// so the checkpoint node saves them like cos and sin. forward(input_ids) passes neither
// and runs exactly the kernels it ran before packing existed.
#include "gradguard/model/llama.h"

#include <cmath>
#include <sstream>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "gradguard/core/compat.h"
#include "gradguard/core/error.h"
#include "gradguard/model/attention.h"
#include "gradguard/model/fused_ops.h"
#include "gradguard/model/rope.h"

namespace gradguard::model {
namespace {

void require(bool ok, const std::string& key, const std::string& what) {
  if (!ok) throw bad_input(key, what);
}

torch::nn::Linear linear(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

// Keeps the layer alive and reachable from its checkpoint node until backward.
struct LayerHandle : torch::CustomClassHolder {
  explicit LayerHandle(std::shared_ptr<DecoderLayerImpl> layer) : layer(std::move(layer)) {}
  std::shared_ptr<DecoderLayerImpl> layer;
};

// The autocast state of the calling thread that a layer's computation depends on: on/off
// and dtype, for the CPU and for CUDA (which ROCm builds also call "cuda").
struct AutocastState {
  bool cpu = false, cuda = false;
  c10::ScalarType cpu_dtype = at::kBFloat16, cuda_dtype = at::kHalf;

  static AutocastState current() {
    return {compat::autocast_enabled(c10::kCPU), compat::autocast_enabled(c10::kCUDA),
            compat::autocast_dtype(c10::kCPU), compat::autocast_dtype(c10::kCUDA)};
  }
  void apply() const {
    compat::set_autocast(c10::kCPU, cpu, cpu_dtype);
    compat::set_autocast(c10::kCUDA, cuda, cuda_dtype);
  }
};

// Sets the autocast state to `state` and turns the autocast weight cache off for its
// lifetime, restoring both afterwards. Autocast caches the low-precision cast of a leaf
// weight for the rest of the autocast region, keyed on the weight alone; a cast made
// while grad mode is off has no autograd history, so a later grad-mode op on the same
// weight in that region would reuse it and the weight would silently get no gradient
// (reproduced on LibTorch 1.13 with at::linear under NoGradGuard, then grad mode). The
// model's Linear layers cast the view weight.t(), which is never cached, so this cannot
// happen today, but the checkpointed forward runs without grad inside the caller's
// autocast region by design, so it keeps the cache out of the way rather than rely on
// that. Each weight is used once per layer call, so the cache would save nothing here.
class LayerAutocast {
 public:
  explicit LayerAutocast(const AutocastState& state)
      : before_(AutocastState::current()), cache_before_(at::autocast::is_autocast_cache_enabled()) {
    state.apply();
    at::autocast::set_autocast_cache_enabled(false);
  }
  ~LayerAutocast() {
    at::autocast::set_autocast_cache_enabled(cache_before_);
    before_.apply();
  }
  LayerAutocast(const LayerAutocast&) = delete;
  LayerAutocast& operator=(const LayerAutocast&) = delete;

 private:
  AutocastState before_;
  bool cache_before_;
};

// One checkpointed decoder layer. Inputs (autograd edges in this order): x, cos, sin, the
// attention mask (an empty tensor when plainly causal: LibTorch 1.13's Function::apply
// refuses undefined tensor inputs), then the layer's parameters; the layer itself rides
// along as a non-tensor argument.
//
// RNG: the layer draws no random numbers (no dropout; the fused attention runs with
// dropout_p = 0; LoRA dropout is refused with checkpointing, model/lora.h), so the
// recomputation is the same computation without saving or restoring any generator state.
// A layer that gained dropout would need the CPU/CUDA generator states saved here and
// restored in backward.
struct CheckpointedLayer : torch::autograd::Function<CheckpointedLayer> {
  // The attention mask as DecoderLayerImpl::forward takes it: undefined for causal.
  static torch::Tensor mask_or_causal(const torch::Tensor& allowed) {
    return allowed.numel() == 0 ? torch::Tensor() : allowed;
  }

  static constexpr size_t kFirstParam = 4;  // edge index of the first parameter

  // Runs with grad mode off (Function::apply turns it off), so no graph is recorded and
  // only x, cos, sin and the mask are kept for backward.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& cos, const torch::Tensor& sin, const torch::Tensor& allowed,
                               at::TensorList params, const std::shared_ptr<DecoderLayerImpl>& layer) {
    const auto autocast = AutocastState::current();
    ctx->save_for_backward({x, cos, sin, allowed});
    ctx->saved_data["layer"] = c10::IValue::make_capsule(c10::make_intrusive<LayerHandle>(layer));
    ctx->saved_data["autocast_cpu"] = autocast.cpu;
    ctx->saved_data["autocast_cuda"] = autocast.cuda;
    ctx->saved_data["autocast_cpu_dtype"] = static_cast<int64_t>(autocast.cpu_dtype);
    ctx->saved_data["autocast_cuda_dtype"] = static_cast<int64_t>(autocast.cuda_dtype);
    ctx->saved_data["num_params"] = static_cast<int64_t>(params.size());
    LayerAutocast guard(autocast);  // same autocast, weight cache off (see LayerAutocast)
    return layer->forward(x, cos, sin, mask_or_causal(allowed));
  }

  // Recomputes the layer with grad mode on, under the autocast state the forward saw (the
  // backward itself runs wherever .backward() was called, usually outside autocast), and
  // returns the gradients for x and the parameters; autograd then accumulates the
  // parameters' into .grad as for any other node.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    auto layer = c10::static_intrusive_pointer_cast<LayerHandle>(ctx->saved_data["layer"].toCapsule())->layer;
    AutocastState autocast;
    autocast.cpu = ctx->saved_data["autocast_cpu"].toBool();
    autocast.cuda = ctx->saved_data["autocast_cuda"].toBool();
    autocast.cpu_dtype = static_cast<c10::ScalarType>(ctx->saved_data["autocast_cpu_dtype"].toInt());
    autocast.cuda_dtype = static_cast<c10::ScalarType>(ctx->saved_data["autocast_cuda_dtype"].toInt());
    auto params = layer->parameters();
    TORCH_INTERNAL_ASSERT(static_cast<int64_t>(params.size()) == ctx->saved_data["num_params"].toInt(),
                          "decoder layer parameters changed between forward and backward");
    // One gradient per forward argument: x, cos, sin, allowed, the parameters, the layer handle.
    torch::autograd::variable_list grads(kFirstParam + params.size() + 1);
    if (!grad_outputs[0].defined()) return grads;

    std::vector<torch::Tensor> wrt;  // [k] tensors whose gradient is wanted
    std::vector<size_t> slot;        // [k] their position in grads
    auto x = saved[0].detach();
    if (ctx->needs_input_grad(0)) {
      x.requires_grad_(true);
      wrt.push_back(x);
      slot.push_back(0);
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (!ctx->needs_input_grad(kFirstParam + i)) continue;
      wrt.push_back(params[i]);
      slot.push_back(kFirstParam + i);
    }
    if (wrt.empty()) return grads;

    torch::Tensor out;
    {
      torch::AutoGradMode grad_mode(true);
      LayerAutocast guard(autocast);
      out = layer->forward(x, saved[1], saved[2], mask_or_causal(saved[3]));
    }
    auto g = torch::autograd::grad({out}, wrt, {grad_outputs[0]}, /*retain_graph=*/false,
                                   /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t k = 0; k < wrt.size(); ++k) grads[slot[k]] = g[k];
    return grads;
  }
};

}  // namespace

void LlamaOptions::validate() const {
  require(vocab_size >= 1 && vocab_size <= 1 << 24, "model.vocab_size",
          "must be in [1, 16777216], got " + std::to_string(vocab_size));
  require(hidden_size >= 1, "model.hidden_size", "must be >= 1, got " + std::to_string(hidden_size));
  require(intermediate_size >= 1, "model.intermediate_size",
          "must be >= 1, got " + std::to_string(intermediate_size));
  require(num_layers >= 1, "model.num_layers", "must be >= 1, got " + std::to_string(num_layers));
  require(head_dim >= 0 && head_dim <= 4096 && head_dim % 2 == 0, "model.head_dim",
          "must be 0 (hidden_size / num_heads) or an even width in [2, 4096] for rotary embeddings, got " +
              std::to_string(head_dim));
  if (head_dim == 0) {
    require(num_heads >= 1 && hidden_size % num_heads == 0, "model.num_heads",
            "must be >= 1 and divide model.hidden_size (" + std::to_string(hidden_size) +
                ") when model.head_dim is 0, got " + std::to_string(num_heads));
    require(head_size() % 2 == 0, "model.num_heads",
            "head_dim = hidden_size / num_heads must be even for rotary embeddings, got " +
                std::to_string(head_size()));
  } else {
    require(num_heads >= 1 && num_heads <= 4096, "model.num_heads",
            "must be in [1, 4096], got " + std::to_string(num_heads));
  }
  require(num_kv_heads >= 1 && num_heads % num_kv_heads == 0, "model.num_kv_heads",
          "must be >= 1 and divide model.num_heads (" + std::to_string(num_heads) + "), got " +
              std::to_string(num_kv_heads));
  require(max_seq_len >= 1, "model.max_seq_len", "must be >= 1, got " + std::to_string(max_seq_len));
  require(hidden_size <= 1 << 17, "model.hidden_size", "must be <= 131072, got " + std::to_string(hidden_size));
  require(intermediate_size <= 1 << 20, "model.intermediate_size",
          "must be <= 1048576, got " + std::to_string(intermediate_size));
  require(num_layers <= 4096, "model.num_layers", "must be <= 4096, got " + std::to_string(num_layers));
  require(max_seq_len <= 1 << 24, "model.max_seq_len", "must be <= 16777216, got " + std::to_string(max_seq_len));
  // Finite and in range: a value such as inf would train a model that no saved
  // config.json can describe (JSON has no inf).
  require(std::isfinite(rope_theta) && rope_theta > 1 && rope_theta <= 1e12, "model.rope_theta",
          "must be a finite number in (1, 1e12], got " + format_number(rope_theta));
  require(std::isfinite(rms_norm_eps) && rms_norm_eps > 0 && rms_norm_eps < 1, "model.rms_norm_eps",
          "must be in (0, 1), got " + format_number(rms_norm_eps));
  require(std::isfinite(init_std) && init_std > 0 && init_std < 10, "model.init_std",
          "must be in (0, 10), got " + format_number(init_std));
  // Combinations no Hugging Face family has (docs/models.md): refused so that every model
  // gradguard trains can be exported as a directory Hugging Face loads.
  require(!(mlp_bias && qk_norm), "model.mlp_bias", "cannot be true with model.qk_norm (Qwen3 has no MLP biases)");
  require(!(mlp_bias && qkv_bias && !attention_bias), "model.mlp_bias",
          "cannot be true with model.qkv_bias (Qwen2 has no MLP biases; attention_bias puts biases on o_proj too)");
  require(!(qkv_bias && qk_norm && !attention_bias), "model.qkv_bias",
          "cannot be true with model.qk_norm (Qwen3 biases all four projections or none: use attention_bias)");
  require(sliding_window >= 0, "model.sliding_window", "must be >= 0 (0 = none), got " + std::to_string(sliding_window));
  require(sliding_window == 0 || !(attention_bias || qkv_bias || mlp_bias || qk_norm), "model.sliding_window",
          "cannot be set with projection biases or qk_norm (Mistral, the family with a window, has neither)");
  if (rope_scaling == RopeScaling::kLlama3) {
    require(std::isfinite(rope_scaling_factor) && rope_scaling_factor >= 1 && rope_scaling_factor <= 1e6,
            "model.rope_scaling_factor", "must be in [1, 1e6], got " + format_number(rope_scaling_factor));
    require(std::isfinite(rope_scaling_low_freq_factor) && rope_scaling_low_freq_factor > 0 &&
                rope_scaling_low_freq_factor <= 1e6,
            "model.rope_scaling_low_freq_factor",
            "must be in (0, 1e6], got " + format_number(rope_scaling_low_freq_factor));
    require(std::isfinite(rope_scaling_high_freq_factor) && rope_scaling_high_freq_factor > rope_scaling_low_freq_factor &&
                rope_scaling_high_freq_factor <= 1e6,
            "model.rope_scaling_high_freq_factor",
            "must be greater than model.rope_scaling_low_freq_factor (" + format_number(rope_scaling_low_freq_factor) +
                ") and <= 1e6, got " + format_number(rope_scaling_high_freq_factor));
    require(rope_scaling_original_max_seq_len >= 1 && rope_scaling_original_max_seq_len <= 1 << 24,
            "model.rope_scaling_original_max_seq_len",
            "must be in [1, 16777216], got " + std::to_string(rope_scaling_original_max_seq_len));
  }
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  // Computed in float32 as HF does, then cast back to the input dtype (fused_ops.h).
  return rms_norm(x, weight, eps_);
}

AttentionImpl::AttentionImpl(const LlamaOptions& o)
    : num_heads_(o.num_heads), num_kv_heads_(o.num_kv_heads), head_dim_(o.head_size()) {
  const bool qkv_bias = o.attention_bias || o.qkv_bias;
  q_proj = register_module("q_proj", linear(o.hidden_size, o.num_heads * head_dim_, qkv_bias));
  k_proj = register_module("k_proj", linear(o.hidden_size, o.num_kv_heads * head_dim_, qkv_bias));
  v_proj = register_module("v_proj", linear(o.hidden_size, o.num_kv_heads * head_dim_, qkv_bias));
  o_proj = register_module("o_proj", linear(o.num_heads * head_dim_, o.hidden_size, o.attention_bias));
  if (o.qk_norm) {
    q_norm = register_module("q_norm", RMSNorm(head_dim_, o.rms_norm_eps));
    k_norm = register_module("k_norm", RMSNorm(head_dim_, o.rms_norm_eps));
  }
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                     const torch::Tensor& allowed) {
  const int64_t B = x.size(0), T = x.size(1);
  // RoPE on the projections' own layout [B, T, heads, hd], then heads move to dim 1. Qwen3's
  // q_norm/k_norm normalise each head's hd values first, as HF does.
  const bool training = is_training();
  auto q = project(q_proj, q_lora, x, training).view({B, T, num_heads_, head_dim_});     // [B, T, H, hd]
  auto k = project(k_proj, k_lora, x, training).view({B, T, num_kv_heads_, head_dim_});  // [B, T, KV, hd]
  if (q_norm) {
    q = q_norm(q);
    k = k_norm(k);
  }
  q = rope(q, cos, sin).transpose(1, 2);  // [B, H, T, hd]
  k = rope(k, cos, sin).transpose(1, 2);  // [B, KV, T, hd]
  auto v = project(v_proj, v_lora, x, training).view({B, T, num_kv_heads_, head_dim_}).transpose(1, 2);  // [B, KV, T, hd]
  auto out = causal_attention(q, k, v, allowed);  // [B, H, T, hd]
  return project(o_proj, o_lora, out.transpose(1, 2).reshape({B, T, num_heads_ * head_dim_}), training);
}

torch::Tensor AttentionImpl::forward_cached(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                            KvCache& cache, size_t layer) {
  const int64_t B = x.size(0), T = x.size(1);
  auto q = project(q_proj, q_lora, x, false).view({B, T, num_heads_, head_dim_});
  auto k = project(k_proj, k_lora, x, false).view({B, T, num_kv_heads_, head_dim_});
  if (q_norm) {
    q = q_norm(q);
    k = k_norm(k);
  }
  q = rope(q, cos, sin).transpose(1, 2);  // [B, H, T, hd]
  k = rope(k, cos, sin).transpose(1, 2);  // [B, KV, T, hd]
  auto v = project(v_proj, v_lora, x, false).view({B, T, num_kv_heads_, head_dim_}).transpose(1, 2);
  torch::Tensor out;
  if (!cache.k[layer].defined()) {
    out = causal_attention(q, k, v);  // the prompt: plain causal attention
    cache.k[layer] = k, cache.v[layer] = v;
  } else {
    TORCH_INTERNAL_ASSERT(T == 1, "forward_cached: one token at a time after the prompt");
    cache.k[layer] = torch::cat({cache.k[layer], k}, 2);
    cache.v[layer] = torch::cat({cache.v[layer], v}, 2);
    // The new token sees every cached key: no mask. Query heads grouped by their K/V head
    // ([B, KV, G, hd]) so K/V are not repeated.
    const int64_t G = num_heads_ / num_kv_heads_;
    const auto qg = q.reshape({B, num_kv_heads_, G, head_dim_});
    const auto scores = torch::matmul(qg, cache.k[layer].transpose(-1, -2)) / std::sqrt(static_cast<double>(head_dim_));
    const auto probs = torch::softmax(scores.to(torch::kFloat), -1).to(q.scalar_type());  // [B, KV, G, L]
    out = torch::matmul(probs, cache.v[layer]).reshape({B, num_heads_, 1, head_dim_});
  }
  return project(o_proj, o_lora, out.transpose(1, 2).reshape({B, T, num_heads_ * head_dim_}), false);
}

MlpImpl::MlpImpl(const LlamaOptions& o) {
  gate_proj = register_module("gate_proj", linear(o.hidden_size, o.intermediate_size, o.mlp_bias));
  up_proj = register_module("up_proj", linear(o.hidden_size, o.intermediate_size, o.mlp_bias));
  down_proj = register_module("down_proj", linear(o.intermediate_size, o.hidden_size, o.mlp_bias));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  const bool training = is_training();
  return project(down_proj, down_lora,
                 swiglu(project(gate_proj, gate_lora, x, training), project(up_proj, up_lora, x, training)), training);
}

DecoderLayerImpl::DecoderLayerImpl(const LlamaOptions& o) {
  input_layernorm = register_module("input_layernorm", RMSNorm(o.hidden_size, o.rms_norm_eps));
  self_attn = register_module("self_attn", Attention(o));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RMSNorm(o.hidden_size, o.rms_norm_eps));
  mlp = register_module("mlp", Mlp(o));
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                        const torch::Tensor& sin, const torch::Tensor& allowed) {
  auto h = x + self_attn->forward(input_layernorm(x), cos, sin, allowed);
  return h + mlp(post_attention_layernorm(h));
}

torch::Tensor DecoderLayerImpl::forward_cached(const torch::Tensor& x, const torch::Tensor& cos,
                                               const torch::Tensor& sin, KvCache& cache, size_t layer) {
  auto h = x + self_attn->forward_cached(input_layernorm(x), cos, sin, cache, layer);
  return h + mlp(post_attention_layernorm(h));
}

torch::Tensor DecoderLayerImpl::forward_checkpointed(const torch::Tensor& x, const torch::Tensor& cos,
                                                     const torch::Tensor& sin, const torch::Tensor& allowed) {
  if (!torch::GradMode::is_enabled()) return forward(x, cos, sin, allowed);
  auto self = std::static_pointer_cast<DecoderLayerImpl>(weak_from_this().lock());
  TORCH_CHECK(self, "forward_checkpointed needs a DecoderLayerImpl owned by a shared_ptr (a DecoderLayer)");
  auto params = parameters();
  const auto mask = allowed.defined() ? allowed : torch::empty({0}, x.options().dtype(torch::kBool));
  return CheckpointedLayer::apply(x, cos, sin, mask, at::TensorList(params), self);
}

LlamaBackboneImpl::LlamaBackboneImpl(const LlamaOptions& o) {
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(o.vocab_size, o.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.num_layers; ++i) layers->push_back(DecoderLayer(o));
  norm = register_module("norm", RMSNorm(o.hidden_size, o.rms_norm_eps));
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaOptions& o) : options_(o) {
  options_.validate();
  model = register_module("model", LlamaBackbone(o));
  if (!o.tie_embeddings) lm_head = register_module("lm_head", linear(o.hidden_size, o.vocab_size, false));
  reset_parameters();
}

void LlamaForCausalLMImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  const double std = options_.init_std;
  const double residual_std = std / std::sqrt(2.0 * options_.num_layers);
  for (auto& item : named_parameters()) {
    const std::string& name = item.key();
    auto& p = item.value();
    if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      p.zero_();  // biases start at 0, as HF initialises them
    } else if (name.find("norm") != std::string::npos) {
      p.fill_(1.0);
    } else if (name.find("o_proj") != std::string::npos || name.find("down_proj") != std::string::npos) {
      p.normal_(0.0, residual_std);
    } else {
      p.normal_(0.0, std);
    }
  }
}

std::pair<torch::Tensor, torch::Tensor> LlamaForCausalLMImpl::rope_tables(int64_t T,
                                                                          const torch::Device& device) {
  if (!cos_.defined() || cos_.size(0) < T || cos_.device() != device) {
    const int64_t n = std::max<int64_t>(T, std::min<int64_t>(options_.max_seq_len, 4096));
    auto f64 = torch::TensorOptions().dtype(torch::kDouble);
    auto t = torch::arange(n, f64).to(torch::kFloat);
    auto freqs = torch::outer(t, rope_inv_freq(options_));  // [n, hd/2]
    auto emb = torch::cat({freqs, freqs}, -1);        // [n, hd]
    cos_ = emb.cos().to(device);
    sin_ = emb.sin().to(device);
  }
  return {cos_.narrow(0, 0, T), sin_.narrow(0, 0, T)};
}

std::pair<torch::Tensor, torch::Tensor> LlamaForCausalLMImpl::rope_at(const torch::Tensor& positions) {
  if (!inv_freq_.defined() || inv_freq_.device() != positions.device())
    inv_freq_ = rope_inv_freq(options_).to(positions.device());
  // The products position x inv_freq in float32, as the cached table forms them.
  auto freqs = positions.to(torch::kFloat).unsqueeze(-1) * inv_freq_;  // [B, T, hd/2]
  auto emb = torch::cat({freqs, freqs}, -1);                           // [B, T, hd]
  return {emb.cos(), emb.sin()};
}

torch::Tensor LlamaForCausalLMImpl::forward(const torch::Tensor& input_ids) {
  return forward(input_ids, torch::Tensor(), torch::Tensor());
}

torch::Tensor LlamaForCausalLMImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& positions,
                                            const torch::Tensor& segments) {
  const auto x = hidden_states(input_ids, positions, segments);
  if (lm_head) return lm_head(x);  // [B, T, V]
  return torch::matmul(x, model->embed_tokens->weight.t());
}

const torch::Tensor& LlamaForCausalLMImpl::output_weight() const {
  return lm_head ? lm_head->weight : model->embed_tokens->weight;
}

torch::Tensor LlamaForCausalLMImpl::hidden_states(const torch::Tensor& input_ids, const torch::Tensor& positions,
                                                  const torch::Tensor& segments) {
  TORCH_CHECK(input_ids.dim() == 2, "input_ids must be [B, T]");
  const int64_t T = input_ids.size(1);
  if (T > options_.max_seq_len)
    throw bad_input("data.seq_len", "sequence length " + std::to_string(T) +
                                        " exceeds model.max_seq_len " +
                                        std::to_string(options_.max_seq_len));
  // Within the window every key a causal query sees is inside it (HF masks key j for query
  // i when i - j >= window), so the plain causal attention below is exact; beyond it is not.
  if (options_.sliding_window > 0 && T > options_.sliding_window)
    throw bad_input("data.seq_len", "sequence length " + std::to_string(T) + " exceeds model.sliding_window " +
                                        std::to_string(options_.sliding_window) +
                                        ": sliding-window attention is not implemented, so sequences must fit the "
                                        "window (docs/models.md)");
  auto check_like_ids = [&](const char* name, const torch::Tensor& t) {
    if (!t.defined()) return;
    if (t.sizes() == input_ids.sizes() && t.scalar_type() == torch::kLong && t.device() == input_ids.device()) return;
    std::ostringstream got;
    got << "must be an int64 tensor of input_ids' shape " << input_ids.sizes() << " on " << input_ids.device()
        << ", got " << t.scalar_type() << " " << t.sizes() << " on " << t.device();
    throw bad_input(name, got.str());
  };
  check_like_ids("positions", positions);
  check_like_ids("segments", segments);
  auto [cos, sin] = positions.defined() ? rope_at(positions) : rope_tables(T, input_ids.device());
  const auto allowed = segments.defined() ? segment_mask(segments) : torch::Tensor();  // [B, T, T] bool
  auto x = model->embed_tokens(input_ids);  // [B, T, d]
  const bool checkpoint = options_.activation_checkpointing && is_training() && torch::GradMode::is_enabled();
  for (const auto& layer : *model->layers) {
    auto* decoder = layer->as<DecoderLayer>();
    x = checkpoint ? decoder->forward_checkpointed(x, cos, sin, allowed) : decoder->forward(x, cos, sin, allowed);
  }
  return model->norm(x);
}

torch::Tensor LlamaForCausalLMImpl::forward_cached(const torch::Tensor& input_ids, KvCache& cache) {
  TORCH_CHECK(input_ids.dim() == 2, "input_ids must be [B, T]");
  const int64_t B = input_ids.size(0), T = input_ids.size(1), end = cache.length + T;
  if (end > options_.max_seq_len)
    throw bad_input("model.max_seq_len", std::to_string(end) + " tokens would pass the model's " +
                                             std::to_string(options_.max_seq_len) + " positions");
  if (options_.sliding_window > 0 && end > options_.sliding_window)
    throw bad_input("model.sliding_window", std::to_string(end) + " tokens would pass the attention window of " +
                                                std::to_string(options_.sliding_window) +
                                                " (sliding-window attention is not implemented)");
  const size_t layers = model->layers->size();
  if (cache.k.size() != layers) cache.k.assign(layers, torch::Tensor()), cache.v.assign(layers, torch::Tensor());
  const auto positions =
      torch::arange(cache.length, end, torch::TensorOptions().dtype(torch::kLong).device(input_ids.device()))
          .unsqueeze(0)
          .expand({B, T})
          .contiguous();
  auto [cos, sin] = rope_at(positions);
  auto x = model->embed_tokens(input_ids);
  size_t l = 0;
  for (const auto& layer : *model->layers) x = layer->as<DecoderLayer>()->forward_cached(x, cos, sin, cache, l++);
  cache.length = end;
  x = model->norm(x);
  if (lm_head) return lm_head(x);
  return torch::matmul(x, model->embed_tokens->weight.t());
}

int64_t count_parameters(LlamaForCausalLMImpl& model) {
  int64_t n = 0;
  for (const auto& p : model.parameters()) n += p.numel();
  return n;
}

int64_t count_trainable_parameters(LlamaForCausalLMImpl& model) {
  int64_t n = 0;
  for (const auto& p : model.parameters())
    if (p.requires_grad()) n += p.numel();
  return n;
}

void LlamaForCausalLMImpl::set_activation_checkpointing(bool on) {
  if (on && lora_.enabled() && lora_.dropout > 0)
    throw bad_input("model.activation_checkpointing",
                    "cannot be turned on for a model with LoRA dropout (lora.dropout = " + format_number(lora_.dropout) +
                        "): the recomputation in backward would draw another dropout mask");
  options_.activation_checkpointing = on;
}

}  // namespace gradguard::model
