// The local launcher: everything is checked (options, program, port) before the first
// rank starts, so bad input never leaves half a job running. Ranks are started with
// posix_spawn, each as the leader of its own process group with stdin from /dev/null:
// signalling the group reaches whatever the rank itself started (a `sh -c` wrapper's
// child, a data loader), and a rank can never stop on SIGTTIN by reading the terminal.
// The price of own groups is that Ctrl-C in a terminal reaches only the launcher, which
// is why the launcher forwards SIGINT/SIGTERM/SIGHUP itself (each rank then gets it once).
//
// Waiting uses the self-pipe trick: handlers for SIGCHLD, SIGINT, SIGTERM and SIGHUP
// write the signal number to a non-blocking pipe; the loop drains the pipe, reaps ranks
// with waitpid(pid, WNOHANG), and then sleeps in poll() on the pipe, with no timeout
// except while a grace period runs (then until its deadline). So it wakes only when
// something happened and never busy-waits. sigtimedwait() would need these signals
// blocked in every thread; the CLI process carries torch's thread pools, whose masks we
// do not control, and a signal delivered to an unblocked thread would kill the launcher
// without forwarding anything. A handler works whichever thread runs it.
//
// Stopping: the first failure (or received signal) decides the exit code; later rank
// exits are expected consequences and not reported. A second signal during the grace
// period skips the rest of it (SIGKILL now), like a second Ctrl-C.
#include "gradguard/dist/launch.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <utility>

#include "gradguard/core/error.h"
#include "gradguard/core/stop_signals.h"

extern char** environ;

namespace gradguard::dist {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kMaxRanks = 1024;
constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP};
const char* const kRankEnvKeys[] = {"RANK",        "WORLD_SIZE",  "LOCAL_RANK",        "LOCAL_WORLD_SIZE",
                                    "MASTER_ADDR", "MASTER_PORT", "GRADGUARD_LAUNCHED"};

volatile sig_atomic_t g_signal_pipe = -1;  // write end of the self-pipe while launch() runs
std::atomic<bool> g_launch_running{false};

void on_signal(int sig) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  // A full pipe already holds a pending wake-up, so a failed write loses nothing.
  [[maybe_unused]] ssize_t n = write(g_signal_pipe, &byte, 1);
  errno = saved;
}

// The self-pipe and the handlers feeding it; restores the previous handlers on exit.
class SignalPipe {
 public:
  SignalPipe() {
    if (g_launch_running.exchange(true)) throw runtime_error("gradguard launch", "launch() is already running");
    int fds[2];
    if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) {
      g_launch_running = false;
      throw runtime_error("gradguard launch", std::string("pipe2 failed: ") + std::strerror(errno));
    }
    read_fd_ = fds[0];
    write_fd_ = fds[1];
    g_signal_pipe = write_fd_;
    install(SIGCHLD);
    for (int sig : kForwardedSignals) {
      struct sigaction old {};
      sigaction(sig, nullptr, &old);
      if (old.sa_handler != SIG_IGN) install(sig);  // ignored (nohup, `&`): stays ignored, as in shells
    }
  }
  ~SignalPipe() {
    for (const auto& [sig, old] : saved_) sigaction(sig, &old, nullptr);
    g_signal_pipe = -1;
    close(read_fd_);
    close(write_fd_);
    g_launch_running = false;
  }
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;

  // Signals received since the last call, oldest first (SIGCHLD included).
  std::vector<int> drain() {
    std::vector<int> out;
    unsigned char buf[64];
    for (ssize_t n; (n = read(read_fd_, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR);)
      out.insert(out.end(), buf, buf + std::max<ssize_t>(n, 0));
    return out;
  }
  // Sleeps until a signal arrives or `timeout_ms` passes (-1: no timeout).
  void wait(int timeout_ms) {
    pollfd p{read_fd_, POLLIN, 0};
    poll(&p, 1, timeout_ms);  // EINTR: a handler ran, which is a wake-up too
  }

 private:
  void install(int sig) {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | (sig == SIGCHLD ? SA_NOCLDSTOP : 0);
    struct sigaction old {};
    if (sigaction(sig, &sa, &old) == 0) saved_.emplace_back(sig, old);
  }
  int read_fd_ = -1, write_fd_ = -1;
  std::vector<std::pair<int, struct sigaction>> saved_;
};

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  return stat(a.c_str(), &sa) == 0 && stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : sep) + s;
  return out;
}

