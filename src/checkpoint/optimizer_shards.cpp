// Shard files of the sharded optimizer: one safetensors file per rank plus a JSON layout.
// Loading maps the old flat ranges onto the new rank's range, so the world size may change
// between save and resume.
#include "gradguard/checkpoint/optimizer_shards.h"

#include <algorithm>
#include <cstdio>
#include <regex>

#include <torch/torch.h>

#include "gradguard/checkpoint/safetensors.h"
#include "gradguard/core/crc32c.h"
#include "gradguard/core/error.h"
#include "gradguard/core/fs.h"
#include "gradguard/core/json_read.h"

namespace gradguard::checkpoint {
namespace {

constexpr const char* kFormat = "gradguard-optimizer-shards-1";
constexpr int64_t kMaxRanks = 1 << 16;

// A shard file's tensor `name`: present, 1-D of `size` elements, floating point.
at::Tensor shard_tensor(const SafetensorsContents& c, const std::string& path, const std::string& name, int64_t size) {
  const auto it = c.tensors.find(name);
  if (it == c.tensors.end()) throw bad_input(path, "has no tensor \"" + name + "\"");
  const auto& t = it->second;
  if (t.dim() != 1 || t.size(0) != size || !t.is_floating_point())
    throw bad_input(path, "tensor \"" + name + "\" must be a 1-D float tensor of " + std::to_string(size) +
                              " elements (the layout's shard size)");
  return t;
}

}  // namespace

std::string optimizer_shard_file(int64_t rank, int64_t world_size) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "optimizer-shard-%05lld-of-%05lld.safetensors", static_cast<long long>(rank),
                static_cast<long long>(world_size));
  return buf;
}

bool is_optimizer_shard_file(const std::string& name) {
  static const std::regex shard("optimizer-shard-[0-9]{5}-of-[0-9]{5}\\.safetensors");
  return name == kOptimizerShardsLayout || std::regex_match(name, shard);
}

namespace {

// A shard's tie to its layout: crc32c of the world size, the shard size and every
// tensor's name and size, as 8 hex digits. A shard from another checkpoint, model or
// world size has another one.
std::string layout_fingerprint(int64_t world, int64_t shard, const std::vector<std::string>& names,
                               const std::vector<int64_t>& numels) {
  std::string text = std::to_string(world) + "|" + std::to_string(shard);
  for (size_t t = 0; t < names.size(); ++t) text += "|" + names[t] + ":" + std::to_string(numels[t]);
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", static_cast<unsigned>(crc32c(text.data(), text.size())));
  return hex;
}

// Shard `old` of a layout of `world` shards, read and checked for its place: the rank and
// world size it was written for, and the layout (a swapped or foreign shard, even with a
// manifest rewritten to match, would have every rank step another's moments). Shards
// written before the layout key have none.
SafetensorsContents read_shard(const std::string& dir, int64_t old, int64_t world, const std::string& fingerprint) {
  const std::string file = dir + "/" + optimizer_shard_file(old, world);
  if (!fs::exists(file)) throw bad_input(file, "missing: the layout lists " + std::to_string(world) + " shards");
  auto c = load_safetensors(file);
  const std::vector<std::pair<const char*, std::string>> expected = {
      {"rank", std::to_string(old)}, {"world_size", std::to_string(world)}, {"layout", fingerprint}};
  for (const auto& [key, value] : expected) {
    const auto it = c.metadata.find(key);
    if (it != c.metadata.end() && it->second != value)
      throw bad_input(file, std::string("records ") + key + " " + it->second + " where this file of the layout " +
                                kOptimizerShardsLayout + " must have " + value +
                                ": a shard swapped with another or taken from another checkpoint");
  }
  return c;
}

// What a layout file says, checked in itself (not yet against a model).
struct Layout {
  int64_t world = 1, total = 0, shard = 0;
  bool masters = false;
  std::vector<std::string> names;
  std::vector<int64_t> numels, steps;
  std::string fingerprint;
};

Layout read_layout(const std::string& path, const nlohmann::json& json) {
  const JsonReader r(json, path);
  if (r.string("format") != kFormat) r.fail("format", "must be \"" + std::string(kFormat) + "\"");
  Layout l;
  l.world = r.integer("world_size", 1, kMaxRanks);
  l.total = r.integer("total", 0);
  l.shard = r.integer("shard_size", 0);
  if (l.shard != (l.total + l.world - 1) / l.world)
    r.fail("shard_size", "is not ceil(total / world_size) = " + std::to_string((l.total + l.world - 1) / l.world));
  l.masters = r.boolean("masters");
  l.numels = r.integers("numels", 0);
  l.steps = r.integers("steps", 0);
  const auto& names = r.raw("names");
  if (!names.is_array() || names.size() != l.numels.size() || l.steps.size() != l.numels.size())
    r.fail("names", "must list one name per entry of numels and steps");
  for (const auto& n : names) {
    if (!n.is_string()) r.fail("names", "must hold strings, got " + describe(n));
    l.names.push_back(n.get<std::string>());
  }
  int64_t sum = 0;
  for (int64_t n : l.numels) sum += n;
  if (sum != l.total) r.fail("total", "is " + std::to_string(l.total) + ", the numels add up to " + std::to_string(sum));
  l.fingerprint = layout_fingerprint(l.world, l.shard, l.names, l.numels);
  return l;
}

}  // namespace

