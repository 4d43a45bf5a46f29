// Slot offsets are prefix sums of the widths in enum order, computed on each call: a
// layout has five slots and is consulted a handful of times per step.
#include "gradguard/guard/side_layout.h"

#include <torch/torch.h>

namespace gradguard::guard {

SideLayout SideLayout::for_ranks(int64_t world, int64_t accum) {
  TORCH_INTERNAL_ASSERT(world >= 1 && accum >= 1);
  SideLayout l;
  l.set(Slot::kLoss, 1).set(Slot::kMicroLosses, world * accum).set(Slot::kNoiseSqNorm, world);
  l.set(Slot::kStopRequest, 1).set(Slot::kZLoss, 1);
  return l;
}

SideLayout& SideLayout::set(Slot slot, int64_t width) {
  TORCH_INTERNAL_ASSERT(width >= 0, "SideLayout: negative width for ", name(slot));
  width_[index(slot)] = width;
  return *this;
}

int64_t SideLayout::offset(Slot slot) const {
  int64_t at = 0;
  for (size_t i = 0; i < index(slot); ++i) at += width_[i];
  return at;
}

int64_t SideLayout::size() const {
  int64_t n = 0;
  for (auto w : width_) n += w;
  return n;
}

at::Tensor SideLayout::zeros(const c10::Device& device) const {
  return torch::zeros({size()}, torch::TensorOptions().dtype(torch::kFloat).device(device));
}

at::Tensor SideLayout::of(const at::Tensor& side, Slot slot) const {
  TORCH_INTERNAL_ASSERT(side.numel() == size(), "SideLayout: a side vector of ", side.numel(), " entries, the layout has ",
                        size());
  return side.narrow(0, offset(slot), width(slot));
}

double SideLayout::value(const std::vector<double>& values, Slot slot, int64_t i) const {
  TORCH_INTERNAL_ASSERT(i >= 0 && i < width(slot), "SideLayout: entry ", i, " of ", name(slot), " (width ", width(slot), ")");
  return values.at(static_cast<size_t>(offset(slot) + i));
}

std::vector<double> SideLayout::values(const std::vector<double>& values, Slot slot) const {
  const auto begin = values.begin() + offset(slot);
  TORCH_INTERNAL_ASSERT(offset(slot) + width(slot) <= static_cast<int64_t>(values.size()));
  return {begin, begin + width(slot)};
}

const char* SideLayout::name(Slot slot) {
  switch (slot) {
    case Slot::kLoss: return "loss";
    case Slot::kMicroLosses: return "micro_losses";
    case Slot::kNoiseSqNorm: return "noise_sq_norm";
    case Slot::kStopRequest: return "stop_request";
    case Slot::kZLoss: return "z_loss";
  }
  return "?";
}

}  // namespace gradguard::guard
