// c10d underneath the Communicator. Rank 0 hosts a TCPStore; every rank connects to it
// twice -- once for the rendezvous, the group and the side channels (main thread), once
// for the heartbeat thread -- so a heartbeat never waits behind a blocking store call.
// Gloo binds to the local address that routes to MASTER_ADDR (found with a connected
// UDP socket, which sends nothing), unless GLOO_SOCKET_IFNAME names an interface: that
// is what makes multi-host runs work without configuration on hosts with several NICs.
// Our own store keys live under "gradguard/"; the process group gets a prefixed view.
#include "gradguard/dist/communicator.h"

#include "gradguard/core/compat.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

// c10d hides its Gloo process group behind the macro torch's own build sets.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

// NCCL's process group, in CUDA and ROCm builds (where it is RCCL under the same name);
// its header, like Gloo's, is empty without the macro torch's own build sets.
#if (defined(GRADGUARD_WITH_CUDA) && GRADGUARD_WITH_CUDA) || (defined(GRADGUARD_WITH_ROCM) && GRADGUARD_WITH_ROCM)
#define GG_NCCL 1
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#else
#define GG_NCCL 0
#endif

#include "gradguard/core/error.h"

namespace gradguard::dist {
namespace {

using Ms = std::chrono::milliseconds;

Ms to_ms(double seconds) { return Ms(static_cast<int64_t>(seconds * 1000.0)); }

std::string first_line(const char* text) {
  std::string s = text;
  auto nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

std::string to_string(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }
std::vector<uint8_t> to_bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

// The local IPv4 address the kernel would use to reach host:port.
std::string local_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || res == nullptr)
    throw bad_input("environment variable MASTER_ADDR", "cannot resolve '" + host + "' to an IPv4 address");
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  std::string out;
  if (fd >= 0) {
    if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
      sockaddr_in local{};
      socklen_t len = sizeof local;
      char buf[INET_ADDRSTRLEN] = {};
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
          inet_ntop(AF_INET, &local.sin_addr, buf, sizeof buf) != nullptr)
        out = buf;
    }
    close(fd);
  }
  freeaddrinfo(res);
  if (out.empty())
    throw runtime_error("environment variable MASTER_ADDR",
                        "no network route from this host to '" + host + "' (rank 0's address)");
  return out;
}