void save_optimizer_shard(const std::string& path, optim::ShardedOptimizer& optimizer) {
  NamedTensors tensors = {{"exp_avg", optimizer.exp_avg()}, {"exp_avg_sq", optimizer.exp_avg_sq()}};
  if (optimizer.has_masters()) tensors.emplace_back("master", optimizer.master());
  const auto& l = optimizer.layout();
  save_safetensors(path, tensors,
                   {{"format", kFormat},
                    {"rank", std::to_string(optimizer.sharding().rank)},
                    {"world_size", std::to_string(optimizer.sharding().world_size)},
                    {"layout", layout_fingerprint(l.world_size, l.shard_size, optimizer.names(), l.numels)}});
}

nlohmann::ordered_json optimizer_shards_layout(optim::ShardedOptimizer& optimizer) {
  const auto& l = optimizer.layout();
  nlohmann::ordered_json out = {{"format", kFormat},
                                {"world_size", l.world_size},
                                {"shard_size", l.shard_size},
                                {"total", l.total},
                                {"masters", optimizer.has_masters()},
                                {"decay_embeddings", optimizer.decay_embeddings()},
                                {"names", optimizer.names()},
                                {"numels", l.numels},
                                {"steps", optimizer.steps()}};
  return out;
}

void load_optimizer_shards(const std::string& dir, optim::ShardedOptimizer& opt) {
  const std::string path = dir + "/" + kOptimizerShardsLayout;
  const auto json = read_json_file(path);
  const Layout saved = read_layout(path, json);
  const JsonReader r(json, path);
  const int64_t world = saved.world, total = saved.total, shard = saved.shard;
  const bool masters = saved.masters;
  const auto& l = opt.layout();
  // The layout must describe this model's trainable tensors, in order.
  if (saved.names.size() != opt.names().size())
    throw bad_input(path, "describes " + std::to_string(saved.names.size()) + " trainable tensors, this model has " +
                              std::to_string(opt.names().size()) + ": the optimizer state of another model or LoRA layout");
  for (size_t t = 0; t < opt.names().size(); ++t) {
    if (saved.names[t] != opt.names()[t] || saved.numels[t] != l.numels[t])
      throw bad_input(path, "tensor " + std::to_string(t) + " is \"" + saved.names[t] + "\" of " +
                                std::to_string(saved.numels[t]) + " elements, this model's is \"" + opt.names()[t] +
                                "\" of " + std::to_string(l.numels[t]) + ": the optimizer state of another model");
  }
  if (total != l.total) r.fail("total", "is " + std::to_string(total) + ", this model has " + std::to_string(l.total));
  // Which tensors decay is part of the state's meaning; layouts from before the key decayed
  // the embedding. Only a trainable token embedding makes the difference.
  const bool saved_decay = r.has("decay_embeddings") ? r.boolean("decay_embeddings") : true;
  const bool has_embedding = std::any_of(opt.names().begin(), opt.names().end(), optim::is_token_embedding);
  if (has_embedding && saved_decay != opt.decay_embeddings())
    throw bad_input("optim.decay_embeddings",
                    std::string("the checkpoint ") + path + (saved_decay ? " decays" : " does not decay") +
                        " the token embedding and this run " + (opt.decay_embeddings() ? "does" : "does not") +
                        ": resume with --set optim.decay_embeddings=" + (saved_decay ? "true" : "false"));

  torch::NoGradGuard no_grad;
  const int64_t rank = opt.sharding().rank;
  const int64_t b = l.begin(rank), e = l.end(rank);
  opt.exp_avg().zero_();
  opt.exp_avg_sq().zero_();
  for (int64_t old = 0; old < world; ++old) {
    const int64_t old_b = std::min(total, old * shard), old_e = std::min(total, (old + 1) * shard);
    const int64_t lo = std::max(b, old_b), hi = std::min(e, old_e);
    const bool overlaps = lo < hi;
    // Masters this run does not keep go into the working weights: every old shard is read.
    const bool into_weights = masters && !opt.has_masters();
    if (!overlaps && !into_weights) continue;
    const std::string file = dir + "/" + optimizer_shard_file(old, world);
    const auto c = read_shard(dir, old, world, saved.fingerprint);
    if (into_weights) opt.set_flat_params(old_b, shard_tensor(c, file, "master", shard).narrow(0, 0, old_e - old_b));
    if (!overlaps) continue;
    const int64_t n = hi - lo;
    opt.exp_avg().narrow(0, lo - b, n).copy_(shard_tensor(c, file, "exp_avg", shard).narrow(0, lo - old_b, n));
    opt.exp_avg_sq().narrow(0, lo - b, n).copy_(shard_tensor(c, file, "exp_avg_sq", shard).narrow(0, lo - old_b, n));
    if (masters && opt.has_masters())
      opt.master().narrow(0, lo - b, n).copy_(shard_tensor(c, file, "master", shard).narrow(0, lo - old_b, n));
  }
  if (!masters && opt.has_masters()) opt.params_to_masters();
  opt.steps().assign(saved.steps.begin(), saved.steps.end());
}

std::vector<std::pair<std::string, at::Tensor>> load_master_weights(const std::string& dir) {
  const std::string path = dir + "/" + kOptimizerShardsLayout;
  if (!fs::exists(path)) return {};
  const Layout l = read_layout(path, read_json_file(path));
  if (!l.masters) return {};
  std::vector<at::Tensor> pieces;
  for (int64_t old = 0; old < l.world; ++old) {
    const int64_t old_b = std::min(l.total, old * l.shard), old_e = std::min(l.total, (old + 1) * l.shard);
    const auto c = read_shard(dir, old, l.world, l.fingerprint);
    pieces.push_back(shard_tensor(c, dir + "/" + optimizer_shard_file(old, l.world), "master", l.shard)
                         .narrow(0, 0, old_e - old_b)
                         .to(torch::kFloat));
  }
  const at::Tensor flat = torch::cat(pieces);
  std::vector<std::pair<std::string, at::Tensor>> out;
  int64_t at = 0;
  for (size_t t = 0; t < l.names.size(); ++t) {
    out.emplace_back(l.names[t], flat.narrow(0, at, l.numels[t]).clone());
    at += l.numels[t];
  }
  return out;
}

}  // namespace gradguard::checkpoint