// PATH lookup as posix_spawnp/execvp do it (empty entry = current directory, unset PATH =
// the system default), done up front so a missing program is bad input, not N failures.
std::string find_program(const std::string& name, const std::vector<std::string>& self_commands) {
  if (name.find('/') != std::string::npos) {
    if (is_executable_file(name)) return name;
    throw bad_input(name, "is not an executable file (the program each rank runs, after `--`)");
  }
  std::string path;
  if (const char* env = std::getenv("PATH")) {
    path = env;
  } else {
    path.resize(confstr(_CS_PATH, nullptr, 0));
    confstr(_CS_PATH, path.data(), path.size());
    if (!path.empty()) path.pop_back();  // the terminating NUL
  }
  for (size_t begin = 0; begin <= path.size();) {
    size_t end = path.find(':', begin);
    if (end == std::string::npos) end = path.size();
    const std::string dir = end == begin ? "." : path.substr(begin, end - begin);
    if (is_executable_file(dir + "/" + name)) return dir + "/" + name;
    begin = end + 1;
  }
  throw bad_input(name, "program not found: searched PATH (" + path + "); gradguard's own subcommands (" +
                            join(self_commands, ", ") + ") run this executable instead");
}

// "rank 3", "ranks 0, 2", "ranks 0-5, 9": runs of three or more are shown as a range.
std::string rank_list(const std::vector<int64_t>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) out += ", ";
    if (j >= i + 2) {
      out += std::to_string(ranks[i]) + "-" + std::to_string(ranks[j]);
      i = j + 1;
    } else {
      out += std::to_string(ranks[i]);
      ++i;
    }
  }
  return out;
}

std::string signal_text(int sig) {
  const char* name = strsignal(sig);
  return "signal " + std::to_string(sig) + " (" + (name ? name : "unknown") + ")";
}

// 10 -> "10", 0.5 -> "0.5" (format_number would write 30 as "3e+01").
std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return "the signal";
  }
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  return "was killed by " + signal_text(WTERMSIG(status)) + (WCOREDUMP(status) ? ", core dumped" : "");
}

// Starts one rank; returns its pid (also its process-group id).
pid_t spawn_rank(const std::string& program, const std::vector<std::string>& args,
                 const std::vector<std::string>& env) {
  std::vector<char*> argv, envp;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  argv.push_back(nullptr);
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, program.c_str(), &actions, &attr, argv.data(), envp.data());
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw runtime_error(program, std::string("cannot start: ") + std::strerror(rc));
  return pid;
}

}  // namespace

void LaunchOptions::validate() const {
  if (nproc < 1 || nproc > kMaxRanks)
    throw bad_input("--nproc", "must be 1.." + std::to_string(kMaxRanks) + ", got " + std::to_string(nproc));
  if (master_addr.empty()) throw bad_input("--master-addr", "must not be empty (e.g. 127.0.0.1)");
  if (master_port < 0 || master_port > 65535)
    throw bad_input("--master-port", "must be 1..65535, got " + std::to_string(master_port) +
                                         " (leave it out to pick a free port)");
  if (!(grace_s >= 0) || !std::isfinite(grace_s))
    throw bad_input("--grace-s", "must be a number of seconds >= 0, got " + format_number(grace_s));
}

namespace {

// Binds a TCP socket to `port` (0: the kernel's choice) on `addr` and closes it. Returns the
// port it got, 0 when no address of `addr` could be bound (*error says why).
int bind_once(const std::string& addr, int port, std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0)
    throw bad_input("--master-addr", "cannot resolve '" + addr + "': " + gai_strerror(rc));
  int got = 0;
  for (addrinfo* ai = found; ai != nullptr && got == 0; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      *error = std::strerror(errno);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) == 0)
      got = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                              : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    else
      *error = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(found);
  return got;
}

