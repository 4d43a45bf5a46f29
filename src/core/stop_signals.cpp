// sigaction handlers for SIGTERM/SIGINT that record the first signal in a lock-free
// atomic; the second one restores the default action and raises the signal again.
#include "gradguard/core/stop_signals.h"

#include <csignal>

#include <atomic>

namespace gradguard {
namespace {

std::atomic<int> g_signal{0};
struct sigaction g_previous_term, g_previous_int;

extern "C" void on_stop_signal(int sig) {
  int expected = 0;
  if (!g_signal.compare_exchange_strong(expected, sig)) {
    // The second stop signal: the user (or the scheduler) means now.
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }
}

}  // namespace

static_assert(std::atomic<int>::is_always_lock_free, "the handler needs a lock-free flag");

StopSignals::StopSignals() {
  g_signal.store(0);
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a slow system call in progress is resumed, not failed
  sigaction(SIGTERM, &action, &g_previous_term);
  sigaction(SIGINT, &action, &g_previous_int);
}

StopSignals::~StopSignals() {
  sigaction(SIGTERM, &g_previous_term, nullptr);
  sigaction(SIGINT, &g_previous_int, nullptr);
}

int StopSignals::requested() { return g_signal.load(); }

const char* StopSignals::name(int signal) {
  if (signal == SIGTERM) return "SIGTERM";
  if (signal == SIGINT) return "SIGINT";
  return "";
}

}  // namespace gradguard
