// Trainer checkpoints: everything a resume needs to continue bit-exactly.
//
//   checkpoints/step-NNNNNNN/   (N = optimizer steps completed)
//     model.safetensors, config.json   the model as an HF directory (loads in Python)
//     optimizer.pt                     optimizer state (LibTorch archive)
//     trainer_state.json               step, loss scaler, clipper windows, RNG state
//     config.yaml                      the effective configuration
//     manifest.json                    size and CRC-32C of every file above
//   checkpoints/latest                 name of the newest complete checkpoint
//
// A checkpoint is written into checkpoints/.tmp-step-NNNNNNN, every file fsync'd, then
// renamed into place; `latest` is updated only after that. A crash or a full disk at any
// moment leaves the previous checkpoints intact. Data position needs no state: sample
// order is a function of the step (docs/design.md).
#pragma once

#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gradguard/model/llama.h"

namespace torch::optim {
class Optimizer;
}

namespace gradguard::checkpoint {

struct CheckpointContents {
  int64_t step = 0;               // optimizer steps completed
  nlohmann::json trainer_state;   // as saved
  std::string dir;                // the checkpoint directory
};

// Writes a checkpoint for `step` under `root` (the run's checkpoints/ directory) and
// prunes all but the newest `keep_last` (0 keeps all). Returns its directory. Throws
// gradguard::Error (runtime) naming the file when writing fails; the temporary directory
// is removed and older checkpoints are untouched. `extra_files` (paths) are moved into
// the checkpoint and listed in its manifest: the sharded optimizer's files
// (checkpoint/optimizer_shards.h), written by every rank before rank 0 commits.
// Checkpoints named in `pinned` (step-N directory names) are never pruned: a reference
// snapshot (forensics/snapshot.h) replays from them.
std::string save_checkpoint(const std::string& root, int64_t step, model::LlamaForCausalLMImpl& model,
                            torch::optim::Optimizer& optimizer, const nlohmann::json& trainer_state,
                            const std::string& config_yaml, int64_t keep_last,
                            const std::vector<std::string>& extra_files = {},
                            const std::set<std::string>& pinned = {});

// Checks every file of `dir` against its manifest (presence, size, CRC-32C). Throws
// gradguard::Error (bad input) naming the file and the mismatch.
void verify_checkpoint(const std::string& dir);

// The newest checkpoint of a run that verifies: `latest` first, then the step
// directories newest first. Each rejected one adds a line to `rejected`. Throws
// gradguard::Error (bad input) when the run has none.
std::string find_resumable(const std::string& run_dir, std::vector<std::string>* rejected);
// Every checkpoint of a run that verifies, newest first (`latest` leads); the ones that do
// not are reported in `rejected`. A directory that cannot be listed (a symlink loop, no
// permission) is reported too. Throws gradguard::Error (bad input) when none verifies.
std::vector<std::string> resumable_checkpoints(const std::string& run_dir, std::vector<std::string>* rejected);

// The architecture keys (vocab, widths, layers, heads, tied embeddings) on which the
// model saved in checkpoint `dir` and `current` differ, as "model.num_layers = 2 but the
// configuration asks for 3"; empty when they agree. Throws gradguard::Error (bad input)
// when the checkpoint's config.json cannot be read. A difference is a configuration that
// changed between save and resume, not a broken checkpoint: resume stops there instead
// of trying older checkpoints (which have the same architecture).
// The LoRA settings count as architecture: a checkpoint's lora.json (rank, alpha, targets)
// against `lora` ("lora.rank = 8 but the configuration asks for 0").
std::string architecture_difference(const std::string& dir, const model::LlamaOptions& current,
                                    const model::LoraOptions& lora = {});

// Loads a verified checkpoint into the model and optimizer (which must have the same
// architecture and parameter groups). A sharded optimizer (optim/sharded_optimizer.h)
// loads its rank's range from the shard files; a replicated state into a sharded
// optimizer, or the reverse, is refused naming memory.*. Throws gradguard::Error (bad input) naming the
// file: a model that does not match (e.g. the config changed between save and resume)
// names the differing key.
CheckpointContents load_checkpoint(const std::string& dir, model::LlamaForCausalLMImpl& model,
                                   torch::optim::Optimizer& optimizer);

}  // namespace gradguard::checkpoint