// The first port of the kernel's ephemeral range (ip_local_port_range), 32768 when unknown.
int ephemeral_low() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0, high = 0;
  return (in >> low >> high) && low > 1024 ? low : 32768;
}

}  // namespace

int free_tcp_port(const std::string& addr) {
  // A port from the kernel's ephemeral range is free only until someone else takes it:
  // every outgoing connection on the machine (other ranks' stores, other tests' launches)
  // draws from that range between this check and rank 0's bind. Below it only listeners
  // bind, so a free port there stays free: try a random one first, then its neighbours.
  std::string error = "no address";
  const int high = ephemeral_low(), low = std::max(1025, high - 12000);
  std::random_device seed;
  const int start = low + static_cast<int>(seed() % static_cast<unsigned>(high - low));
  for (int k = 0; k < 64; ++k) {
    const int port = low + (start - low + k) % (high - low);
    if (bind_once(addr, port, &error) == port) return port;
  }
  const int port = bind_once(addr, 0, &error);  // all taken: the kernel's choice
  if (port == 0)
    throw bad_input("--master-addr", "cannot bind a TCP port on '" + addr + "' (" + error +
                                         "): it must be an address of this machine, or pass --master-port");
  return port;
}

int launch(const LaunchOptions& options, const std::vector<std::string>& args, const std::string& self_exe,
           const std::vector<std::string>& self_commands) {
  // ---- check everything before the first rank starts
  options.validate();
  if (args.empty())
    throw bad_input("gradguard launch", "no program to run: put it after `--`, e.g. "
                                        "`gradguard launch --nproc 2 -- train --config run.yaml`");
  const auto recursive = [] {
    return bad_input("gradguard launch", "cannot launch `launch` itself (recursive launch); put the command each "
                                         "rank runs after `--`, e.g. `-- train --config run.yaml`");
  };
  if (args[0] == "launch") throw recursive();
  const std::string exe = self_exe.empty() ? "/proc/self/exe" : self_exe;
  const bool is_self = std::find(self_commands.begin(), self_commands.end(), args[0]) != self_commands.end();
  const std::string program = is_self ? exe : find_program(args[0], self_commands);
  if (args.size() > 1 && args[1] == "launch" && same_file(program, exe))
    throw recursive();  // `-- /path/to/gradguard launch ...`
  std::vector<std::string> argv = args;
  if (is_self) argv.insert(argv.begin(), exe);
  const int port = options.master_port > 0 ? options.master_port : free_tcp_port(options.master_addr);

  std::vector<std::string> base_env;  // the launcher's environment minus the keys set per rank
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const std::string key = kv.substr(0, kv.find('='));
    if (std::none_of(std::begin(kRankEnvKeys), std::end(kRankEnvKeys), [&](const char* k) { return key == k; }))
      base_env.push_back(kv);
  }
  const std::string n = std::to_string(options.nproc);
  base_env.insert(base_env.end(), {"WORLD_SIZE=" + n, "LOCAL_WORLD_SIZE=" + n, "MASTER_ADDR=" + options.master_addr,
                                   "MASTER_PORT=" + std::to_string(port), "GRADGUARD_LAUNCHED=1"});

  // ---- start the ranks
  SignalPipe signals;
  std::vector<pid_t> pids(static_cast<size_t>(options.nproc), -1);  // [rank]; -1 once reaped or never started
  auto running = [&] {
    std::vector<int64_t> ranks;
    for (size_t r = 0; r < pids.size(); ++r)
      if (pids[r] > 0) ranks.push_back(static_cast<int64_t>(r));
    return ranks;
  };
  auto signal_all = [&](int sig) {
    for (pid_t pid : pids)
      if (pid > 0 && kill(-pid, sig) != 0) kill(pid, sig);  // the group; the rank alone if it left its group
  };
  for (int64_t r = 0; r < options.nproc; ++r) {
    std::vector<std::string> env = base_env;
    env.insert(env.end(), {"RANK=" + std::to_string(r), "LOCAL_RANK=" + std::to_string(r)});
    try {
      pids[static_cast<size_t>(r)] = spawn_rank(program, argv, env);
    } catch (const Error& e) {
      const auto started = running();
      signal_all(SIGKILL);
      for (pid_t pid : pids)
        if (pid > 0) waitpid(pid, nullptr, 0);
      throw runtime_error("gradguard launch", "rank " + std::to_string(r) + ": " + e.what() +
                                                  (started.empty() ? "" : "; killed " + rank_list(started)));
    }
  }

  // ---- supervise: the first failure or received signal decides the exit code
  const char* const tag = "gradguard launch: ";
  int exit_code = 0;
  bool forwarded = false;  // stopping began with a signal the launcher received (preemption)
  bool all_preempted = true;  // every rank that ended while stopping exited 0 or kExitPreempted
  int stop_signal = 0;  // what the ranks were sent when stopping began; 0 while running normally
  bool killed = false;  // SIGKILL sent
  Clock::time_point deadline;  // of the grace period, once stopping began
  const std::chrono::duration<double> grace(std::min(options.grace_s, 1e7));  // beyond ~116 days Clock overflows
  auto begin_stop = [&](int sig) {
    stop_signal = sig;
    signal_all(sig);
    deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(grace);
  };
  auto kill_all = [&] {
    signal_all(SIGKILL);
    killed = true;
  };
  while (true) {
    for (int sig : signals.drain()) {
      if (sig == SIGCHLD) continue;
      if (stop_signal == 0) {
        std::fprintf(stderr, "%sreceived %s; forwarding it to %s (SIGKILL after %s s)\n", tag, signal_text(sig).c_str(),
                     rank_list(running()).c_str(), seconds_text(options.grace_s).c_str());
        exit_code = 128 + sig;
        forwarded = true;
        begin_stop(sig);
      } else if (!killed) {
        std::fprintf(stderr, "%sreceived %s while stopping; killing %s now\n", tag, signal_text(sig).c_str(),
                     rank_list(running()).c_str());
        kill_all();
      }
    }
    for (size_t r = 0; r < pids.size(); ++r) {
      if (pids[r] <= 0) continue;
      int status = 0;
      pid_t got;
      while ((got = waitpid(pids[r], &status, WNOHANG)) < 0 && errno == EINTR) {
      }
      if (got == 0) continue;  // still running
      // got < 0 (ECHILD): someone else reaped it, the status is unknown; count it as gone.
      const pid_t pid = pids[r];
      pids[r] = -1;
      const bool clean = got >= 0 && WIFEXITED(status) &&
                         (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == kExitPreempted);
      if (stop_signal != 0) all_preempted = all_preempted && clean;
      if (got < 0 || (WIFEXITED(status) && WEXITSTATUS(status) == 0) || stop_signal != 0) continue;
      const auto others = running();
      const std::string then = others.empty() ? "no other rank is running" : "stopping " + rank_list(others);
      std::fprintf(stderr, "%srank %zu (pid %d) %s; %s\n", tag, r, static_cast<int>(pid),
                   describe_status(status).c_str(), then.c_str());
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
      exit_code = code == 2 || code == 3 || code == kExitPreempted ? code : 1;
      begin_stop(SIGTERM);
    }
    const auto left = running();
    if (left.empty()) break;
    int timeout_ms = -1;
    if (stop_signal != 0 && !killed) {
      const auto remaining = std::chrono::duration<double, std::milli>(deadline - Clock::now()).count();
      if (remaining <= 0) {
        std::fprintf(stderr, "%s%s still running %s s after %s; sending SIGKILL\n", tag, rank_list(left).c_str(),
                     seconds_text(options.grace_s).c_str(), signal_name(stop_signal));
        kill_all();
        continue;
      }
      timeout_ms = static_cast<int>(std::min(std::ceil(remaining), 3.6e6));  // poll() takes an int: wake hourly
    }
    signals.wait(timeout_ms);
  }
  // A forwarded SIGTERM/SIGINT that every rank answered by checkpointing and stopping is
  // a preemption, not a failure: the same exit code as one process gives.
  if (forwarded && all_preempted && !killed) exit_code = kExitPreempted;
  return exit_code;
}

}  // namespace gradguard::dist
