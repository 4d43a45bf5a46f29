// YAML -> typed options. Every configurable field is listed once, in fields(), with its
// key, a pointer into the Config and a one-line description; reading a file, applying
// --set overrides, printing the effective config and generating docs/config.md all walk
// that one table, so they cannot disagree.
#include "gradguard/config/config.h"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <sstream>
#include <variant>

#include "gradguard/core/error.h"
#include "gradguard/core/fs.h"

namespace gradguard::config {
namespace {

using FieldPtr =
    std::variant<int64_t*, uint64_t*, double*, bool*, std::string*, std::array<double, 2>*, std::vector<int64_t>*,
                 std::vector<std::string>*>;

struct Field {
  std::string section;
  std::string key;
  FieldPtr ptr;
  std::string doc;
  std::string full() const { return section + "." + key; }
};

const std::vector<std::string> kSections = {"run",  "model", "data", "batch",      "optim", "schedule",
                                            "clip", "amp",   "eval", "checkpoint", "log",   "guard",
                                            "telemetry", "dist"};

std::vector<Field> fields(Config& c) {
  return {
      {"run", "name", &c.run.name, "run directory name under run.dir; \"\" = <model>-<date>-<time>"},
      {"run", "dir", &c.run.dir, "parent directory of run directories"},
      {"run", "seed", &c.run.seed, "seed for weight init and data shuffling"},
      {"run", "device", &c.run.device, "cpu | auto | cuda | cuda:N"},
      {"run", "threads", &c.run.threads, "CPU threads; 0 = the CPUs this process may use (affinity, cgroup quota), split between ranks on a node"},
      {"run", "thread_pool", &c.run.thread_pool,
       "which pool gets run.threads (the other runs on 1): blas = the BLAS library's (matmuls), aten = ATen's intra-op (elementwise ops); auto = blas with OpenBLAS, else aten"},
      {"run", "overwrite", &c.run.overwrite, "allow reusing a run directory that holds a run"},
      {"model", "vocab_size", &c.model.vocab_size, "vocabulary size (256 for byte-level data)"},
      {"model", "hidden_size", &c.model.hidden_size, "model width"},
      {"model", "intermediate_size", &c.model.intermediate_size, "SwiGLU hidden width"},
      {"model", "num_layers", &c.model.num_layers, "decoder layers"},
      {"model", "num_heads", &c.model.num_heads, "attention query heads; divides hidden_size"},
      {"model", "num_kv_heads", &c.model.num_kv_heads, "K/V heads (GQA); divides num_heads"},
      {"model", "max_seq_len", &c.model.max_seq_len, "longest sequence the model accepts"},
      {"model", "rope_theta", &c.model.rope_theta, "rotary embedding base"},
      {"model", "rms_norm_eps", &c.model.rms_norm_eps, "RMSNorm epsilon"},
      {"model", "tie_embeddings", &c.model.tie_embeddings, "lm_head shares the embedding matrix"},
      {"model", "init_std", &c.model.init_std, "init std; residual projections use std/sqrt(2*num_layers)"},
      {"model", "init_from", &c.model.init_from,
       "HF directory (config.json + model.safetensors) to start from; its architecture wins; \"\" = random"},
      {"model", "activation_checkpointing", &c.model.activation_checkpointing,
       "keep only each decoder layer's input in training and recompute its activations in backward (less memory, more compute)"},
      {"data", "train_path", &c.data.train_path, "training token file (llm.c format)"},
      {"data", "val_path", &c.data.val_path, "validation token file; \"\" disables validation"},
      {"data", "seq_len", &c.data.seq_len, "tokens per sample (T)"},
      {"data", "shuffle", &c.data.shuffle, "false: file order; true: seeded permutation per epoch"},
      {"batch", "micro_batch", &c.batch.micro_batch, "sequences per forward/backward (per rank)"},
      {"batch", "accum_steps", &c.batch.accum_steps, "micro-batches accumulated per optimizer step"},
      {"batch", "global_batch", &c.batch.global_batch,
       "sequences per optimizer step; 0 = micro_batch*accum_steps*ranks, >0 sets accum_steps"},
      {"batch", "require_pow2", &c.batch.require_pow2, "reject batch sizes that are not powers of 2"},
      {"optim", "name", &c.optim.name, "optimizer: adamw"},
      {"optim", "lr", &c.optim.lr, "peak learning rate"},
      {"optim", "betas", &c.optim.betas, "Adam [beta1, beta2]"},
      {"optim", "eps", &c.optim.eps, "Adam epsilon"},
      {"optim", "weight_decay", &c.optim.weight_decay, "weight decay on dim>=2 tensors; 0 disables"},
      {"optim", "implementation", &c.optim.implementation,
       "adamw kernel: auto (fused where LibTorch has it, else foreach), fused, foreach or loop"},
      {"optim", "max_trust_ratio", &c.optim.max_trust_ratio, "lamb: clamp of the trust ratio ||w||/||update||"},
      {"optim", "momentum", &c.optim.momentum, "lars: momentum"},
      {"optim", "trust_coefficient", &c.optim.trust_coefficient, "lars: eta of the local learning rate"},
      {"optim", "lr_scaling", &c.optim.lr_scaling, "none | linear | sqrt: scale lr by global_batch/base_batch"},
      {"optim", "base_batch", &c.optim.base_batch, "sequences per step optim.lr was tuned for; 0 = no scaling"},
      {"schedule", "warmup_steps", &c.schedule.warmup_steps, "linear warmup steps; 0 disables"},
      {"schedule", "total_steps", &c.schedule.total_steps, "optimizer steps of the run"},
      {"schedule", "decay", &c.schedule.decay, "cosine | linear | constant"},
      {"schedule", "min_lr", &c.schedule.min_lr, "learning-rate floor (absolute, before lr scaling)"},
      {"schedule", "wsd_decay_fraction", &c.schedule.wsd_decay_fraction, "wsd: share of post-warmup steps decaying"},
      {"clip", "strategy", &c.clip.strategy, "none | global | history | layerwise | agc | zscore"},
      {"clip", "max_norm", &c.clip.max_norm, "global/layerwise threshold; history cap; zscore warmup threshold"},
      {"clip", "error_if_nonfinite", &c.clip.error_if_nonfinite, "halt (exit 3) on inf/NaN gradients instead of skipping"},
      {"clip", "history_window", &c.clip.history_window, "history: norms averaged (W)"},
      {"clip", "history_factor", &c.clip.history_factor, "history: threshold = min(max_norm, factor*mean)"},
      {"clip", "agc_lambda", &c.clip.agc_lambda, "agc: max ||G_row|| / max(||W_row||, agc_eps)"},
      {"clip", "agc_eps", &c.clip.agc_eps, "agc: floor of the weight-row norm"},
      {"clip", "zscore_threshold", &c.clip.zscore_threshold, "zscore: clip when the norm's z-score exceeds this"},
      {"clip", "zscore_alpha", &c.clip.zscore_alpha, "zscore: EMA decay of mean and variance"},
      {"clip", "zscore_warmup", &c.clip.zscore_warmup, "zscore: steps seeding the statistics (max_norm applies)"},
      {"amp", "dtype", &c.amp.dtype, "compute dtype: fp32 | bf16 | fp16 (fp16: GPU only)"},
      {"amp", "scaler.mode", &c.amp.scaler.mode, "auto (dynamic for fp16, else off) | dynamic | static | off"},
      {"amp", "scaler.init_scale", &c.amp.scaler.init_scale, "initial (dynamic) or fixed (static) loss scale"},
      {"amp", "scaler.growth_factor", &c.amp.scaler.growth_factor, "scale multiplier after growth_interval clean steps"},
      {"amp", "scaler.backoff_factor", &c.amp.scaler.backoff_factor, "scale multiplier on overflow"},
      {"amp", "scaler.growth_interval", &c.amp.scaler.growth_interval, "consecutive finite steps before growing"},
      {"amp", "scaler.max_scale", &c.amp.scaler.max_scale, "cap on growth; 0 disables"},
      {"amp", "scaler.min_scale", &c.amp.scaler.min_scale, "floor on backoff"},
      {"amp", "scaler.hysteresis", &c.amp.scaler.hysteresis, "consecutive overflows tolerated before backing off"},
      {"amp", "scaler.min_scale_patience", &c.amp.scaler.min_scale_patience,
       "overflows in a row at min_scale before it is reported as stuck"},
      {"eval", "every", &c.eval.every, "validate every N steps; 0 = only at the end"},
      {"eval", "batches", &c.eval.batches, "validation micro-batches per evaluation"},
      {"checkpoint", "every", &c.checkpoint.every, "checkpoint every N steps; 0 = only the final one"},
      {"checkpoint", "keep_last", &c.checkpoint.keep_last, "periodic checkpoints kept; 0 keeps all"},
      {"log", "every", &c.log.every, "plain progress line every N steps"},
      {"log", "progress", &c.log.progress,
       "auto (bar on a terminal, else lines) | bar | lines | jsonl (one JSON object per step on stdout) | quiet"},
      {"log", "report", &c.log.report, "write report.html into the run directory when the run ends or halts"},
      {"log", "tensorboard", &c.log.tensorboard, "write TensorBoard event files into the run directory as it runs"},
      {"guard", "enabled", &c.guard.enabled, "anomaly detection, snapshots and recovery (non-finite steps are always skipped)"},
      {"guard", "warmup", &c.guard.warmup, "steps before the loss and per-layer rules arm; -1 = schedule.warmup_steps"},
      {"guard", "grad_norm_factor", &c.guard.grad_norm_factor,
       "anomaly: grad norm > factor x clip threshold (x recent mean when nothing clips); 0 disables"},
      {"guard", "grad_norm_patience", &c.guard.grad_norm_patience,
       "steps in a row above the limit before an explosion that clipping bounds is critical"},
      {"guard", "loss_zscore", &c.guard.loss_zscore, "anomaly: loss z-score against the trend of the recent window; 0 disables"},
      {"guard", "loss_window", &c.guard.loss_window, "healthy steps in the loss and grad-norm windows"},
      {"guard", "layer_zscore", &c.guard.layer_zscore, "per-layer outlier: log-norm z-score against its EMA; 0 disables"},
      {"guard", "backoff_limit", &c.guard.backoff_limit, "anomaly: this many loss-scale backoffs within backoff_window; 0 disables"},
      {"guard", "backoff_window", &c.guard.backoff_window, "steps of the backoff-storm window"},
      {"guard", "skip_streak", &c.guard.skip_streak, "anomaly: this many skipped steps in a row; 0 disables"},
      {"guard", "recovery.ladder", &c.guard.recovery.ladder,
       "escalation: skip | cooldown | reset_moments | rollback | halt, in order"},
      {"guard", "recovery.skip_budget", &c.guard.recovery.skip_budget, "skips per run"},
      {"guard", "recovery.cooldown_budget", &c.guard.recovery.cooldown_budget, "LR cool-downs per run"},
      {"guard", "recovery.reset_budget", &c.guard.recovery.reset_budget, "optimizer-moment resets per run"},
      {"guard", "recovery.rollback_budget", &c.guard.recovery.rollback_budget,
       "rollbacks per run (needs checkpoint.every > 0)"},
      {"guard", "recovery.calm_steps", &c.guard.recovery.calm_steps,
       "steps after an action within which the same kind of anomaly climbs the ladder"},
      {"guard", "recovery.cooldown_factor", &c.guard.recovery.cooldown_factor, "LR multiplier during a cool-down"},
      {"guard", "recovery.cooldown_steps", &c.guard.recovery.cooldown_steps, "steps a cool-down lasts"},
      {"guard", "recovery.rollback_skip_steps", &c.guard.recovery.rollback_skip_steps,
       "extra steps of data skipped after a rollback"},
      {"guard", "snapshot.enabled", &c.guard.snapshot.enabled, "write snapshots/step-N-<kind>/ on critical anomalies"},
      {"guard", "snapshot.max_count", &c.guard.snapshot.max_count, "snapshots per run"},
      {"guard", "snapshot.max_mb", &c.guard.snapshot.max_mb, "disk budget of all snapshots (MiB)"},
      {"guard", "snapshot.min_interval", &c.guard.snapshot.min_interval, "steps between snapshots (a halt always tries one)"},
      {"guard", "snapshot.history", &c.guard.snapshot.history, "metrics lines (steps) kept in a snapshot"},
      {"guard", "noise_scale.every", &c.guard.noise_scale.every,
       "estimate the gradient noise scale every N steps (needs accum_steps > 1); 0 disables"},
      {"guard", "noise_scale.ema", &c.guard.noise_scale.ema, "EMA smoothing of the noise-scale estimates"},
      {"guard", "noise_scale.warn_ratio", &c.guard.noise_scale.warn_ratio,
       "warn when global_batch > ratio x B_simple; 0 disables"},
      {"guard", "noise_scale.warn_after", &c.guard.noise_scale.warn_after, "estimates before the warning may fire"},
      {"guard", "inject.nonfinite_steps", &c.guard.inject.nonfinite_steps,
       "fault injection: steps whose gradients get an inf"},
      {"guard", "inject.spike_steps", &c.guard.inject.spike_steps,
       "fault injection: steps whose batch is replaced by random tokens"},
      {"guard", "inject.overflow_storm", &c.guard.inject.overflow_storm,
       "fault injection: [start, length] steps of overflowing gradients; [] = none"},
      {"guard", "inject.rank", &c.guard.inject.rank,
       "fault injection: the rank whose gradients or batch are corrupted; -1 = every rank"},
      {"telemetry", "enabled", &c.telemetry.enabled, "background sampler of process and GPU state"},
      {"telemetry", "period_ms", &c.telemetry.period_ms, "sampling period (ms)"},
      {"telemetry", "window", &c.telemetry.window, "samples kept in memory for snapshots"},
      {"telemetry", "backend", &c.telemetry.backend, "GPU source: auto | nvml | rocm_smi | none (/proc is always read)"},
      {"dist", "backend", &c.dist.backend, "auto (nccl on GPUs, gloo on CPU) | gloo | nccl"},
      {"dist", "timeout_s", &c.dist.timeout_s, "a collective or rendezvous waiting longer fails the run (s)"},
      {"dist", "bucket_mb", &c.dist.bucket_mb, "flat gradient buckets all-reduced during the last backward (MiB)"},
      {"dist", "hook", &c.dist.hook, "gradient compression: none | fp16 | bf16 | powersgd"},
      {"dist", "powersgd_rank", &c.dist.powersgd_rank, "PowerSGD: rank of the low-rank approximation"},
      {"dist", "powersgd_start_step", &c.dist.powersgd_start_step, "PowerSGD: plain all-reduce before this step"},
      {"dist", "check_every", &c.dist.check_every, "compare a weight checksum across ranks every N steps; 0 disables"},
      {"dist", "heartbeat_s", &c.dist.heartbeat_s, "how often each rank tells the rendezvous store it is alive (s)"},
  };
}

std::string type_name(const FieldPtr& p) {
  return std::visit(
      [](auto* v) -> std::string {
        using T = std::remove_pointer_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t>) return "integer";
        if constexpr (std::is_same_v<T, uint64_t>) return "non-negative integer";
        if constexpr (std::is_same_v<T, double>) return "number";
        if constexpr (std::is_same_v<T, bool>) return "boolean";
        if constexpr (std::is_same_v<T, std::string>) return "string";
        if constexpr (std::is_same_v<T, std::vector<int64_t>>) return "list of integers";
        if constexpr (std::is_same_v<T, std::vector<std::string>>) return "list of strings";
        return "list of 2 numbers";
      },
      p);
}

std::string format_double(double v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  std::string s(buf, res.ptr);
  // Keep a float-looking form so YAML readers see a number with a fraction.
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}

std::string format_value(const FieldPtr& p) {
  return std::visit(
      [](auto* v) -> std::string {
        using T = std::remove_pointer_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, uint64_t>) return std::to_string(*v);
        if constexpr (std::is_same_v<T, double>) return format_double(*v);
        if constexpr (std::is_same_v<T, bool>) return *v ? "true" : "false";
        if constexpr (std::is_same_v<T, std::string>) return quote(*v);
        if constexpr (std::is_same_v<T, std::array<double, 2>>)
          return "[" + format_double((*v)[0]) + ", " + format_double((*v)[1]) + "]";
        if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          std::string out = "[";
          for (size_t i = 0; i < v->size(); ++i) out += (i ? ", " : "") + std::to_string((*v)[i]);
          return out + "]";
        }
        if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          std::string out = "[";
          for (size_t i = 0; i < v->size(); ++i) out += (i ? ", " : "") + quote((*v)[i]);
          return out + "]";
        }
      },
      p);
}