// Without these, a rank whose peer died waits in a NCCL kernel forever: c10d's watchdog
// only reports a timed-out collective, and tears the process down, when asynchronous
// error handling is on. LibTorch 2.x turns it on by default (TORCH_NCCL_...), 1.13 does
// not (NCCL_...). A value the user exported is kept.
[[maybe_unused]] void enable_nccl_error_handling() {
  for (const char* name : {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"})
    setenv(name, "1", /*overwrite=*/0);
}

}  // namespace

bool nccl_compiled() { return GG_NCCL != 0; }

DistBackend choose_backend(DistBackend requested, const c10::Device& device, bool nccl_built) {
  const bool gpu = device.is_cuda();
  const DistBackend backend = requested == DistBackend::kAuto ? (gpu ? DistBackend::kNccl : DistBackend::kGloo) : requested;
  if (backend == DistBackend::kNccl) {
    if (!gpu)
      throw bad_input("dist.backend", "nccl runs on GPUs only and run.device is " + device.str() +
                                          " (set dist.backend=gloo, or auto, for data parallel on the CPU)");
    if (!nccl_built)
      throw bad_input("dist.backend", "nccl needs a LibTorch built with CUDA or ROCm, and this build of gradguard "
                                      "has no GPU code (see docs/gpu.md for building against a CUDA/ROCm LibTorch)");
    return backend;
  }
  if (gpu)
    throw bad_input("dist.backend", "gloo runs data-parallel training on run.device=cpu only; on GPUs use nccl "
                                    "(or auto)");
  return backend;
}

struct Communicator::Impl {
  std::string prefix;  // our keys: "gradguard/" (+ torchrun's run id and restart count)
  c10::intrusive_ptr<c10d::TCPStore> store;  // main thread's connection
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;  // the process group: this one or
#if GG_NCCL
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl;  // this one
#endif
  int64_t sequence = 0;                           // broadcast_string calls, same count on every rank
  std::map<std::string, int64_t> published;       // [channel] payloads this rank published
  std::map<std::string, std::vector<int64_t>> seen;  // [channel][rank] payloads collected so far

  // Heartbeat.
  std::thread heart;
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;

  // Runs `op` on this run's process group. (Their common base class is ProcessGroup in
  // LibTorch 1.13 and Backend in 2.x; calling through the concrete type needs neither.)
  template <typename Op>
  c10::intrusive_ptr<c10d::Work> on_group(Op&& op) {
#if GG_NCCL
    if (nccl) return op(*nccl);
#endif
    return op(*gloo);
  }
};

Communicator::Communicator(const DistEnv& env, const DistOptions& options, const c10::Device& device)
    : env_(env), options_(options), impl_(std::make_unique<Impl>()) {
  options_.validate();
  backend_ = choose_backend(options_.backend, device, nccl_compiled());
  const std::string where = env_.master_addr + ":" + std::to_string(env_.master_port);
  const Ms timeout = to_ms(options_.timeout_s);

  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<uint16_t>(env_.master_port);
  compat::use_classic_tcpstore(store_options);
  // Under torchrun (not --standalone) its agent already hosts a store on MASTER_PORT
  // and tells the workers so: then every rank, rank 0 included, is a client of it, and
  // our keys carry the run id and restart count so a restarted worker group starts clean.
  const char* agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  const bool use_agent_store = agent_store != nullptr && std::string(agent_store) == "True";
  impl_->prefix = "gradguard/";
  if (use_agent_store) {
    const char* run_id = std::getenv("TORCHELASTIC_RUN_ID");
    const char* restarts = std::getenv("TORCHELASTIC_RESTART_COUNT");
    impl_->prefix += std::string(run_id ? run_id : "") + "/" + (restarts ? restarts : "0") + "/";
  }
  store_options.isServer = env_.rank == 0 && !use_agent_store;
  if (use_agent_store) store_options.waitWorkers = false;  // creating the group below meets every rank
  store_options.numWorkers = static_cast<size_t>(env_.world_size);
  store_options.waitWorkers = true;
  store_options.timeout = timeout;
  try {
    impl_->store = c10::make_intrusive<c10d::TCPStore>(env_.master_addr, store_options);
  } catch (const std::exception& e) {
    throw runtime_error("rendezvous " + where,
                        "rank " + std::to_string(env_.rank) + " of " + std::to_string(env_.world_size) +
                            " could not meet the others within dist.timeout_s = " + format_number(options_.timeout_s) +
                            " s (" + first_line(e.what()) +
                            "); check MASTER_ADDR/MASTER_PORT, that every rank was started, and that the port is free");
  }

  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(impl_->prefix + "group", impl_->store);
  if (backend_ == DistBackend::kGloo) {
    std::shared_ptr<::gloo::transport::Device> gloo_device;
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname != nullptr && *ifname != '\0') {
      try {
        gloo_device = c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
      } catch (const std::exception& e) {
        throw bad_input("environment variable GLOO_SOCKET_IFNAME",
                        "cannot use network interface '" + std::string(ifname) + "': " + first_line(e.what()) +
                            " (list the interfaces with `ip -brief addr`)");
      }
    } else {
      gloo_device = c10d::ProcessGroupGloo::createDeviceForHostname(
          local_address_towards(env_.master_addr, env_.master_port));
    }
    auto group_options = c10d::ProcessGroupGloo::Options::create(timeout);
    group_options->devices.push_back(gloo_device);
    group_options->threads = 2;
    try {
      impl_->gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, static_cast<int>(env_.rank),
                                                                static_cast<int>(env_.world_size), group_options);
    } catch (const std::exception& e) {
      throw runtime_error("rendezvous " + where, "creating the gloo process group failed: " + first_line(e.what()));
    }
  } else {
#if GG_NCCL
    // NCCL meets the other ranks through the store when the first collective runs (the
    // parameter broadcast), on the current device, which the trainer set to this rank's.
    enable_nccl_error_handling();
    auto group_options = c10d::ProcessGroupNCCL::Options::create();
    group_options->timeout = timeout;
    try {
      impl_->nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, static_cast<int>(env_.rank),
                                                                static_cast<int>(env_.world_size), group_options);
    } catch (const std::exception& e) {
      throw runtime_error("rendezvous " + where, "creating the nccl process group failed: " + first_line(e.what()));
    }
