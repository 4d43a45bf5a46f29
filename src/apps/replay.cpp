// Replay recomputes every micro-batch separately with the recorded loss scale and
// precision, summing their gradient contributions to rebuild the step's global norm,
// and compares with state.json. Per-sample gradient norms cost one backward per sample
// of one micro-batch, which is fine for a post-mortem.
#include "gradguard/apps/replay.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "gradguard/checkpoint/hf_checkpoint.h"
#include "gradguard/checkpoint/safetensors.h"
#include "gradguard/config/config.h"
#include "gradguard/core/error.h"
#include "gradguard/core/json_read.h"
#include "gradguard/core/json_number.h"
#include "gradguard/core/fs.h"
#include "gradguard/train/step.h"
#include "gradguard/train/trainer.h"

namespace gradguard::replay {
namespace {

double number_or_nan(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : std::numeric_limits<double>::quiet_NaN();
}

bool close(double a, double b, double rtol) {
  if (!std::isfinite(a) || !std::isfinite(b)) return std::isfinite(a) == std::isfinite(b);
  return std::abs(a - b) <= rtol * std::max({std::abs(a), std::abs(b), 1e-12});
}

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

// Sum of the gradients' squared norms as a double on the host (replay may sync).
std::vector<torch::Tensor> grads_of(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> g;
  for (const auto& p : params) g.push_back(p.grad().defined() ? p.grad().detach().clone() : torch::zeros_like(p));
  return g;
}

double norm_of(const std::vector<torch::Tensor>& g, double factor) {
  double sq = 0;
  for (const auto& t : g) sq += t.to(torch::kDouble).pow(2).sum().item<double>();
  return std::sqrt(sq) * factor;
}

// What a snapshot recorded about its step's batch (batch.safetensors, state.json).
struct Evidence {
  torch::Tensor inputs, targets, positions, segments, sample_index;
  int64_t total_tokens = 0;
  double loss_scale = 1;
  std::vector<double> recorded_micro;
};

// Re-runs the step's micro-batches one by one on `model` (the weights before the step),
// then the samples of the one with the largest gradient: fills r's loss, grad_norm,
// micro, driving_micro and samples. Leaves the model's gradients undefined.
void analyse(model::LlamaForCausalLMImpl& model_ref, const config::Config& cfg, const Evidence& e,
             const torch::Device& device, const ReplayOptions& options, ReplayReport& r) {
  auto* model = &model_ref;
  const auto& inputs = e.inputs;
  const auto& targets = e.targets;
  const auto& positions = e.positions;
  const auto& segments = e.segments;
  const auto& sample_index = e.sample_index;
  const int64_t total_tokens = e.total_tokens;
  const double loss_scale = e.loss_scale;
  const auto& recorded_micro = e.recorded_micro;
  model->train();
  std::vector<torch::Tensor> params;  // the ones that train: all, or the adapters
  for (const auto& p : model->parameters())
    if (p.requires_grad()) params.push_back(p);
  auto zero = [&] {
    for (auto& p : params) p.mutable_grad() = torch::Tensor();
  };

  const int64_t accum = inputs.size(0);
  std::vector<torch::Tensor> total;
  double loss_sum = 0;
  for (int64_t m = 0; m < accum; ++m) {
    zero();
    data::Batch b{inputs[m].to(torch::kLong), targets[m].to(torch::kLong),
                  positions.defined() ? positions[m].to(torch::kLong) : torch::Tensor(),
                  segments.defined() ? segments[m].to(torch::kLong) : torch::Tensor()};
    auto acc = train::accumulate(*model, {b}, total_tokens, cfg.amp, device, loss_scale, false, {},
                                 train::LossTerms{cfg.loss.z_loss, cfg.loss.chunk_tokens});
    auto g = grads_of(params);
    MicroReplay mr;
    mr.index = m;
    mr.loss = acc.micro_losses[0].item<double>();
    mr.recorded_loss = m < static_cast<int64_t>(recorded_micro.size()) ? recorded_micro[m] : NAN;
    // The contribution is the micro-batch's mean gradient x its token share x the scale.
    const double share =
        static_cast<double>((b.targets != data::kIgnoreTarget).sum().item<int64_t>()) / static_cast<double>(total_tokens);
    mr.grad_norm = norm_of(g, 1.0 / (loss_scale * share));
    loss_sum += acc.loss.item<double>();
    if (total.empty()) total = g;
    else
      for (size_t i = 0; i < g.size(); ++i) total[i].add_(g[i]);
    r.micro.push_back(mr);
  }
  r.loss = loss_sum;
  r.grad_norm = norm_of(total, 1.0 / loss_scale);
  r.nonfinite = !std::isfinite(r.grad_norm);
  for (auto& mr : r.micro) {
    double s = 0, ss = 0;
    for (const auto& o : r.micro)
      if (o.index != mr.index) s += o.loss;
    const double n = static_cast<double>(r.micro.size() - 1);
    const double mean = n > 0 ? s / n : mr.loss;
    for (const auto& o : r.micro)
      if (o.index != mr.index) ss += (o.loss - mean) * (o.loss - mean);
    const double sd = n > 1 ? std::sqrt(ss / (n - 1)) : 0;
    mr.loss_zscore = n > 0 ? (mr.loss - mean) / std::max(sd, 0.01 * std::abs(mean)) : 0;
  }
  r.driving_micro = std::max_element(r.micro.begin(), r.micro.end(), [](const MicroReplay& a, const MicroReplay& b) {
                      return !(a.grad_norm >= b.grad_norm);  // NaN/inf sorts last-as-largest
                    })->index;

  if (options.top_samples > 0) {
    const int64_t m = r.driving_micro;
    for (int64_t row = 0; row < inputs.size(1); ++row) {
      zero();
      auto row_of = [&](const torch::Tensor& t) {
        return t.defined() ? t[m].narrow(0, row, 1).to(torch::kLong) : torch::Tensor();
      };
      data::Batch b{row_of(inputs), row_of(targets), row_of(positions), row_of(segments)};
      const int64_t tokens = std::max<int64_t>(1, (b.targets != data::kIgnoreTarget).sum().item<int64_t>());
      auto acc = train::accumulate(*model, {b}, tokens, cfg.amp, device, 1.0, false, {},
                                 train::LossTerms{cfg.loss.z_loss, cfg.loss.chunk_tokens});
      SampleReplay sr;
      sr.micro = m;
      sr.row = row;
      sr.sample_index = sample_index[m][row].item<int64_t>();
      sr.loss = acc.loss.item<double>();
      sr.grad_norm = norm_of(grads_of(params), 1.0);
      r.samples.push_back(sr);
    }
    std::stable_sort(r.samples.begin(), r.samples.end(),
                     [](const SampleReplay& a, const SampleReplay& b) { return !(a.grad_norm <= b.grad_norm); });
    if (static_cast<int64_t>(r.samples.size()) > options.top_samples) r.samples.resize(options.top_samples);
  }
  zero();

}

// reference.json: where a reference snapshot's replay starts.
struct Reference {
  std::string checkpoint;  // relative to the run directory; "" = the run's start
  int64_t from_step = 0;
  int64_t world_size = 1;
  std::string checkpoint_or_start() const { return checkpoint.empty() ? "the run's start" : checkpoint; }
};

Reference read_reference(const std::string& dir) {
  const std::string path = dir + "/reference.json";
  const auto j = read_json_file(path);
  Reference ref;
  try {
    ref.checkpoint = j.at("checkpoint").get<std::string>();
    ref.from_step = j.at("from_step").get<int64_t>();
    ref.world_size = j.at("world_size").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw bad_input(path, "malformed: " + json_error_text(e));
  }
  if (ref.from_step < 0) throw bad_input(path, "from_step must be >= 0, got " + std::to_string(ref.from_step));
  if (!ref.checkpoint.empty() && (ref.checkpoint.rfind("checkpoints/step-", 0) != 0 ||
                                  ref.checkpoint.find("..") != std::string::npos))
    throw bad_input(path, "checkpoint must name checkpoints/step-N of the run, got '" + ref.checkpoint + "'");
  if (ref.world_size != 1)
    throw bad_input(path, "the run had " + std::to_string(ref.world_size) +
                              " ranks: replaying a reference snapshot re-executes the run, and replay does that "
                              "with one process only; resume the run from " + ref.checkpoint +
                              " with the same ranks to study the step");
  return ref;
}

// A directory removed with everything in it when the replay ends, however it ends.
struct ScratchDir {
  std::string path;
  ScratchDir() {
    const auto base = std::filesystem::temp_directory_path();
    for (int i = 0;; ++i) {
      const auto p = base / ("gradguard-replay-" + std::to_string(::getpid()) + "-" + std::to_string(i));
      if (std::filesystem::create_directory(p)) {
        path = p.string();
        break;
      }
    }
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// A reference snapshot (forensics/snapshot.h): the trainer resumes from the referenced
// checkpoint (or starts the run again) in a scratch directory and re-executes every step
// up to the recorded one, as an exact resume does; just before it, the step's batch is
// taken apart on the re-executed weights. The step itself is the trainer's own, so on
// the CPU in fp32 its loss and gradient norm equal the recorded ones bit for bit.
void replay_from_reference(const std::string& dir, const Reference& ref, const config::Config& cfg,
                           const Evidence& evidence, const torch::Device& device, const ReplayOptions& options,
                           ReplayReport& r) {
  const auto run_dir = std::filesystem::path(dir).parent_path().parent_path();
  const auto checkpoint = run_dir / ref.checkpoint;
  if (!ref.checkpoint.empty() && !std::filesystem::is_directory(checkpoint))
    throw bad_input(checkpoint.string(), "is gone: the reference snapshot " + dir +
                                             " replays from it (training keeps it while the snapshot exists)");
  if (ref.from_step > r.step)
    throw bad_input(dir + "/reference.json", "from_step " + std::to_string(ref.from_step) + " is after the step " +
                                                 std::to_string(r.step));
  ScratchDir scratch;
  const std::string run = scratch.path + "/replay";
  if (!ref.checkpoint.empty()) {
    std::filesystem::create_directories(run + "/checkpoints");
    std::filesystem::create_directory_symlink(std::filesystem::absolute(checkpoint),
                                              run + "/checkpoints/" + checkpoint.filename().string());
  }
  config::Config c = cfg;
  c.run.dir = scratch.path, c.run.name = "replay", c.run.overwrite = true;
  c.run.device = options.device;
  c.log.progress = config::ProgressMode::kQuiet;
  c.log.report = false, c.log.tensorboard = false;
  c.telemetry.enabled = false;
  c.guard.snapshot.enabled = false;  // the step's evidence is the snapshot being replayed
  c.checkpoint.every = 0;            // nothing between the checkpoint and the step is kept
  c.eval.every = 0;                  // validation does not change training state
  std::FILE* devnull = std::fopen("/dev/null", "w");
  struct Close {
    std::FILE* f;
    ~Close() { if (f) std::fclose(f); }
  } close_devnull{devnull};
  train::Trainer trainer(c, devnull ? devnull : stdout, ref.checkpoint.empty() ? "" : run);
  bool analysed = false;
  const auto before = [&](model::LlamaForCausalLMImpl& model) {
    // The breakdown runs forward/backward passes of its own: the random state (dropout)
    // is put back so that the step itself runs as recorded.
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    const auto rng = generator.get_state();
    analyse(model, c, evidence, device, options, r);
    generator.set_state(rng);
    analysed = true;
  };
  try {
    trainer.run_until(r.step, before);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kHalted) throw;  // the recorded step halted the run: so does this one
  }
  if (!analysed) throw runtime_error(dir, "the re-executed run did not reach step " + std::to_string(r.step));
  // The step as the trainer ran it, from its metrics.
  bool found = false;
  std::istringstream lines(fs::read_file(run + "/metrics.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    const auto parsed = try_parse_json(line);
    if (!parsed) continue;
    const auto& j = *parsed;
    if (j.contains("event") || !j.contains("loss") || !j.contains("step") || !j["step"].is_number_integer() ||
        j["step"].get<int64_t>() != r.step)
      continue;
    r.loss = number_or_nan(j, "loss");
    r.grad_norm = number_or_nan(j, "grad_norm");
    r.nonfinite = !std::isfinite(r.grad_norm);
    found = true;
  }
  if (!found) throw runtime_error(dir, "the re-executed run wrote no metrics for step " + std::to_string(r.step));
  r.exact = (r.loss == r.recorded_loss || (std::isnan(r.loss) && std::isnan(r.recorded_loss))) &&
            (r.grad_norm == r.recorded_grad_norm || (!std::isfinite(r.grad_norm) && !std::isfinite(r.recorded_grad_norm)));
  r.replayed_from = ref.checkpoint_or_start() + ", re-executing steps " +
                    std::to_string(ref.from_step) + ".." + std::to_string(r.step);
}
}  // namespace

ReplayReport replay_snapshot(const std::string& dir, const ReplayOptions& options) {
  if (!(options.rtol > 0)) throw bad_input("--rtol", "must be > 0, got " + format_number(options.rtol));
  // A reference snapshot has reference.json where a full one has the model.
  const bool reference = fs::exists(dir + "/reference.json");
  for (const char* f : {"state.json", "config.yaml", "batch.safetensors", reference ? "reference.json" : "model/config.json"})
    if (!fs::exists(dir + "/" + f)) throw bad_input(dir, std::string("not a snapshot: ") + f + " is missing");
  const nlohmann::json state = read_json_file(dir + "/state.json");
  const Reference ref = reference ? read_reference(dir) : Reference{};
  // The snapshot's config.yaml holds the run's effective model; the model it was
  // fine-tuned from need not exist any more, unless the replay starts the run again.
  std::vector<std::string> keep_model;
  if (!reference || !ref.checkpoint.empty()) keep_model.push_back("model.init_from=");
  auto cfg = config::load_config(dir + "/config.yaml", keep_model);
  ReplayReport r;
  r.snapshot = dir;
  double loss_scale = 1;
  int64_t total_tokens = 0;
  std::vector<double> recorded_micro;
  try {
    r.step = state.at("step").get<int64_t>();
    r.kind = state.at("kind").get<std::string>();
    r.injected = state.value("injected", std::string());
    r.recorded_loss = number_or_nan(state, "loss");
    r.recorded_grad_norm = number_or_nan(state, "grad_norm");
    r.recorded_nonfinite = state.at("nonfinite").get<bool>();
    loss_scale = state.at("loss_scale").get<double>();
    total_tokens = state.at("tokens_per_step").get<int64_t>();
    if (!(loss_scale > 0) || !std::isfinite(loss_scale))
      throw bad_input(dir + "/state.json", "loss_scale must be a finite number > 0, got " + format_number(loss_scale));
    if (total_tokens <= 0)
      throw bad_input(dir + "/state.json", "tokens_per_step must be > 0, got " + std::to_string(total_tokens));
    if (r.step < 0) throw bad_input(dir + "/state.json", "step must be >= 0, got " + std::to_string(r.step));
    for (const auto& x : state.at("micro_losses"))
      recorded_micro.push_back(x.is_number() ? x.get<double>() : std::numeric_limits<double>::quiet_NaN());
  } catch (const nlohmann::json::exception& e) {
    throw bad_input(dir + "/state.json", "malformed: " + json_error_text(e));
  }

  auto batch = checkpoint::load_safetensors(dir + "/batch.safetensors");
  for (const char* k : {"inputs", "targets", "sample_index"})
    if (!batch.tensors.count(k)) throw bad_input(dir + "/batch.safetensors", std::string("has no tensor '") + k + "'");
  const auto inputs = batch.tensors["inputs"], targets = batch.tensors["targets"];
  const auto sample_index = batch.tensors["sample_index"];
  // Packed rows (chat/SFT data) carry their positions and segments.
  const auto positions = batch.tensors.count("positions") ? batch.tensors["positions"] : torch::Tensor();
  const auto segments = batch.tensors.count("segments") ? batch.tensors["segments"] : torch::Tensor();
  for (const auto& [name, t] : {std::pair<const char*, at::Tensor>{"positions", positions}, {"segments", segments}}) {
    if (t.defined() && (!t.sizes().equals(inputs.sizes()) ||
                        (t.scalar_type() != torch::kLong && t.scalar_type() != torch::kInt)))
      throw bad_input(dir + "/batch.safetensors", std::string(name) + " must be integers shaped as inputs");
  }
  if (inputs.dim() != 3 || !inputs.sizes().equals(targets.sizes()) || sample_index.dim() != 2 ||
      sample_index.size(0) != inputs.size(0) || sample_index.size(1) != inputs.size(1))
    throw bad_input(dir + "/batch.safetensors", "inputs/targets must be [accum, micro, T] and sample_index [accum, micro]");
  if (inputs.numel() == 0)
    throw bad_input(dir + "/batch.safetensors", "holds no tokens (no micro-batch or empty ones): nothing to replay");
  const auto model_options = reference ? cfg.model : checkpoint::read_hf_config(dir + "/model", cfg.model);
  for (const auto& [name, all] : {std::pair<const char*, at::Tensor>{"inputs", inputs}, {"targets", targets}}) {
    if (all.scalar_type() != torch::kLong && all.scalar_type() != torch::kInt)
      throw bad_input(dir + "/batch.safetensors", std::string(name) + " must hold integer token ids");
    // Targets that do not train (masked prompts, padding) hold data::kIgnoreTarget.
    const auto t = std::string(name) == "targets" ? all.masked_select(all != data::kIgnoreTarget) : all;
    if (t.numel() == 0) continue;
    const int64_t lo = t.min().item<int64_t>(), hi = t.max().item<int64_t>();
    if (lo < 0 || hi >= model_options.vocab_size)
      throw bad_input(dir + "/batch.safetensors", std::string(name) + " hold token ids in [" + std::to_string(lo) +
                                                      ", " + std::to_string(hi) + "], outside the vocabulary [0, " +
                                                      std::to_string(model_options.vocab_size) + ")");
  }

  const torch::Device device(options.device == "cpu" ? std::string("cpu") : options.device);
  const Evidence evidence{inputs, targets, positions, segments, sample_index, total_tokens, loss_scale, recorded_micro};
  if (reference) {
    replay_from_reference(dir, ref, cfg, evidence, device, options, r);
  } else {
    auto model = checkpoint::load_hf_model(dir + "/model", cfg.model);  // with its LoRA adapters, if any
    // In the run's working dtype (memory.weights_dtype), as its gradients were computed.
    if (cfg.memory.weights_dtype == amp::AmpDtype::kFp32)
      model->to(device);
    else
      model->to(device, cfg.memory.weights_dtype == amp::AmpDtype::kBf16 ? torch::kBFloat16 : torch::kHalf);
    analyse(*model, cfg, evidence, device, options, r);
    r.replayed_from = "the snapshot's weights";
  }
  r.reproduced = r.nonfinite == r.recorded_nonfinite && close(r.loss, r.recorded_loss, options.rtol) &&
                 (r.recorded_nonfinite || close(r.grad_norm, r.recorded_grad_norm, options.rtol));
  r.verdict = r.reproduced ? "reproduced" : "not_reproduced";
  if (r.reproduced)
    r.explanation = std::string(reference ? "the recorded step reproduces when the run is re-executed from " +
                                                ref.checkpoint_or_start() + " with the same data"
                                          : "the recorded step reproduces from its weights and batch") +
                    ": the anomaly is a deterministic consequence of this data and these numerics (look at the "
                    "samples below, or at the precision)";
  else if (r.injected == "nonfinite_gradients")
    r.explanation = "the recorded step carried a gradient fault injected on purpose (guard.inject), which replay "
                    "does not re-inject: the same weights and batch give a healthy step";
  else
    r.explanation = "the same weights and batch give a different step now: suspect non-determinism (kernels, "
                    "threads, collectives) or a hardware fault on the machine that recorded it";
  return r;
}

nlohmann::ordered_json ReplayReport::to_json() const {
  nlohmann::ordered_json micro_j = nlohmann::ordered_json::array();
  for (const auto& m : micro)
    micro_j.push_back({{"micro", m.index}, {"loss", json_number(m.loss)}, {"recorded_loss", json_number(m.recorded_loss)},
                       {"grad_norm", json_number(m.grad_norm)}, {"loss_zscore", json_number(m.loss_zscore)}});
  nlohmann::ordered_json samples_j = nlohmann::ordered_json::array();
  for (const auto& s : samples)
    samples_j.push_back({{"micro", s.micro}, {"row", s.row}, {"sample_index", s.sample_index}, {"loss", json_number(s.loss)},
                         {"grad_norm", json_number(s.grad_norm)}});
  return {{"snapshot", snapshot},     {"step", step},
          {"kind", kind},             {"verdict", verdict},
          {"reproduced", reproduced}, {"explanation", explanation},
          {"injected", injected},     {"loss", json_number(loss)},
          {"recorded_loss", json_number(recorded_loss)}, {"grad_norm", json_number(grad_norm)},
          {"recorded_grad_norm", json_number(recorded_grad_norm)}, {"nonfinite", nonfinite},
          {"recorded_nonfinite", recorded_nonfinite}, {"replayed_from", replayed_from},
          {"bitwise", exact}, {"micro_batches", micro_j},
          {"driving_micro", driving_micro}, {"top_samples", samples_j}};
}

std::string ReplayReport::to_text() const {
  std::ostringstream o;
  o << "replay of " << snapshot << " (step " << step << ", " << kind << "): "
    << (reproduced ? "REPRODUCED" : "NOT REPRODUCED") << "\n  " << explanation << "\n"
    << "  loss " << fmt(loss) << " (recorded " << fmt(recorded_loss) << "), grad norm " << fmt(grad_norm)
    << " (recorded " << fmt(recorded_grad_norm) << ")" << (exact ? ", bit for bit" : "") << "\n  replayed from "
    << replayed_from << "\n  micro-batches:\n";
  for (const auto& m : micro)
    o << "    " << m.index << ": loss " << fmt(m.loss) << " (recorded " << fmt(m.recorded_loss) << ", z "
      << fmt(m.loss_zscore) << "), grad norm " << fmt(m.grad_norm) << (m.index == driving_micro ? "  <- largest" : "")
      << "\n";
  if (!samples.empty()) {
    o << "  samples of micro-batch " << driving_micro << " with the largest gradients:\n";
    for (const auto& s : samples)
      o << "    sample " << s.sample_index << " (row " << s.row << "): loss " << fmt(s.loss) << ", grad norm "
        << fmt(s.grad_norm) << "\n";
  }
  return o.str();
}

}  // namespace gradguard::replay