std::string node_text(const YAML::Node& node) {
  YAML::Emitter e;
  e << YAML::Flow << node;
  return e.c_str();
}

double parse_double(const YAML::Node& node, const std::string& where) {
  if (!node.IsScalar()) throw bad_input(where, "expected a number, got " + node_text(node));
  const std::string s = node.Scalar();
  double v;
  try {
    size_t used = 0;
    v = std::stod(s, &used);
    if (used != s.size()) throw std::invalid_argument(s);
  } catch (const std::exception&) {
    throw bad_input(where, "expected a number, got '" + s + "'");
  }
  return v;
}

// Assigns `node` to the field, checking its type. `where` names the key for messages.
void assign(const Field& f, const YAML::Node& node, const std::string& where) {
  std::visit(
      [&](auto* v) {
        using T = std::remove_pointer_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          if (node.IsNull()) *v = "";
          else if (node.IsScalar()) *v = node.Scalar();
          else throw bad_input(where, "expected a string, got " + node_text(node));
        } else if constexpr (std::is_same_v<T, bool>) {
          bool b;
          if (!node.IsScalar() || !YAML::convert<bool>::decode(node, b))
            throw bad_input(where, "expected a boolean (true or false), got '" + node_text(node) + "'");
          *v = b;
        } else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, uint64_t>) {
          const std::string s = node.IsScalar() ? node.Scalar() : node_text(node);
          T parsed{};
          auto res = std::from_chars(s.data(), s.data() + s.size(), parsed);
          if (!node.IsScalar() || res.ec != std::errc() || res.ptr != s.data() + s.size())
            throw bad_input(where, "expected " + type_name(f.ptr) + ", got '" + s + "'");
          *v = parsed;
        } else if constexpr (std::is_same_v<T, double>) {
          *v = parse_double(node, where);
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          if (!node.IsSequence()) throw bad_input(where, "expected a list of integers like [3, 7], got " + node_text(node));
          v->clear();
          for (const auto& item : node) {
            const std::string t = item.IsScalar() ? item.Scalar() : node_text(item);
            int64_t parsed = 0;
            auto res = std::from_chars(t.data(), t.data() + t.size(), parsed);
            if (!item.IsScalar() || res.ec != std::errc() || res.ptr != t.data() + t.size())
              throw bad_input(where, "expected a list of integers, got element '" + t + "'");
            v->push_back(parsed);
          }
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          if (!node.IsSequence()) throw bad_input(where, "expected a list of strings like [a, b], got " + node_text(node));
          v->clear();
          for (const auto& item : node) {
            if (!item.IsScalar()) throw bad_input(where, "expected a list of strings, got element " + node_text(item));
            v->push_back(item.Scalar());
          }
        } else {
          if (!node.IsSequence() || node.size() != 2)
            throw bad_input(where, "expected a list of 2 numbers like [0.9, 0.95], got " + node_text(node));
          (*v)[0] = parse_double(node[0], where);
          (*v)[1] = parse_double(node[1], where);
        }
      },
      f.ptr);
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string unknown_key_message(const std::string& key, const std::vector<std::string>& candidates) {
  std::string near = nearest_key(key, candidates);
  return near.empty() ? "unknown key" : "unknown key (did you mean '" + near + "'?)";
}

