// The sharded optimizer's state in a checkpoint (optim/sharded_optimizer.h):
//
//   optimizer_shards.json                         the layout: world size, shard size S,
//                                                 P, whether masters are kept, and every
//                                                 tensor's name, size and update count
//   optimizer-shard-RRRRR-of-WWWWW.safetensors    rank R's state: exp_avg, exp_avg_sq
//                                                 [S] (and master [S]), one file per rank
//
// Every rank writes its own shard; rank 0 adds the layout and commits them with the rest
// of the checkpoint, all covered by its manifest (checkpoint/trainer_checkpoint.h). A
// resume may use another world size: each rank reads, from the old shards that overlap
// its new range, just that range. Only the layout must match the model: the same
// trainable tensors in the same order with the same sizes.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "gradguard/optim/sharded_optimizer.h"

namespace gradguard::checkpoint {

inline constexpr const char* kOptimizerShardsLayout = "optimizer_shards.json";

// "optimizer-shard-00001-of-00002.safetensors"
std::string optimizer_shard_file(int64_t rank, int64_t world_size);
// Whether `name` is a file a sharded checkpoint may list (the layout or a shard file).
bool is_optimizer_shard_file(const std::string& name);

// Writes this rank's shard to `path` (atomically). Throws gradguard::Error (runtime)
// naming the path when it cannot be written.
void save_optimizer_shard(const std::string& path, optim::ShardedOptimizer& optimizer);
// The layout file's content (the same on every rank).
nlohmann::ordered_json optimizer_shards_layout(optim::ShardedOptimizer& optimizer);

// Loads this rank's range of the state from checkpoint `dir`, whatever world size saved
// it. The working weights must already hold the checkpoint's (load_hf_weights): masters
// the checkpoint lacks are taken from them, masters this run does not keep are written
// into them. Throws gradguard::Error (bad input) naming the file: a layout of another
// model, a shard that is missing or malformed.
void load_optimizer_shards(const std::string& dir, optim::ShardedOptimizer& optimizer);

// The float32 master weights a sharded checkpoint `dir` keeps, gathered from every shard:
// (tensor name, flat [numel]) in the layout's order. Empty when it keeps none or has no
// sharded optimizer state. Throws gradguard::Error (bad input) naming the file, as above.
std::vector<std::pair<std::string, at::Tensor>> load_master_weights(const std::string& dir);

}  // namespace gradguard::checkpoint
