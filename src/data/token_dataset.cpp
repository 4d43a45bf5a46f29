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
  if (overlong != "truncate" && overlong != "drop") {
    throw bad_input("data.overlong", "unknown value \"" + overlong + "\" (valid: truncate, drop)");
  }
}

TokenDataset::TokenDataset(std::shared_ptr<const TokenFile> file, int64_t seq_len, bool shuffle,
                           uint64_t seed, bool packing, bool drop_overlong)
    : file_(std::move(file)), seq_len_(seq_len), shuffle_(shuffle), seed_(seed), num_samples_(0) {
  TORCH_INTERNAL_ASSERT(file_ != nullptr, "TokenDataset needs a token file");
  if (seq_len_ < 1) {
    throw bad_input("data.seq_len",
                    "must be >= 1 (tokens per sample), got " + std::to_string(seq_len_));
  }
  if (file_->has_flags()) {
    build_rows(packing, drop_overlong);
    return;
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

void TokenDataset::build_rows(bool packing, bool drop_overlong) {
  packed_ = packing;
  const uint8_t* flags = file_->flags();
  const int64_t n = file_->size();
  const int64_t cap = seq_len_ + 1;  // tokens in a row
  row_begin_.push_back(0);
  int64_t used = 0;  // tokens of the open row
  int64_t trained = 0;
  auto close_row = [&] {
    if (static_cast<int64_t>(pieces_.size()) == row_begin_.back()) return;
    row_begin_.push_back(static_cast<int64_t>(pieces_.size()));
    row_trained_.push_back(trained);
    used = trained = 0;
  };
  for (int64_t start = 0; start < n;) {
    int64_t end = start + 1;
    while (end < n && (flags[end] & kTokenSampleStart) == 0) ++end;
    int64_t length = end - start;
    ++stats_.samples;
    if (length > cap) {
      if (drop_overlong) {
        ++stats_.dropped_long;
        start = end;
        continue;
      }
      length = cap;
      ++stats_.truncated;
    }
    int64_t targets = 0;  // the first token of a sample is never a target
    for (int64_t t = start + 1; t < start + length; ++t) targets += flags[t] & kTokenTrained;
    if (targets == 0) {
      ++stats_.dropped_untrainable;
      start = end;
      continue;
    }
    if (!packing || used + length > cap) close_row();
    pieces_.emplace_back(start, length);
    used += length;
    trained += targets;
    stats_.trained_targets += targets;
    start = end;
  }
  close_row();
  stats_.rows = static_cast<int64_t>(row_trained_.size());
  num_samples_ = stats_.rows;
  if (num_samples_ == 0) {
    throw bad_input(file_->path(), "holds " + std::to_string(stats_.samples) + " samples and none is left to train on (" +
                                       std::to_string(stats_.dropped_long) + " longer than seq_len + 1 = " +
                                       std::to_string(cap) + " tokens and dropped, " +
                                       std::to_string(stats_.dropped_untrainable) + " with no trained target" +
                                       (stats_.truncated > 0 ? " after truncation to seq_len + 1" : "") + ")");
  }
}

int64_t TokenDataset::row_in(int64_t k, const Permutation& perm) const {
  const int64_t slot = k % num_samples_;
  if (!shuffle_) return slot;
  return (*perm)[static_cast<size_t>(slot)];
}

int64_t TokenDataset::trained_targets(int64_t k) const {
  TORCH_INTERNAL_ASSERT(k >= 0, "sample index must be >= 0, got ", k);
  if (!has_samples()) return seq_len_;
  return row_trained_[static_cast<size_t>(row_in(k, shuffle_ ? permutation(k / num_samples_) : nullptr))];
}

int64_t TokenDataset::trained_targets(int64_t first, int64_t count) const {
  if (!has_samples()) return seq_len_ * count;
  int64_t total = 0;
  Permutation perm;
  int64_t perm_epoch = -1;
  for (int64_t k = first; k < first + count; ++k) {
    if (shuffle_ && k / num_samples_ != perm_epoch) {
      perm_epoch = k / num_samples_;
      perm = permutation(perm_epoch);
    }
    total += row_trained_[static_cast<size_t>(row_in(k, perm))];
  }
  return total;
}

void TokenDataset::fill_row(int64_t row, int64_t* inputs, int64_t* targets, int64_t* positions,
                            int64_t* segments) const {
  const uint8_t* flags = file_->flags();
  const int64_t T = seq_len_;
  int64_t at = 0;  // next slot of the row's T + 1 tokens; slot i < T is input i, slot i > 0 target i-1
  int64_t segment = 0;
  auto put = [&](int64_t token, bool target, int64_t position) {
    if (at < T) {
      inputs[at] = token;
      if (positions) positions[at] = position;
      if (segments) segments[at] = segment;
    }
    if (at > 0) targets[at - 1] = target ? token : kIgnoreTarget;
    ++at;
  };
  for (int64_t p = row_begin_[static_cast<size_t>(row)]; p < row_begin_[static_cast<size_t>(row) + 1]; ++p) {
    const auto [start, length] = pieces_[static_cast<size_t>(p)];
    for (int64_t t = 0; t < length; ++t)
      put(file_->token(start + t), t > 0 && (flags[start + t] & kTokenTrained) != 0, t);
    ++segment;
  }
  // Padding: token 0, never a target, a segment of its own (it attends to itself only).
  for (int64_t position = 0; at <= T; ++position) put(0, false, position);
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
  Batch out{torch::empty({rows, seq_len_}, options), torch::empty({rows, seq_len_}, options), {}, {}};
  if (has_samples()) {
    if (packed_) {
      out.positions = torch::empty({rows, seq_len_}, options);
      out.segments = torch::empty({rows, seq_len_}, options);
    }
    Permutation perm;
    int64_t perm_epoch = -1;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t k = samples[static_cast<size_t>(r)];
      TORCH_INTERNAL_ASSERT(k >= 0, "sample index must be >= 0, got ", k);
      if (shuffle_ && k / num_samples_ != perm_epoch) {
        perm_epoch = k / num_samples_;
        perm = permutation(perm_epoch);
      }
      const int64_t at = r * seq_len_;
      fill_row(row_in(k, perm), out.inputs.data_ptr<int64_t>() + at, out.targets.data_ptr<int64_t>() + at,
               packed_ ? out.positions.data_ptr<int64_t>() + at : nullptr,
               packed_ ? out.segments.data_ptr<int64_t>() + at : nullptr);
    }
    return out;
  }
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
