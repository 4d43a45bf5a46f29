// Checkpoint directories with a CRC-32C manifest, committed by directory rename.
#include "gradguard/checkpoint/trainer_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include <torch/torch.h>

#include "gradguard/checkpoint/hf_checkpoint.h"
#include "gradguard/checkpoint/optimizer_shards.h"
#include "gradguard/core/crc32c.h"
#include "gradguard/core/error.h"
#include "gradguard/core/json_read.h"
#include "gradguard/core/fs.h"
#include "gradguard/core/run_dir.h"

namespace gradguard::checkpoint {
namespace stdfs = std::filesystem;
namespace {

const char* const kFiles[] = {"model.safetensors", "config.json", "optimizer.pt", "trainer_state.json",
                              "config.yaml"};
// Files only some checkpoints have (a LoRA run's adapter settings): listed and checked
// when present; one present but not listed is refused, as it cannot be trusted.
const char* const kOptionalFiles[] = {"lora.json"};

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%07lld", static_cast<long long>(step));
  return buf;
}

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

nlohmann::json read_json(const std::string& path) { return read_json_file(path); }

// Checks the HF config.json of a checkpoint against the model being resumed.
void check_architecture(const std::string& dir, const model::LlamaOptions& current, const model::LoraOptions& lora) {
  const std::string difference = architecture_difference(dir, current, lora);
  if (!difference.empty())
    throw bad_input(dir + "/config.json", "the checkpoint has " + difference +
                                              ": the model changed between save and resume");
}

}  // namespace

std::string architecture_difference(const std::string& dir, const model::LlamaOptions& current,
                                    const model::LoraOptions& lora) {
  const auto saved = read_hf_config(dir, current);
  std::string out;
  auto differ = [&](const char* key, auto a, auto b) {
    if (a != b && out.empty())
      out = std::string(key) + " = " + std::to_string(a) + " but the configuration asks for " + std::to_string(b);
  };
  differ("model.vocab_size", saved.vocab_size, current.vocab_size);
  differ("model.hidden_size", saved.hidden_size, current.hidden_size);
  differ("model.intermediate_size", saved.intermediate_size, current.intermediate_size);
  differ("model.num_layers", saved.num_layers, current.num_layers);
  differ("model.num_heads", saved.num_heads, current.num_heads);
  differ("model.num_kv_heads", saved.num_kv_heads, current.num_kv_heads);
  differ("model.tie_embeddings", saved.tie_embeddings, current.tie_embeddings);
  const auto saved_lora = read_lora_config(dir);
  differ("lora.rank", saved_lora.rank, lora.rank);
  if (out.empty() && saved_lora.enabled() && lora.enabled()) {
    if (saved_lora.alpha != lora.alpha)
      out = "lora.alpha = " + format_number(saved_lora.alpha) + " but the configuration asks for " +
            format_number(lora.alpha);
    auto names = [](const model::LoraOptions& o) {
      std::set<std::string> n;
      for (auto t : o.targets) n.insert(name_of(t));
      return n;
    };
    if (out.empty() && names(saved_lora) != names(lora)) {
      auto list = [](const std::set<std::string>& n) {
        std::string s;
        for (const auto& x : n) s += (s.empty() ? "" : ", ") + x;
        return "[" + s + "]";
      };
      out = "lora.targets = " + list(names(saved_lora)) + " but the configuration asks for " + list(names(lora));
    }
  }
  return out;
}