std::vector<std::string> all_keys(std::vector<Field>& table) {
  std::vector<std::string> keys;
  for (const auto& f : table) keys.push_back(f.full());
  return keys;
}

Field* find_field(std::vector<Field>& table, const std::string& full) {
  for (auto& f : table)
    if (f.full() == full) return &f;
  return nullptr;
}

// Assigns every entry of `map` under `prefix`; a nested mapping is a sub-section
// ("amp: {scaler: {mode: dynamic}}" sets amp.scaler.mode) when no field takes a map.
void apply_map(std::vector<Field>& table, const std::vector<std::string>& keys, const std::string& path,
               const std::string& prefix, const YAML::Node& map) {
  for (const auto& entry : map) {
    const std::string full = prefix + "." + entry.first.Scalar();
    Field* f = find_field(table, full);
    if (f == nullptr && entry.second.IsMap()) {
      const bool is_section = std::any_of(keys.begin(), keys.end(),
                                          [&](const std::string& k) { return k.rfind(full + ".", 0) == 0; });
      if (is_section) {
        apply_map(table, keys, path, full, entry.second);
        continue;
      }
    }
    if (f == nullptr) throw bad_input(path + ": " + full, unknown_key_message(full, keys));
    assign(*f, entry.second, path + ": " + full);
  }
}

