// HostReadCounter on LibTorch's RecordFunction callbacks. The callback is a plain
// function (the API takes a function pointer), so the live counters of a thread are kept
// in a thread-local list and every read is added to each of them. to_host() opens a
// user-scope RecordFunction named "gradguard::host_read", which the same callback sees;
// the events nested inside a read are part of it.
#include "gradguard/core/host_read.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/record_function.h>

namespace gradguard {
namespace {

constexpr const char* kHostRead = "gradguard::host_read";

thread_local std::vector<int64_t*> t_counters;  // the live counters of this thread

// A copy whose destination is the CPU and whose source is not: aten::_to_copy(self,
// ..., device) and aten::copy_(self = destination, src).
bool is_copy_to_host(const at::RecordFunction& fn) {
  const char* name = fn.name();
  const bool to_copy = std::strcmp(name, "aten::_to_copy") == 0;
  const bool copy = std::strcmp(name, "aten::copy_") == 0;
  if (!to_copy && !copy) return false;
  const auto inputs = fn.inputs();
  if (to_copy) {
    if (inputs.empty() || !inputs[0].isTensor() || inputs[0].toTensor().is_cpu()) return false;
    // The target device is an optional argument; without one the copy stays put.
    for (size_t i = 1; i < inputs.size(); ++i)
      if (inputs[i].isDevice()) return inputs[i].toDevice().is_cpu();
    return false;
  }
  return inputs.size() >= 2 && inputs[0].isTensor() && inputs[1].isTensor() && inputs[0].toTensor().is_cpu() &&
         !inputs[1].toTensor().is_cpu();
}

// Reads open on this thread. One read is often several nested events -- to_host() is the
// gradguard::host_read scope around aten::_to_copy around aten::copy_ on a GPU -- and
// counts once: only the outermost is counted.
thread_local int t_open_reads = 0;

struct OpenRead : at::ObserverContext {};

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  const char* name = fn.name();
  const bool read = std::strcmp(name, kHostRead) == 0 || std::strcmp(name, "aten::_local_scalar_dense") == 0 ||
                    std::strcmp(name, "aten::equal") == 0 || is_copy_to_host(fn);
  if (!read) return nullptr;
  if (t_open_reads++ == 0)
    for (int64_t* c : t_counters) ++*c;
  return std::make_unique<OpenRead>();
}

void on_end(const at::RecordFunction& /*fn*/, at::ObserverContext* context) {
  if (context != nullptr) --t_open_reads;
}

}  // namespace

at::Tensor to_host(const at::Tensor& t) {
  RECORD_USER_SCOPE(kHostRead);
  return t.to(at::kCPU);
}

struct HostReadCounter::Impl {
  int64_t count = 0;
  at::CallbackHandle handle = 0;
};

HostReadCounter::HostReadCounter() : impl_(std::make_unique<Impl>()) {
  t_counters.push_back(&impl_->count);
  impl_->handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(on_start, on_end).needsInputs(true).scopes(
          {at::RecordScope::FUNCTION, at::RecordScope::USER_SCOPE}));
}

HostReadCounter::~HostReadCounter() {
  at::removeCallback(impl_->handle);
  t_counters.erase(std::find(t_counters.begin(), t_counters.end(), &impl_->count));
}

int64_t HostReadCounter::count() const { return impl_->count; }

}  // namespace gradguard