std::string save_checkpoint(const std::string& root, int64_t step, model::LlamaForCausalLMImpl& model,
                            torch::optim::Optimizer& optimizer, const nlohmann::json& trainer_state,
                            const std::string& config_yaml, int64_t keep_last,
                            const std::vector<std::string>& extra_files, const std::set<std::string>& pinned) {
  const stdfs::path final_dir = stdfs::path(root) / step_name(step);
  const stdfs::path tmp = stdfs::path(root) / (".tmp-" + step_name(step));
  try {
    stdfs::remove_all(tmp);
    stdfs::create_directories(tmp);
    save_hf_model(tmp.string(), model);
    {
      // The archive goes through our own file writer. LibTorch's file writer throws
      // from its destructor when a write has failed (a full disk): during the unwinding
      // of its own first exception that is std::terminate. So the first failure is
      // remembered here, LibTorch is told every write succeeded, and the error is raised
      // afterwards, from our side.
      torch::serialize::OutputArchive archive;
      optimizer.save(archive);
      fs::AtomicFile file((tmp / "optimizer.pt").string());
      std::exception_ptr failure;
      archive.save_to([&](const void* data, size_t n) -> size_t {
        if (!failure) {
          try {
            file.write(data, n);
          } catch (...) {
            failure = std::current_exception();
          }
        }
        return n;
      });
      if (failure) std::rethrow_exception(failure);
      file.commit();
    }
    fs::write_file_atomic((tmp / "trainer_state.json").string(), trainer_state.dump(1) + "\n");
    fs::write_file_atomic((tmp / "config.yaml").string(), config_yaml);
    std::vector<std::string> extra_names;
    for (const auto& path : extra_files) {
      const std::string name = stdfs::path(path).filename().string();
      TORCH_INTERNAL_ASSERT(is_optimizer_shard_file(name), "save_checkpoint: unexpected extra file ", name);
      stdfs::rename(path, tmp / name);
      extra_names.push_back(name);
    }
    nlohmann::ordered_json manifest = {{"format", "gradguard-checkpoint-1"}, {"step", step}};
    auto list = [&](const char* name) {
      uint64_t size = 0;
      const uint32_t crc = crc32c_file((tmp / name).string(), &size);
      manifest["files"][name] = {{"size", size}, {"crc32c", crc}};
    };
    for (const char* name : kFiles) list(name);
    for (const char* name : kOptionalFiles)
      if (fs::exists((tmp / name).string())) list(name);
    for (const auto& name : extra_names) list(name.c_str());
    fs::write_file_atomic((tmp / "manifest.json").string(), manifest.dump(1) + "\n");
    fsync_path(tmp.string());
    stdfs::remove_all(final_dir);
    stdfs::rename(tmp, final_dir);
    fsync_path(root);
    fs::write_file_atomic((stdfs::path(root) / "latest").string(), step_name(step) + "\n");
  } catch (const std::exception& e) {
    std::error_code ec;
    stdfs::remove_all(tmp, ec);
    throw runtime_error(final_dir.string(), std::string("checkpoint not written (") + e.what() +
                                                "); earlier checkpoints are intact");
  }
  if (keep_last > 0) {
    // Pruning is housekeeping: the new checkpoint is complete, so a directory that cannot
    // be listed or removed is left where it is.
    std::vector<stdfs::path> dirs;
    std::error_code ec;
    for (stdfs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
      std::error_code type_ec;
      if (it->is_directory(type_ec) && it->path().filename().string().rfind("step-", 0) == 0)
        dirs.push_back(it->path());
    }
    std::sort(dirs.begin(), dirs.end());
    for (size_t i = 0; i + keep_last < dirs.size(); ++i)
      if (!pinned.count(dirs[i].filename().string())) stdfs::remove_all(dirs[i], ec);
  }
  return final_dir.string();
}

void verify_checkpoint(const std::string& dir) {
  const std::string manifest_path = dir + "/manifest.json";
  if (!fs::exists(manifest_path)) throw bad_input(manifest_path, "missing: not a complete checkpoint");
  const auto manifest = read_json(manifest_path);
  const JsonReader files = JsonReader(manifest, manifest_path).object("files");
  std::vector<const char*> optional(std::begin(kOptionalFiles), std::end(kOptionalFiles));
  optional.push_back(kOptimizerShardsLayout);
  for (const char* name : optional)
    if (!files.has(name) && fs::exists(dir + "/" + name))
      throw bad_input(dir + "/" + name, "is not listed in the manifest: it is not part of this checkpoint");
  std::vector<std::string> names(std::begin(kFiles), std::end(kFiles));
  for (const char* name : kOptionalFiles)
    if (files.has(name)) names.push_back(name);
  // A sharded optimizer's files: each listed one is checked like the others (only these
  // names, so a manifest cannot point outside the directory).
  for (const auto& item : manifest.at("files").items())
    if (is_optimizer_shard_file(item.key())) names.push_back(item.key());
  for (const std::string& name : names) {
    const std::string path = dir + "/" + name;
    if (!files.has(name.c_str())) throw bad_input(manifest_path, std::string("does not list ") + name);
    const JsonReader entry = files.object(name.c_str());
    const int64_t listed_size = entry.integer("size", 0);
    const int64_t listed_crc = entry.integer("crc32c", 0, 0xffffffffLL);
    if (!fs::exists(path)) throw bad_input(path, "missing (listed in the manifest)");
    uint64_t size = 0;
    const uint32_t crc = crc32c_file(path, &size);
    if (static_cast<uint64_t>(listed_size) != size)
      throw bad_input(path, "size " + std::to_string(size) + " does not match the manifest (" +
                                std::to_string(listed_size) + "): truncated or replaced");
    if (static_cast<uint32_t>(listed_crc) != crc)
      throw bad_input(path, "checksum does not match the manifest: the file is corrupt");
  }
}

