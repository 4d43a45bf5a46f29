// Maps global sample indices to windows of a token file and stacks them into batches.
// The order is a pure function of (k, N, T, shuffle, seed): no hidden cursor and no use
// of torch's RNG, so a resumed or replayed run asks for sample k and gets the same
// tokens. The per-epoch permutation is built from std::mt19937_64 and std::seed_seq,
// whose outputs the C++ standard fixes, with a hand-written Fisher-Yates and bounded
// draw: std::shuffle and std::uniform_int_distribution are implementation-defined and
// would give different orders with different standard libraries.
#include "gradguard/data/token_dataset.h"

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <random>
#include <utility>

#include "gradguard/core/error.h"

namespace gradguard::data {
namespace {

// Uniform integer in [0, bound) from a 64-bit generator by rejection, so every value
// is exactly equally likely and the result depends only on the generator's outputs.
uint64_t draw_below(std::mt19937_64& gen, uint64_t bound) {
  // Outputs below `threshold` (= 2^64 mod bound) would make the low residues likelier.
  const uint64_t threshold = (0 - bound) % bound;
  while (true) {
    const uint64_t r = gen();
    if (r >= threshold) return r % bound;
  }
}

}  // namespace

void DataOptions::validate() const {
  if (seq_len < 1) {
    throw bad_input("data.seq_len",
                    "must be >= 1 (tokens per sample), got " + std::to_string(seq_len));
  }
  if (train_path.empty()) {
    throw bad_input("data.train_path", "must name a token file, got an empty path");
  }
}

TokenDataset::TokenDataset(std::shared_ptr<const TokenFile> file, int64_t seq_len, bool shuffle,
                           uint64_t seed)
    : file_(std::move(file)), seq_len_(seq_len), shuffle_(shuffle), seed_(seed), num_samples_(0) {
  TORCH_INTERNAL_ASSERT(file_ != nullptr, "TokenDataset needs a token file");
  if (seq_len_ < 1) {
    throw bad_input("data.seq_len",
                    "must be >= 1 (tokens per sample), got " + std::to_string(seq_len_));
  }
  if (file_->size() < seq_len_ + 1) {
    throw bad_input(file_->path(),
                    "holds " + std::to_string(file_->size()) +
                        " tokens, fewer than the seq_len+1 = " + std::to_string(seq_len_ + 1) +
                        " one sample needs; use more data or a smaller data.seq_len");
  }
  num_samples_ = (file_->size() - 1) / seq_len_;
}

TokenDataset::Permutation TokenDataset::permutation(int64_t epoch) const {
  {
    std::lock_guard<std::mutex> lock(perm_mutex_);
    if (perm_epoch_ == epoch) return perm_;
  }
  // Built outside the lock: two threads asking for a new epoch at once both build it
  // (the same vector), and neither waits on the other's O(N) shuffle.
  const auto e = static_cast<uint64_t>(epoch);
  std::seed_seq seq{static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32),
                    static_cast<uint32_t>(e), static_cast<uint32_t>(e >> 32)};
  std::mt19937_64 gen(seq);
  auto perm = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(num_samples_));
  auto& p = *perm;
  for (int64_t i = 0; i < num_samples_; ++i) p[static_cast<size_t>(i)] = i;
  // Fisher-Yates: position i takes a uniformly chosen element of [0, i].
  for (int64_t i = num_samples_ - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(draw_below(gen, static_cast<uint64_t>(i) + 1));
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(j)]);
  }
  std::lock_guard<std::mutex> lock(perm_mutex_);
  perm_epoch_ = epoch;
  perm_ = std::move(perm);
  return perm_;
}

int64_t TokenDataset::offset_in(int64_t k, const Permutation& perm) const {
  const int64_t slot = k % num_samples_;
  if (!shuffle_) return slot * seq_len_;
  return (*perm)[static_cast<size_t>(slot)] * seq_len_;
}

int64_t TokenDataset::sample_offset(int64_t k) const {
  TORCH_INTERNAL_ASSERT(k >= 0, "sample index must be >= 0, got ", k);
  return offset_in(k, shuffle_ ? permutation(k / num_samples_) : nullptr);
}

Batch TokenDataset::batch(int64_t first, int64_t count) const {
  TORCH_INTERNAL_ASSERT(first >= 0 && count >= 0, "bad batch range ", first, "+", count);
  std::vector<int64_t> samples(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) samples[static_cast<size_t>(i)] = first + i;
  return batch(samples);
}

Batch TokenDataset::batch(const std::vector<int64_t>& samples) const {
  const auto rows = static_cast<int64_t>(samples.size());
  const auto options = torch::TensorOptions().dtype(torch::kInt64).device(torch::kCPU);
  Batch out{torch::empty({rows, seq_len_}, options), torch::empty({rows, seq_len_}, options)};
  int64_t* inputs = out.inputs.data_ptr<int64_t>();
  int64_t* targets = out.targets.data_ptr<int64_t>();
  Permutation perm;  // of epoch `perm_epoch`: looked up once per epoch the rows span, not per row
  int64_t perm_epoch = -1;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t k = samples[static_cast<size_t>(r)];
    TORCH_INTERNAL_ASSERT(k >= 0, "sample index must be >= 0, got ", k);
    if (shuffle_ && k / num_samples_ != perm_epoch) {
      perm_epoch = k / num_samples_;
      perm = permutation(perm_epoch);
    }
    // Window [p, p+T] lies inside the file: p <= (N-1)*T and N*T <= size-1.
    const int64_t offset = offset_in(k, perm);
    const auto copy = [&](const auto* window) {
      for (int64_t t = 0; t < seq_len_; ++t) {
        inputs[r * seq_len_ + t] = window[t];
        targets[r * seq_len_ + t] = window[t + 1];
      }
    };
    if (file_->width() == 2) {
      copy(file_->data() + offset);
    } else {
      copy(file_->data32() + offset);
    }
  }
  return out;
}

}  // namespace gradguard::data