void apply_file(Config& c, const std::string& path) {
  const std::string text = fs::read_file(path);
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw bad_input(path, "invalid YAML at line " + std::to_string(e.mark.line + 1) + ", column " +
                              std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
  if (root.IsNull()) return;
  if (!root.IsMap()) throw bad_input(path, "the top level must be a mapping of sections (run:, model:, ...)");
  auto table = fields(c);
  auto keys = all_keys(table);
  for (const auto& section : root) {
    const std::string name = section.first.Scalar();
    if (std::find(kSections.begin(), kSections.end(), name) == kSections.end())
      throw bad_input(path + ": " + name, unknown_key_message(name, kSections));
    if (section.second.IsNull()) continue;
    if (!section.second.IsMap())
      throw bad_input(path + ": " + name, "a section must be a mapping of keys, got " + node_text(section.second));
    apply_map(table, keys, path, name, section.second);
  }
}

void apply_override(Config& c, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw bad_input("--set " + assignment, "expected key.path=value, e.g. optim.lr=1e-3");
  const std::string key = assignment.substr(0, eq);
  const std::string where = "--set " + key;
  auto table = fields(c);
  Field* f = find_field(table, key);
  if (f == nullptr) throw bad_input(where, unknown_key_message(key, all_keys(table)));
  YAML::Node node;
  try {
    node = YAML::Load(assignment.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    throw bad_input(where, "value is not valid YAML: " + e.msg);
  }
  assign(*f, node, where);
}

bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

}  // namespace

std::string nearest_key(const std::string& key, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::string::npos;
  for (const auto& c : candidates) {
    size_t d = edit_distance(key, c);
    // Also compare the last component alone, so "lrr" finds "optim.lr".
    auto dot = c.rfind('.');
    if (dot != std::string::npos && key.find('.') == std::string::npos)
      d = std::min(d, edit_distance(key, c.substr(dot + 1)));
    // A truncated or extended key ("schedule.warmup", "optimizer") is a near miss too.
    const size_t common = std::min(key.size(), c.size());
    if (common >= 3 && key.compare(0, common, c, 0, common) == 0) d = std::min<size_t>(d, 1);
    if (d < best_d) best_d = d, best = c;
  }
  const size_t limit = std::max<size_t>(2, key.size() / 3);
  return best_d <= limit ? best : "";
}

void Config::finalize(int64_t world_size) {
  run.validate();
  model.validate();
  data.validate();
  batch.validate();
  optim.validate();
  schedule.validate();
  clip.validate();
  amp.validate();
  eval.validate();
  checkpoint.validate();
  log.validate();
  guard.validate();
  telemetry.validate();
  dist.validate();
  if (optim.lr_scaling != "none" && optim.lr_scaling != "linear" && optim.lr_scaling != "sqrt")
    throw bad_input("optim.lr_scaling", "'" + optim.lr_scaling + "' is not valid (valid: none, linear, sqrt)");
  if (optim.base_batch < 0) throw bad_input("optim.base_batch", "must be >= 0, got " + std::to_string(optim.base_batch));
  if (schedule.min_lr > optim.lr)
    throw bad_input("schedule.min_lr", "must be <= optim.lr (" + format_double(optim.lr) + "), got " +
                                           format_double(schedule.min_lr));
  if (data.seq_len > model.max_seq_len)
    throw bad_input("data.seq_len", "must be <= model.max_seq_len (" + std::to_string(model.max_seq_len) +
                                        "), got " + std::to_string(data.seq_len));
  const int64_t per_step = batch.micro_batch * world_size;
  if (batch.global_batch > 0) {
    if (batch.global_batch % per_step != 0)
      throw bad_input("batch.global_batch",
                      std::to_string(batch.global_batch) + " is not a multiple of batch.micro_batch (" +
                          std::to_string(batch.micro_batch) + ") x ranks (" + std::to_string(world_size) + ")");
    batch.accum_steps = batch.global_batch / per_step;
  } else {
    batch.global_batch = per_step * batch.accum_steps;
  }
  warnings.clear();
  if (!batch.require_pow2 && !is_pow2(batch.global_batch))
    warnings.push_back("batch.global_batch " + std::to_string(batch.global_batch) +
                       " is not a power of two: per-rank shards and accumulation windows can come out uneven "
                       "and GPU kernels run less efficiently; set batch.require_pow2=true to make this an error");
  if (batch.require_pow2) {
    for (auto [key, v] : {std::pair<const char*, int64_t>{"batch.micro_batch", batch.micro_batch},
                          {"batch.accum_steps", batch.accum_steps},
                          {"batch.global_batch", batch.global_batch}})
      if (!is_pow2(v))
        throw bad_input(key, std::to_string(v) + " is not a power of 2 (batch.require_pow2 is true)");
  }
}

Config default_config() { return Config{}; }

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  Config c = default_config();
  if (!path.empty()) apply_file(c, path);
  for (const auto& o : overrides) apply_override(c, o);
  c.finalize();
  return c;
}

