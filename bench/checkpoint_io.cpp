// Checkpoint save and load throughput next to a plain write of the same number of bytes,
// measured side by side in one run (median of interleaved repeats). The plain write is
// the floor: one buffer written with write(2) and fsync'd, as the checkpoint's files are.
//
// Run: build/bench/checkpoint_io [hidden_size=512] [layers=8] [repeats=5] [dir=/tmp]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "gradguard/checkpoint/trainer_checkpoint.h"
#include "gradguard/core/allocator.h"
#include "gradguard/core/stats.h"
#include "gradguard/core/threads.h"
#include "gradguard/model/llama.h"
#include "gradguard/optim/optimizer.h"

using namespace gradguard;
using Clock = std::chrono::steady_clock;

namespace {
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
int64_t dir_bytes(const std::string& dir) {
  int64_t n = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.is_regular_file()) n += static_cast<int64_t>(e.file_size());
  return n;
}
}  // namespace

int main(int argc, char** argv) {
  configure_allocator();
  configure_threads(0);
  model::LlamaOptions o;
  o.hidden_size = argc > 1 ? std::atoll(argv[1]) : 512;
  o.intermediate_size = o.hidden_size * 3;
  o.num_layers = argc > 2 ? std::atoll(argv[2]) : 8;
  o.num_heads = 8;
  o.num_kv_heads = 4;
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 5;
  const std::string base = (argc > 4 ? argv[4] : "/tmp") + std::string("/gradguard-ckpt-bench");
  std::filesystem::remove_all(base);

  model::LlamaForCausalLM m(o);
  optim::NamedParameters named;
  for (const auto& item : m->named_parameters()) named.emplace_back(item.key(), item.value());
  auto opt = optim::make_optimizer(named, optim::OptimOptions{});
  for (const auto& p : m->parameters()) p.mutable_grad() = torch::randn_like(p) * 1e-3;
  opt->step();  // creates the Adam moments, so the checkpoint holds the full state

  std::vector<double> save_t, load_t, plain_t;
  int64_t bytes = 0;
  for (int r = 0; r < repeats + 1; ++r) {
    const std::string root = base + "/run" + std::to_string(r);
    auto t0 = Clock::now();
    const std::string dir = checkpoint::save_checkpoint(root, 1, *m, *opt, {{"step", 1}}, "", 0);
    const double ts = seconds_since(t0);
    bytes = dir_bytes(dir);

    model::LlamaForCausalLM fresh(o);
    optim::NamedParameters fresh_named;
    for (const auto& item : fresh->named_parameters()) fresh_named.emplace_back(item.key(), item.value());
    auto fresh_opt = optim::make_optimizer(fresh_named, optim::OptimOptions{});
    t0 = Clock::now();
    checkpoint::verify_checkpoint(dir);
    checkpoint::load_checkpoint(dir, *fresh, *fresh_opt);
    const double tl = seconds_since(t0);

    std::vector<char> buffer(static_cast<size_t>(bytes), 1);
    const std::string plain = base + "/plain" + std::to_string(r);
    t0 = Clock::now();
    int fd = ::open(plain.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    for (size_t off = 0; off < buffer.size();) off += static_cast<size_t>(::write(fd, buffer.data() + off, buffer.size() - off));
    ::fsync(fd);
    ::close(fd);
    const double tp = seconds_since(t0);
    if (r > 0) save_t.push_back(ts), load_t.push_back(tl), plain_t.push_back(tp);  // round 0 warms up
    std::filesystem::remove_all(root);
    std::filesystem::remove(plain);
  }
  std::filesystem::remove_all(base);
  const double mb = bytes / 1e6;
  std::printf("checkpoint_io: model %lld parameters (%lld layers x %lld), checkpoint %.1f MB (model + AdamW state), "
              "%d repeats (medians), dir %s\n",
              (long long)model::count_parameters(*m), (long long)o.num_layers, (long long)o.hidden_size, mb, repeats,
              base.c_str());
  std::printf("  plain write+fsync     %7.1f ms  %7.0f MB/s\n", median(plain_t) * 1e3, mb / median(plain_t));
  std::printf("  checkpoint save       %7.1f ms  %7.0f MB/s  ratio save/plain = %.2f\n", median(save_t) * 1e3,
              mb / median(save_t), median(save_t) / median(plain_t));
  std::printf("  verify + load         %7.1f ms  %7.0f MB/s  ratio load/plain = %.2f\n", median(load_t) * 1e3,
              mb / median(load_t), median(load_t) / median(plain_t));
  return 0;
}