#endif
  }

  // The heartbeat: its own store connection, a counter bumped every heartbeat_s.
  const std::string key = impl_->prefix + "hb/" + std::to_string(env_.rank);
  impl_->store->add(key, 1);
  c10d::TCPStoreOptions client_options = store_options;
  client_options.isServer = false;
  client_options.numWorkers = c10::nullopt;
  client_options.waitWorkers = false;
  auto client = c10::make_intrusive<c10d::TCPStore>(env_.master_addr, client_options);
  impl_->heart = std::thread([impl = impl_.get(), client, key, period = to_ms(options_.heartbeat_s)] {
    std::unique_lock<std::mutex> lock(impl->mu);
    while (!impl->cv.wait_for(lock, period, [impl] { return impl->stopping; })) {
      try {
        client->add(key, 1);
      } catch (const std::exception&) {
        return;  // the store (rank 0) is gone; the next collective will say so
      }
    }
  });
}

Communicator::~Communicator() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  if (impl_->heart.joinable()) impl_->heart.join();
}

void Communicator::fail(const std::string& what, const std::exception& e) const {
  throw runtime_error("dist", "rank " + std::to_string(env_.rank) + " of " + std::to_string(env_.world_size) + ": " +
                                  what + " failed: " + explain_failure() + " [" + first_line(e.what()) + "]");
}

void Communicator::Work::wait() {
  if (!impl_) return;
  auto work = std::static_pointer_cast<c10::intrusive_ptr<c10d::Work>>(impl_);
  impl_.reset();
  try {
    (*work)->wait();
  } catch (const std::exception& e) {
    comm_->fail(what_, e);
  }
}

template <class Op>
Communicator::Work Communicator::start(const std::string& what, Op&& op) {
  Work w;
  w.comm_ = this;
  w.what_ = what;
  try {
    w.impl_ = std::make_shared<c10::intrusive_ptr<c10d::Work>>(impl_->on_group(op));
  } catch (const std::exception& e) {
    fail(what, e);
  }
  return w;
}

Communicator::Work Communicator::allreduce_sum_async(at::Tensor tensor, const std::string& what) {
  std::vector<at::Tensor> tensors = {std::move(tensor)};
  return start(what, [&](auto& group) { return group.allreduce(tensors); });
}

void Communicator::allreduce_sum(at::Tensor tensor, const std::string& what) {
  allreduce_sum_async(std::move(tensor), what).wait();
}

Communicator::Work Communicator::reduce_sum_async(at::Tensor tensor, int64_t root, const std::string& what) {
  std::vector<at::Tensor> tensors = {std::move(tensor)};
  c10d::ReduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::SUM;
  opts.rootRank = root;
  return start(what, [&](auto& group) { return group.reduce(tensors, opts); });
}

void Communicator::allreduce_max(at::Tensor tensor, const std::string& what) {
  std::vector<at::Tensor> tensors = {std::move(tensor)};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::MAX;
  try {
    impl_->on_group([&](auto& group) { return group.allreduce(tensors, opts); })->wait();
  } catch (const std::exception& e) {
    fail(what, e);
  }
}

void Communicator::broadcast(std::vector<at::Tensor> tensors, const std::string& what) {
  try {
    // One tensor per call: c10d's broadcast takes a list of copies of one tensor.
    for (auto& t : tensors) {
      std::vector<at::Tensor> one = {t};
      impl_->on_group([&](auto& group) { return group.broadcast(one); })->wait();
    }
  } catch (const std::exception& e) {
    fail(what, e);
  }
}

Communicator::Work Communicator::allgather_async(const at::Tensor& input, std::vector<at::Tensor> outputs,
                                                 const std::string& what) {
  std::vector<at::Tensor> inputs = {input};
  std::vector<std::vector<at::Tensor>> output_lists = {std::move(outputs)};
  return start(what, [&](auto& group) { return group.allgather(output_lists, inputs); });
}

std::string Communicator::broadcast_string(const std::string& value, const std::string& what) {
  const std::string key = impl_->prefix + "bcast/" + std::to_string(impl_->sequence++);
  try {
    if (env_.rank == 0) impl_->store->set(key, to_bytes(value));
    return to_string(impl_->store->get(key));
  } catch (const std::exception& e) {
    fail(what, e);
  }
}