std::string to_yaml(const Config& config) {
  Config copy = config;
  auto table = fields(copy);
  std::ostringstream out;
  out << "# gradguard effective configuration (gradguard " GRADGUARD_VERSION ")\n";
  std::string section, sub;
  for (const auto& f : table) {
    if (f.section != section) {
      section = f.section;
      sub.clear();
      out << section << ":\n";
    }
    const auto dot = f.key.rfind('.');
    const std::string f_sub = dot == std::string::npos ? "" : f.key.substr(0, dot);
    const std::string leaf = dot == std::string::npos ? f.key : f.key.substr(dot + 1);
    if (f_sub != sub) {
      sub = f_sub;
      if (!sub.empty()) out << "  " << sub << ":\n";
    }
    std::string line = std::string(sub.empty() ? 2 : 4, ' ') + leaf + ": " + format_value(f.ptr);
    if (line.size() < 40) line.append(40 - line.size(), ' ');
    out << line << "  # " << f.doc << "\n";
  }
  return out.str();
}

std::string reference_markdown() {
  Config defaults = default_config();
  auto table = fields(defaults);
  std::ostringstream out;
  out << "# Configuration reference\n\n"
      << "Generated by `gradguard config docs`; a test keeps this file in step with the code.\n\n"
      << "A run's configuration is the built-in default, then the YAML file given with\n"
      << "`--config FILE`, then each `--set key.path=value` (the value is read as YAML, so\n"
      << "`--set optim.betas=[0.9,0.95]` works). `gradguard config show` prints the result,\n"
      << "and every run directory keeps it as `config.yaml`. Unknown keys, wrong types and\n"
      << "out-of-range values stop the program with exit code 2 and a message naming the key.\n";
  std::string section;
  for (const auto& f : table) {
    if (f.section != section) {
      section = f.section;
      out << "\n## `" << section << "`\n\n| key | type | default | meaning |\n|---|---|---|---|\n";
    }
    out << "| `" << f.full() << "` | " << type_name(f.ptr) << " | `" << format_value(f.ptr) << "` | "
        << f.doc << " |\n";
  }
  return out.str();
}

}  // namespace gradguard::config
