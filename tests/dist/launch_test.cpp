// `gradguard launch` (dist/launch.h): the ranks are small `sh -c` scripts that write
// what they see (environment, their pid) into a temp dir, so the tests check the
// environment contract, failure propagation (exit codes, the message naming the rank, the
// other ranks gone), the SIGKILL after the grace period, signal forwarding and every
// bad-input path. Rank scripts end in `exec sleep 60` so the pid they write is the
// process the launcher must stop; each test finishes in a few seconds or fails.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "gradguard/dist/launch.h"
#include "test_util.h"

extern char** environ;

namespace gradguard::dist {
namespace {
using ::testing::HasSubstr;
using test::run_cli;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// KEY=VALUE lines of an `env` dump.
std::map<std::string, std::string> read_env(const std::string& path) {
  std::map<std::string, std::string> env;
  std::istringstream in(test::read_text(path));
  for (std::string line; std::getline(in, line);) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

pid_t read_pid(const std::string& path) { return static_cast<pid_t>(std::stol(test::read_text(path))); }

bool is_gone(pid_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

bool wait_for_files(const std::vector<std::string>& paths, double timeout_s) {
  const auto start = Clock::now();
  while (seconds_since(start) < timeout_s) {
    bool all = true;
    for (const auto& p : paths) all = all && std::filesystem::exists(p) && std::filesystem::file_size(p) > 0;
    if (all) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// Starts the CLI with `args`, output to `log`, signals at their defaults whatever the
// test runner ignores (the launcher keeps ignored signals ignored).
pid_t spawn_cli(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> all = {GRADGUARD_CLI_PATH};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t defaults, none;
  sigemptyset(&defaults);
  sigemptyset(&none);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&defaults, sig);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &actions, &attr, argv.data(), environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  EXPECT_EQ(rc, 0);
  return pid;
}

// The exit code of `pid`, or -1 (after SIGKILLing it) when it runs past `timeout_s` or
// dies from a signal.
int wait_exit(pid_t pid, double timeout_s) {
  const auto start = Clock::now();
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (seconds_since(start) > timeout_s) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(LaunchOptions, ValidateNamesTheOption) {
  auto message = [](LaunchOptions o) { return test::bad_input_message([&] { o.validate(); }); };
  LaunchOptions o;
  EXPECT_NO_THROW(o.validate());
  o.nproc = 0;
  EXPECT_THAT(message(o), HasSubstr("--nproc"));
  o.nproc = 1025;
  EXPECT_THAT(message(o), HasSubstr("--nproc"));
  o = LaunchOptions{};
  o.master_port = 65536;
  EXPECT_THAT(message(o), HasSubstr("--master-port"));
  o.master_port = -1;
  EXPECT_THAT(message(o), HasSubstr("--master-port"));
  o = LaunchOptions{};
  o.grace_s = -1;
  EXPECT_THAT(message(o), HasSubstr("--grace-s"));
  o.grace_s = std::nan("");
  EXPECT_THAT(message(o), HasSubstr("--grace-s"));
  o = LaunchOptions{};
  o.master_addr = "";
  EXPECT_THAT(message(o), HasSubstr("--master-addr"));
}

TEST(LaunchFreePort, BindsOnTheAddressBelowTheEphemeralRange) {
  const int port = free_tcp_port("127.0.0.1");
  EXPECT_GE(port, 1);
  EXPECT_LE(port, 65535);
  // Below the range outgoing connections draw from, so none of them takes it before the
  // rank-0 store binds it.
  int low = 32768, high = 60999;
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  if (range) range >> low >> high;
  EXPECT_LT(port, low);
  EXPECT_GE(port, std::max(1025, low - 12000));
  // 192.0.2.1 (TEST-NET-1) is never an address of this machine.
  EXPECT_THAT(test::bad_input_message([] { free_tcp_port("192.0.2.1"); }), HasSubstr("--master-addr"));
}

TEST(LaunchLibrary, RunsProgramsAndRejectsBadArgs) {
  LaunchOptions o;
  o.nproc = 3;
  EXPECT_EQ(launch(o, {"sh", "-c", "exit 0"}, "", {"train"}), 0);
  EXPECT_EQ(launch(o, {"sh", "-c", "[ \"$RANK\" = 2 ] && exit 7; exit 0"}, "", {"train"}), 1);
  EXPECT_THAT(test::bad_input_message([&] { launch(o, {}, "", {"train"}); }), HasSubstr("--"));
  EXPECT_THAT(test::bad_input_message([&] { launch(o, {"launch", "--", "true"}, "", {"train"}); }),
              HasSubstr("recursive"));
  const std::string missing =
      test::bad_input_message([&] { launch(o, {"gradguard-no-such-program"}, "", {"train", "config"}); });
  EXPECT_THAT(missing, HasSubstr("gradguard-no-such-program"));
  EXPECT_THAT(missing, HasSubstr("PATH"));
}

TEST(LaunchCli, EveryRankSeesItsEnvironment) {
  test::TempDir dir;
  setenv("GRADGUARD_LAUNCH_TEST_INHERITED", "yes", 1);
  setenv("RANK", "99", 1);  // replaced, not duplicated
  auto r = run_cli("launch --nproc 3 -- sh -c 'env > env.$RANK'", dir.path());
  unsetenv("GRADGUARD_LAUNCH_TEST_INHERITED");
  unsetenv("RANK");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string port;
  for (int rank = 0; rank < 3; ++rank) {
    auto env = read_env(dir.file("env." + std::to_string(rank)));
    EXPECT_EQ(env["RANK"], std::to_string(rank));
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(rank));
    EXPECT_EQ(env["WORLD_SIZE"], "3");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "3");
    EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(env["GRADGUARD_LAUNCHED"], "1");
    EXPECT_EQ(env["GRADGUARD_LAUNCH_TEST_INHERITED"], "yes");
    if (rank == 0) port = env["MASTER_PORT"];
    EXPECT_EQ(env["MASTER_PORT"], port);
  }
  ASSERT_FALSE(port.empty());
  EXPECT_GE(std::stoi(port), 1);
  EXPECT_LE(std::stoi(port), 65535);

  r = run_cli("launch --nproc 1 --master-addr localhost --master-port 29123 -- sh -c 'env > env.$RANK'", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto env = read_env(dir.file("env.0"));
  EXPECT_EQ(env["MASTER_ADDR"], "localhost");
  EXPECT_EQ(env["MASTER_PORT"], "29123");
  EXPECT_EQ(env["WORLD_SIZE"], "1");
}

TEST(LaunchCli, ArgumentsAfterDashDashPassThroughUntouched) {
  test::TempDir dir;
  auto r = run_cli("launch --nproc 1 -- sh -c 'printf \"%s\\n\" \"$@\" > args' sh --set a=b -- --nproc 3", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(test::read_text(dir.file("args")), "--set\na=b\n--\n--nproc\n3\n");
}

TEST(LaunchCli, FailingRankStopsTheOthersAndSetsTheExitCode) {
  test::TempDir dir;
  const auto start = Clock::now();
  auto r = run_cli(
      "launch --nproc 3 -- sh -c 'echo $$ > pid.$RANK; if [ \"$RANK\" = 1 ]; then "
      "while [ ! -s pid.0 ] || [ ! -s pid.2 ]; do sleep 0.05; done; exit 3; fi; exec sleep 60'",
      dir.path());
  EXPECT_LT(seconds_since(start), 30);  // the other ranks sleep 60 s; most of this is CLI start-up
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_THAT(r.output, HasSubstr("rank 1 (pid " + std::to_string(read_pid(dir.file("pid.1"))) +
                                  ") exited with code 3; stopping ranks 0, 2"));
  EXPECT_TRUE(is_gone(read_pid(dir.file("pid.0"))));
  EXPECT_TRUE(is_gone(read_pid(dir.file("pid.2"))));
}

TEST(LaunchCli, RankKilledBySignalExitsOneAndNamesTheSignal) {
  test::TempDir dir;
  auto r = run_cli(
      "launch --nproc 2 -- sh -c 'echo $$ > pid.$RANK; if [ \"$RANK\" = 1 ]; then "
      "while [ ! -s pid.0 ]; do sleep 0.05; done; kill -9 $$; fi; exec sleep 60'",
      dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("rank 1 (pid"));
  EXPECT_THAT(r.output, HasSubstr("was killed by signal 9 (Killed); stopping rank 0"));
  EXPECT_TRUE(is_gone(read_pid(dir.file("pid.0"))));
}

TEST(LaunchCli, RankIgnoringSigtermIsKilledAfterTheGracePeriod) {
  test::TempDir dir;
  const auto start = Clock::now();
  auto r = run_cli(
      "launch --nproc 2 --grace-s 1 -- sh -c 'trap \"\" TERM; echo $$ > pid.$RANK; if [ \"$RANK\" = 1 ]; then "
      "while [ ! -s pid.0 ]; do sleep 0.05; done; exit 5; fi; exec sleep 60'",
      dir.path());
  const double elapsed = seconds_since(start);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_GE(elapsed, 1.0);
  EXPECT_LT(elapsed, 30);
  EXPECT_THAT(r.output, HasSubstr("exited with code 5; stopping rank 0"));
  EXPECT_THAT(r.output, HasSubstr("rank 0 still running 1 s after SIGTERM; sending SIGKILL"));
  EXPECT_TRUE(is_gone(read_pid(dir.file("pid.0"))));
}

// Sends `sig` to a running launcher; expects 128+sig and both ranks gone.
void expect_signal_forwarded(int sig) {
  test::TempDir dir;
  const std::string script = "echo $$ > " + dir.path() + "/pid.$RANK; exec sleep 60";
  const pid_t launcher = spawn_cli({"launch", "--nproc", "2", "--", "sh", "-c", script}, dir.file("log"));
  ASSERT_TRUE(wait_for_files({dir.file("pid.0"), dir.file("pid.1")}, 20)) << test::read_text(dir.file("log"));
  ASSERT_EQ(kill(launcher, sig), 0);
  EXPECT_EQ(wait_exit(launcher, 5), 128 + sig) << test::read_text(dir.file("log"));
  EXPECT_THAT(test::read_text(dir.file("log")), HasSubstr("received signal " + std::to_string(sig)));
  EXPECT_TRUE(is_gone(read_pid(dir.file("pid.0"))));
  EXPECT_TRUE(is_gone(read_pid(dir.file("pid.1"))));
}

TEST(LaunchCli, ForwardsSigterm) { expect_signal_forwarded(SIGTERM); }
TEST(LaunchCli, ForwardsSigint) { expect_signal_forwarded(SIGINT); }
TEST(LaunchCli, ForwardsSighup) { expect_signal_forwarded(SIGHUP); }

TEST(LaunchCli, SecondSignalKillsWithoutWaitingForTheGracePeriod) {
  test::TempDir dir;
  const std::string script = "trap '' TERM; echo $$ > " + dir.path() + "/pid.$RANK; exec sleep 60";
  const pid_t launcher =
      spawn_cli({"launch", "--nproc", "2", "--grace-s", "60", "--", "sh", "-c", script}, dir.file("log"));
  ASSERT_TRUE(wait_for_files({dir.file("pid.0"), dir.file("pid.1")}, 20)) << test::read_text(dir.file("log"));
  ASSERT_EQ(kill(launcher, SIGTERM), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_EQ(kill(launcher, SIGINT), 0);
  EXPECT_EQ(wait_exit(launcher, 5), 128 + SIGTERM) << test::read_text(dir.file("log"));
  EXPECT_THAT(test::read_text(dir.file("log")), HasSubstr("while stopping; killing ranks 0, 1 now"));
  EXPECT_TRUE(is_gone(read_pid(dir.file("pid.0"))));
}

// One CLI run per case (each start-up costs about a second): the arguments and what the
// message must contain.
struct BadInputCase {
  const char* name;  // test name suffix
  const char* args;
  const char* expected;
};

void PrintTo(const BadInputCase& c, std::ostream* os) { *os << c.args; }

class LaunchCliBadInput : public ::testing::TestWithParam<BadInputCase> {};

TEST_P(LaunchCliBadInput, ExitsTwoNamingTheOption) {
  test::TempDir dir;
  auto r = run_cli(GetParam().args, dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr(GetParam().expected));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, LaunchCliBadInput,
    ::testing::Values(BadInputCase{"NprocZero", "launch --nproc 0 -- true", "--nproc"},
                      BadInputCase{"NprocTooLarge", "launch --nproc 1025 -- true", "--nproc"},
                      BadInputCase{"NoArgs", "launch --nproc 2", "`--`"},
                      BadInputCase{"NothingAfterDashDash", "launch --nproc 2 --", "`--`"},
                      BadInputCase{"RecursiveLaunch", "launch --nproc 2 -- launch --nproc 2 -- true", "recursive"},
                      BadInputCase{"ProgramNotFound", "launch -- gradguard-no-such-program --flag",
                                   "gradguard-no-such-program: program not found: searched PATH"},
                      BadInputCase{"PortZero", "launch --master-port 0 -- true", "--master-port"},
                      BadInputCase{"PortTooLarge", "launch --master-port 65536 -- true", "--master-port"},
                      BadInputCase{"NegativeGrace", "launch --grace-s -1 -- true", "--grace-s"},
                      BadInputCase{"AddressNotLocal", "launch --master-addr 192.0.2.1 -- true", "--master-addr"}),
    [](const ::testing::TestParamInfo<BadInputCase>& info) { return std::string(info.param.name); });

TEST(LaunchCli, GradguardSubcommandRunsThisExecutable) {
  test::TempDir dir;
  auto r = run_cli("launch --nproc 2 -- config show --set optim.lr=0.0123", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("lr: 0.0123"));
}

TEST(LaunchCli, BadInputInARankIsTheLaunchersExitCode) {
  test::TempDir dir;
  auto r = run_cli("launch --nproc 2 -- config show --set clip.max=1", dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("did you mean 'clip.max_norm'"));
  EXPECT_THAT(r.output, HasSubstr("exited with code 2"));
}

}  // namespace
}  // namespace gradguard::dist