void Communicator::agree(const std::string& phase, const std::string& error) {
  const std::string prefix = impl_->prefix + "agree/" + phase + "/";
  std::string failures;
  try {
    impl_->store->set(prefix + std::to_string(env_.rank), to_bytes("=" + error));
    for (int64_t r = 0; r < env_.world_size; ++r) {
      if (r == env_.rank) continue;
      const std::string message = to_string(impl_->store->get(prefix + std::to_string(r))).substr(1);
      if (!message.empty()) failures += (failures.empty() ? "" : "; ") + ("rank " + std::to_string(r) + ": " + message);
    }
  } catch (const std::exception& e) {
    if (!error.empty()) return;  // this rank failed anyway: its own error is the one to report
    fail(phase, e);
  }
  if (!failures.empty() && error.empty())
    throw runtime_error("dist", "rank " + std::to_string(env_.rank) + " stops because another rank failed during " +
                                    phase + ": " + failures);
}

void Communicator::report_failure(const std::string& message) noexcept {
  try {
    impl_->store->set(impl_->prefix + "failed/" + std::to_string(env_.rank), to_bytes(message));
  } catch (...) {
  }
}

void Communicator::publish(const std::string& channel, const std::string& payload) {
  const int64_t n = ++impl_->published[channel];
  const std::string base = impl_->prefix + "ch/" + channel + "/" + std::to_string(env_.rank) + "/";
  try {
    impl_->store->set(base + std::to_string(n), to_bytes(payload));
    impl_->store->add(base + "n", 1);
  } catch (const std::exception& e) {
    fail("publishing " + channel, e);
  }
}

std::vector<std::pair<int64_t, std::string>> Communicator::collect(const std::string& channel) {
  std::vector<std::pair<int64_t, std::string>> out;
  auto& seen = impl_->seen[channel];
  seen.resize(static_cast<size_t>(env_.world_size), 0);
  try {
    for (int64_t r = 0; r < env_.world_size; ++r) {
      if (r == env_.rank) continue;
      const std::string base = impl_->prefix + "ch/" + channel + "/" + std::to_string(r) + "/";
      const int64_t count = impl_->store->add(base + "n", 0);
      for (int64_t i = seen[r] + 1; i <= count; ++i) {
        const std::string key = base + std::to_string(i);
        out.emplace_back(r, to_string(impl_->store->get(key)));
        impl_->store->deleteKey(key);
      }
      seen[r] = std::max(seen[r], count);
    }
  } catch (const std::exception& e) {
    fail("collecting " + channel, e);
  }
  return out;
}

std::string Communicator::explain_failure() const {
  const std::string store_host = env_.master_addr + ":" + std::to_string(env_.master_port);
  try {
    std::string out;
    for (int64_t r = 0; r < env_.world_size; ++r) {
      const std::string key = impl_->prefix + "failed/" + std::to_string(r);
      if (r != env_.rank && impl_->store->check({key}))
        out += (out.empty() ? "" : "; ") + ("rank " + std::to_string(r) + " failed: " + to_string(impl_->store->get(key)));
    }
    if (!out.empty()) return out;
    std::vector<int64_t> before(static_cast<size_t>(env_.world_size));
    for (int64_t r = 0; r < env_.world_size; ++r)
      before[r] = impl_->store->add(impl_->prefix + "hb/" + std::to_string(r), 0);
    std::this_thread::sleep_for(to_ms(2.5 * options_.heartbeat_s));
    std::string stopped;
    for (int64_t r = 0; r < env_.world_size; ++r)
      if (r != env_.rank && impl_->store->add(impl_->prefix + "hb/" + std::to_string(r), 0) == before[r])
        stopped += (stopped.empty() ? "" : ", ") + std::to_string(r);
    if (!stopped.empty())
      return "rank " + stopped + " stopped responding (no heartbeat for " + format_number(2.5 * options_.heartbeat_s) +
             " s): it probably died; see its output";
    return "every rank is still alive; a collective timed out or a connection broke (dist.timeout_s = " +
           format_number(options_.timeout_s) + " s)";
  } catch (const std::exception&) {
    return "rank 0 (it hosts the rendezvous store at " + store_host +
           ") is unreachable: it probably died; see its output";
  }
}

}  // namespace gradguard::dist
