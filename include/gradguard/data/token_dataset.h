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
  // Throws gradguard::Error (bad input) naming the key, e.g. "data.seq_len".
  void validate() const;

  template <class Field>
  void fields(Field&& field) {
    field("train_path", train_path, "training token file (llm.c format, `gradguard prepare`)");
    field("val_path", val_path, "validation token file; \"\" disables validation");
    field("seq_len", seq_len, "T: tokens per sample (each sample reads T + 1 tokens); <= model.max_seq_len");
    field("shuffle", shuffle, "false: samples in file order; true: a seeded permutation per epoch");
  }
};

// One micro-batch: both [B, T] int64 on the CPU.
struct Batch {
  at::Tensor inputs;
  at::Tensor targets;
};

class TokenDataset {
 public:
  // Throws gradguard::Error (bad input) naming the file when it holds fewer than T+1
  // tokens (not even one sample).
  TokenDataset(std::shared_ptr<const TokenFile> file, int64_t seq_len, bool shuffle,
               uint64_t seed);

  int64_t num_samples() const { return num_samples_; }  // N
  int64_t seq_len() const { return seq_len_; }          // T
  const TokenFile& file() const { return *file_; }

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
  // Offset of sample k given the permutation of k's epoch (null without shuffling).
  int64_t offset_in(int64_t k, const Permutation& perm) const;

  std::shared_ptr<const TokenFile> file_;
  int64_t seq_len_;
  bool shuffle_;
  uint64_t seed_;
  int64_t num_samples_;
  mutable std::mutex perm_mutex_;       // guards the two members below
  mutable int64_t perm_epoch_ = -1;     // epoch whose permutation perm_ holds
  mutable Permutation perm_;            // the newest epoch's permutation (shared with readers)
};

}  // namespace gradguard::data