std::vector<std::string> resumable_checkpoints(const std::string& run_dir, std::vector<std::string>* rejected) {
  const RunDir run(run_dir);
  const stdfs::path root = run.checkpoints();
  std::error_code ec;
  if (!stdfs::is_directory(root, ec)) throw bad_input(run_dir, "has no checkpoints/ directory to resume from");
  std::vector<std::string> candidates;
  auto reject = [&](const std::string& why) {
    if (rejected != nullptr) rejected->push_back(why);
  };
  const std::string latest = run.latest_checkpoint_link();
  if (fs::exists(latest)) {
    try {
      std::string name = fs::read_file(latest, 256);
      while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
      if (!name.empty() && name.find('/') == std::string::npos && name != "." && name != "..")
        candidates.push_back((root / name).string());
      else
        reject(latest + ": does not name a checkpoint directory");
    } catch (const Error& e) {
      reject(e.what());
    }
  }
  std::vector<std::string> dirs;
  for (stdfs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (it->is_directory(type_ec) && it->path().filename().string().rfind("step-", 0) == 0)
      dirs.push_back(it->path().string());
  }
  if (ec) reject(root.string() + ": cannot be listed completely (" + ec.message() + ")");
  std::sort(dirs.rbegin(), dirs.rend());
  for (const auto& d : dirs)
    if (std::find(candidates.begin(), candidates.end(), d) == candidates.end()) candidates.push_back(d);
  std::vector<std::string> good;
  for (const auto& dir : candidates) {
    try {
      verify_checkpoint(dir);
      good.push_back(dir);
    } catch (const Error& e) {
      reject(e.what());
    } catch (const stdfs::filesystem_error& e) {
      reject(dir + ": " + e.what());
    }
  }
  if (good.empty()) throw bad_input(run_dir, "no checkpoint verifies against its manifest; nothing to resume from");
  return good;
}

std::string find_resumable(const std::string& run_dir, std::vector<std::string>* rejected) {
  return resumable_checkpoints(run_dir, rejected).front();
}

CheckpointContents load_checkpoint(const std::string& dir, model::LlamaForCausalLMImpl& model,
                                   torch::optim::Optimizer& optimizer) {
  check_architecture(dir, model.options(), model.lora());
  CheckpointContents c;
  c.dir = dir;
  c.trainer_state = read_json(dir + "/trainer_state.json");
  if (!c.trainer_state.contains("step") || !c.trainer_state["step"].is_number_integer())
    throw bad_input(dir + "/trainer_state.json", "has no integer \"step\"");
  c.step = c.trainer_state["step"].get<int64_t>();
  load_hf_weights(dir, model);
  const bool saved_sharded = fs::exists(dir + "/" + kOptimizerShardsLayout);
  if (auto* sharded = dynamic_cast<optim::ShardedOptimizer*>(&optimizer)) {
    if (!saved_sharded)
      throw bad_input(dir + "/optimizer.pt",
                      "holds a replicated optimizer state and this run shards it (memory.zero_stage, "
                      "memory.master_weights with bf16/fp16 weights, memory.offload_optimizer): resume with the "
                      "checkpoint's memory settings");
    load_optimizer_shards(dir, *sharded);
    return c;
  }
  if (saved_sharded)
    throw bad_input(dir + "/" + kOptimizerShardsLayout,
                    "the checkpoint's optimizer state is sharded (memory.zero_stage, memory.master_weights, "
                    "memory.offload_optimizer) and this run keeps it whole: resume with the checkpoint's memory "
                    "settings");
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(dir + "/optimizer.pt");
    optimizer.load(archive);
  } catch (const c10::Error& e) {
    throw bad_input(dir + "/optimizer.pt",
                    std::string("cannot be loaded into this optimizer (optim.name changed? or optim.decay_embeddings: "
                                "runs made before it existed decayed the token embedding, resume those with --set "
                                "optim.decay_embeddings=true): ") +
                        e.what_without_backtrace());
  }
  return c;
}

}  // namespace gradguard::checkpoint
