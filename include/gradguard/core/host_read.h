// Device-to-host reads, named and counted. The guarded step's budget is one host read
// per optimizer step (the fused statistics' copy); everything that reads a device value
// on the host must either go through to_host(), which marks the read, or is one of the
// ATen operators that read by nature (.item(), bool conversion, equal, copies to the
// CPU from another device). HostReadCounter watches LibTorch's dispatcher for both, so a
// test counts the reads of a whole training step rather than the calls of one function:
// a stray .item() anywhere in the step shows up, on the CPU as on a GPU.
//
// On the CPU none of these is a real synchronisation, but each is one where the same
// code runs on a GPU, which is what the budget is about.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include <ATen/Tensor.h>

namespace gradguard {

// `t` on the CPU (itself when already there), marked as one host read for
// HostReadCounter. Synchronises with the device when `t` lives on one.
at::Tensor to_host(const at::Tensor& t);

// Counts the host reads made by the calling thread while it lives (nested counters each
// count everything): to_host() calls and the dispatcher operators that read a device
// value on the host -- aten::_local_scalar_dense (.item(), bool and scalar conversions),
// aten::equal, aten::is_nonzero's read, and a copy into a CPU tensor from another
// device (aten::_to_copy / aten::copy_). Operators are seen through LibTorch's
// RecordFunction callbacks, so reads made on other threads are not counted.
class HostReadCounter {
 public:
  HostReadCounter();
  ~HostReadCounter();
  HostReadCounter(const HostReadCounter&) = delete;
  HostReadCounter& operator=(const HostReadCounter&) = delete;

  int64_t count() const;  // reads seen since construction

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gradguard
