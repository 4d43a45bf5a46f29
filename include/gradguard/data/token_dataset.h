// TokenDataset serves fixed-length training samples from a token file in a fully
// deterministic order, which exact resume and the replay of a recorded step rely on.
//
// Sample k (a global, ever-increasing index) is tokens[p : p+T+1] with inputs the first
// T tokens and targets the same window shifted by one. Without shuffling p = (k mod N)*T
// where N = floor((size-1)/T) is the number of whole samples, so consumption wraps at
// the end of the data. With shuffling, epoch e = k / N uses its own permutation of the
// N samples, drawn from a 64-bit Mersenne Twister seeded with (seed, e), so the order
// depends only on the seed and never on torch's RNG state.
//
// A file with token flags (chat/SFT data, token_file.h) is a list of samples instead of
// one stream, and a row is built from whole samples: with `packing`, consecutive samples
// (file order) share a row as long as they fit its T + 1 tokens, each with positions
// restarting at 0 and its own segment id so attention stays inside it (Batch::positions,
// Batch::segments); without, one sample per row. The rest of a row is padding. A target is
// kept only when the flags mark it trained and it is not the first token of a sample;
// every other target is kIgnoreTarget. A sample longer than T + 1 tokens is truncated to
// its first T + 1 (or dropped, data.overlong), and a sample left with no trained target is
// dropped; SampleStats counts both. Row k is then what sample k is for a stream file.
//
// A dataset may be read from several threads at once (the trainer's batch prefetcher
// builds the next step's batches while the main thread may read a snapshot's): the
// token file is a read-only map and the one cached permutation sits behind a mutex.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

#include "gradguard/data/token_file.h"

namespace gradguard::data {

struct DataOptions {
  std::string train_path = "data/brown/train.bin";
  std::string val_path = "data/brown/val.bin";
  int64_t seq_len = 64;
  bool shuffle = false;
  bool packing = true;                 // files with samples: several samples per row
  std::string overlong = "truncate";   // files with samples: a sample over T + 1 tokens, truncate | drop
  // Throws gradguard::Error (bad input) naming the key, e.g. "data.seq_len".
  void validate() const;

  template <class Field>
  void fields(Field&& field) {
    field("train_path", train_path, "training token file (llm.c format, `gradguard prepare`)");
    field("val_path", val_path, "validation token file; \"\" disables validation");
    field("seq_len", seq_len, "T: tokens per sample (each sample reads T + 1 tokens); <= model.max_seq_len");
    field("shuffle", shuffle, "false: samples in file order; true: a seeded permutation per epoch");
    field("packing", packing,
          "chat/SFT token files: pack several samples per row (attention kept inside each); false: one per row, padded");
    field("overlong", overlong,
          "chat/SFT token files: a sample longer than seq_len + 1 tokens is truncated to its first seq_len + 1, or "
          "dropped (truncate | drop)");
  }
};

// Targets that do not count in the loss (cross-entropy's ignore_index).
constexpr int64_t kIgnoreTarget = -100;

// One micro-batch: all [B, T] int64 on the CPU. positions and segments are defined only
// for packed rows (see above): the rotary position of each token and its sample's id in
// the row.
struct Batch {
  at::Tensor inputs;
  at::Tensor targets;  // kIgnoreTarget where the token is not trained
  at::Tensor positions;
  at::Tensor segments;
};

// What building the rows of a file with samples did (all 0 for a stream file).
struct SampleStats {
  int64_t samples = 0;       // in the file
  int64_t truncated = 0;     // cut to T + 1 tokens
  int64_t dropped_long = 0;  // dropped as longer than T + 1 (data.overlong: drop)
  int64_t dropped_untrainable = 0;  // dropped: no trained target (after truncation)
  int64_t rows = 0;
  int64_t trained_targets = 0;  // over all rows
};

class TokenDataset {
 public:
  // Throws gradguard::Error (bad input) naming the file when it holds fewer than T+1
  // tokens (not even one sample).
  // Also when a file with samples keeps no sample at all. `drop_overlong`: data.overlong
  // is drop (else truncate).
  TokenDataset(std::shared_ptr<const TokenFile> file, int64_t seq_len, bool shuffle,
               uint64_t seed, bool packing = true, bool drop_overlong = false);

  int64_t num_samples() const { return num_samples_; }  // N
  int64_t seq_len() const { return seq_len_; }          // T
  const TokenFile& file() const { return *file_; }
  bool has_samples() const { return file_->has_flags(); }
  const SampleStats& sample_stats() const { return stats_; }

  // Trained targets in the row of global sample k (T for a stream file), and summed over
  // samples first .. first+count-1: a step's loss divisor, known on the host before any
  // forward (the samples of all ranks of data step d are d*G .. d*G+G-1, step_batches.h).
  int64_t trained_targets(int64_t k) const;
  int64_t trained_targets(int64_t first, int64_t count) const;

  // Token offset p of global sample k (k >= 0; wraps at N as described above).
  // Thread-safe, as are both batch() overloads.
  int64_t sample_offset(int64_t k) const;

  // Samples first, first+1, ..., first+count-1 stacked into a batch.
  Batch batch(int64_t first, int64_t count) const;

  // The same, for an explicit list of global sample indices (used by per-rank sharding
  // and replay).
  Batch batch(const std::vector<int64_t>& samples) const;

 private:
  using Permutation = std::shared_ptr<const std::vector<int64_t>>;  // [N] slot -> sample in file order
  Permutation permutation(int64_t epoch) const;
  // Row of sample k given the permutation of k's epoch (null without shuffling).
  int64_t row_in(int64_t k, const Permutation& perm) const;
  int64_t offset_in(int64_t k, const Permutation& perm) const { return row_in(k, perm) * seq_len_; }
  void build_rows(bool packing, bool drop_overlong);
  void fill_row(int64_t row, int64_t* inputs, int64_t* targets, int64_t* positions, int64_t* segments) const;

  std::shared_ptr<const TokenFile> file_;
  int64_t seq_len_;
  bool shuffle_;
  uint64_t seed_;
  int64_t num_samples_;
  bool packed_ = false;
  // Files with samples: row r holds pieces row_begin_[r] .. row_begin_[r+1]-1, each a
  // (token offset, length) of one sample; row_trained_[r] its trained targets.
  std::vector<int64_t> row_begin_;
  std::vector<std::pair<int64_t, int64_t>> pieces_;
  std::vector<int64_t> row_trained_;
  SampleStats stats_;
  mutable std::mutex perm_mutex_;       // guards the two members below
  mutable int64_t perm_epoch_ = -1;     // epoch whose permutation perm_ holds
  mutable Permutation perm_;            // the newest epoch's permutation (shared with readers)
};

}  // namespace gradguard::data
