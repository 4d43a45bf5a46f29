// `gradguard launch`: starts N ranks on this machine, each with the environment a
// torchrun-style rendezvous reads (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT, plus GRADGUARD_LAUNCHED=1), and supervises them: the first
// rank that fails (non-zero exit or killed by a signal) is named on stderr and the other
// ranks are stopped (SIGTERM, then SIGKILL after a grace period), so a broken job never
// hangs silently in a collective; SIGINT/SIGTERM/SIGHUP sent to the launcher are
// forwarded to every rank. The library part needs no torch and throws gradguard::Error
// (bad input) before any rank starts, naming the CLI option that is wrong.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gradguard::dist {

struct LaunchOptions {
  int64_t nproc = 1;                      // ranks to start on this machine (1..1024)
  std::string master_addr = "127.0.0.1";  // MASTER_ADDR given to every rank (an address of this machine)
  int master_port = 0;                    // MASTER_PORT (1..65535); 0 picks a free port with free_tcp_port()
  double grace_s = 10;                    // SIGTERM -> SIGKILL delay when stopping ranks (s, >= 0; 0 kills at once)

  // Throws gradguard::Error (bad input) naming the option (--nproc, --master-addr,
  // --master-port, --grace-s).
  void validate() const;
};

// Starts options.nproc copies of `args` and returns the launcher's exit code once every
// rank is gone:
//   0        every rank exited 0;
//   2, 3, 4  the first rank to fail exited with that code (bad input / halted /
//            preempted);
//   1        the first rank to fail exited with another code or was killed by a signal;
//   4        the launcher received SIGINT or SIGTERM, forwarded it, and every rank
//            stopped cleanly after its checkpoint (kExitPreempted: resume the run);
//   128+sig  the launcher received SIGINT, SIGTERM or SIGHUP (forwarded to the ranks)
//            and the ranks did not all stop cleanly, unless a rank had already failed
//            (then that rank's code wins).
// args[0] in `self_commands` (gradguard's own subcommands) runs `self_exe` with `args`;
// any other args[0] is a program looked up on PATH (`torchrun --no-python` style).
// Throws gradguard::Error (bad input) before starting anything for invalid options, empty
// `args`, a recursive `launch`, or a program that is not found; (runtime) if a rank cannot
// be started, after stopping the ranks already running.
// Each rank runs in its own process group (signals reach its children too) with stdin
// from /dev/null and the launcher's stdout/stderr. Installs handlers for SIGCHLD, SIGINT,
// SIGTERM and SIGHUP while it runs (restored on return); one launch() at a time per process.
int launch(const LaunchOptions& options, const std::vector<std::string>& args, const std::string& self_exe,
           const std::vector<std::string>& self_commands);

// A TCP port that was free on `addr` (numeric address or host name of this machine),
// chosen below the kernel's ephemeral range (ip_local_port_range), where outgoing
// connections never take it before the rank-0 store binds it: a random port there is
// bound and closed, its neighbours tried when taken; the kernel's choice (port 0) when all
// are. Throws
// gradguard::Error (bad input, "--master-addr") if `addr` cannot be resolved or bound.
int free_tcp_port(const std::string& addr);

}  // namespace gradguard::dist
