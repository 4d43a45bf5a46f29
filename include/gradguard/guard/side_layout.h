// The side values of a step: the scalars that travel with the gradients so that they
// cost no read and no collective of their own. The guard reads them in its one host copy
// (guarded_step.h); data parallelism sums them over the ranks in a collective it runs
// anyway (the gradients' last bucket, or ZeRO-2's statistics all-reduce).
//
// A layout is a list of named slots, each a run of float32 entries, laid end to end in
// the order of `Slot`; a slot of width 0 is absent and takes no room. Every writer and
// reader of a side vector goes through one: offsets are never computed by hand. Two
// layouts exist:
//   for_ranks(world, accum)  what data parallelism sums. Each rank writes its own entries
//       of slots wide enough for all ranks, zeros elsewhere, so the sum over the ranks
//       gathers them: the micro-batch losses by global micro-batch g = m * world + rank,
//       the gradient-noise sample by rank. The stop request is each rank's 0/1 (the sum
//       says whether any rank was asked to stop).
//   the guard's own             one value per quantity the step reports, present when
//       given (GuardedStep packs StepInputs into it).
// A new side value is one enumerator in Slot and its name in side_layout.cpp: the
// offsets of the others follow.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include <ATen/Tensor.h>

namespace gradguard::guard {

class SideLayout {
 public:
  enum class Slot {
    kLoss,         // the global batch's mean loss
    kMicroLosses,  // each micro-batch's mean loss
    kNoiseSqNorm,  // the gradient-noise-scale sample (guard/noise_scale.h)
    kStopRequest,  // > 0: a process of the run was asked to stop (SIGTERM/SIGINT)
    kZLoss,        // the z-loss term, reported beside the loss
  };
  static constexpr size_t kSlots = 5;

  SideLayout() = default;
  // The layout data parallelism sums over `world` ranks with `accum` micro-batches each:
  // [loss 1 | micro losses world x accum | noise sample world | stop request 1 | z-loss 1].
  static SideLayout for_ranks(int64_t world, int64_t accum);

  SideLayout& set(Slot slot, int64_t width);  // width >= 0; 0 removes the slot
  int64_t width(Slot slot) const { return width_[index(slot)]; }
  bool has(Slot slot) const { return width(slot) > 0; }
  int64_t offset(Slot slot) const;  // of the slot's first entry
  int64_t size() const;             // entries of the whole vector

  // A zero float32 vector of size() on `device`.
  at::Tensor zeros(const c10::Device& device) const;
  // The slot's entries of `side` (float32 [size()]): a view, [width(slot)].
  at::Tensor of(const at::Tensor& side, Slot slot) const;
  // Entry `i` of the slot in the host copy of a side vector.
  double value(const std::vector<double>& values, Slot slot, int64_t i = 0) const;
  // The slot's entries in the host copy.
  std::vector<double> values(const std::vector<double>& values, Slot slot) const;

  static const char* name(Slot slot);

 private:
  static size_t index(Slot slot) { return static_cast<size_t>(slot); }
  std::array<int64_t, kSlots> width_{};  // [slot]
};

}  // namespace gradguard::guard
