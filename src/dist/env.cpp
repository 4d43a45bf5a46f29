// Launcher detection. Each source maps its variables onto the same four numbers (rank,
// world size, local rank, local world size) plus a rendezvous address, and all sources
// then go through one validation, so the rules and the messages are the same whichever
// launcher started us. A value that was not in the environment but defaulted from
// another (LOCAL_RANK from RANK, the ranks on a node from SLURM_TASKS_PER_NODE) carries
// a note saying so, because "LOCAL_RANK: 5 is outside [0, 4)" is baffling when the user
// never set LOCAL_RANK.
#include "gradguard/dist/env.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string_view>
#include <system_error>
#include <utility>

#include "gradguard/core/error.h"

namespace gradguard::dist {
namespace {

constexpr int kDefaultPort = 29500;             // torchrun's default MASTER_PORT
constexpr int kSlurmPortBase = 20000;           // Slurm ports: kSlurmPortBase + job id % span
constexpr int kSlurmPortSpan = 20000;           // so ports stay in 20000..39999
constexpr const char* kLoopback = "127.0.0.1";  // rendezvous host of a single-node job

std::string where_of(const char* name) {
  return std::string("environment variable ") + name;
}
std::string in_quotes(std::string_view text) {
  return "\"" + std::string(text) + "\"";
}

// Reads the environment; integers strictly (whole string, base 10, 64-bit).
class Env {
 public:
  explicit Env(const EnvLookup& lookup) : lookup_(lookup) {}

  const char* get(const char* name) const { return lookup_(name); }
  bool has(const char* name) const { return get(name) != nullptr; }

  // Value of a variable that is set, as an integer. `expected` completes "expected ...".
  int64_t integer(const char* name, const std::string& expected) const {
    std::string_view text = get(name);
    int64_t value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec == std::errc::result_out_of_range) {
      throw bad_input(
          where_of(name),
          in_quotes(text) + " is out of range for a 64-bit integer; expected " + expected);
    }
    if (ec != std::errc() || end != text.data() + text.size()) {
      throw bad_input(where_of(name), in_quotes(text) + " is not an integer; expected " + expected);
    }
    return value;
  }

  std::optional<int64_t> optional_integer(const char* name, const std::string& expected) const {
    if (!has(name)) return std::nullopt;
    return integer(name, expected);
  }

 private:
  const EnvLookup& lookup_;
};

// One of the four rank numbers, with the variable it belongs to and, when it was not read
// from that variable, how it was obtained.
struct Field {
  const char* var;
  int64_t value;
  std::string note;  // "" when read from `var`, else e.g. "unset, so it defaults to RANK"

  explicit Field(const char* name, int64_t v = 0, std::string how = "")
      : var(name), value(v), note(std::move(how)) {}

  std::string seen() const {
    return note.empty() ? std::to_string(value) : std::to_string(value) + " (" + note + ")";
  }
};

// Reads `rank_var` and `world_var`, which must be set together (`launcher` names who sets
// them, for the message).
void read_pair(const Env& env, Field* rank, Field* world, const std::string& launcher) {
  bool has_rank = env.has(rank->var), has_world = env.has(world->var);
  if (has_rank != has_world) {
    const Field& missing = has_rank ? *world : *rank;
    const Field& present = has_rank ? *rank : *world;
    throw bad_input(where_of(missing.var), std::string("is unset but ") + present.var +
                                               " is set (" + in_quotes(env.get(present.var)) +
                                               "); " + launcher + " sets both " + rank->var +
                                               " and " + world->var + ", set neither or both");
  }
  world->value = env.integer(world->var, "the number of ranks in the job, an integer >= 1");
  rank->value = env.integer(
      rank->var, std::string("this process's rank, an integer in [0, ") + world->var + ")");
}

// Validates the four numbers and returns them as a DistEnv (rendezvous left at defaults).
DistEnv checked_ranks(const Field& rank, const Field& world, const Field& local_rank,
                      const Field& local_world) {
  const std::string w = std::to_string(world.value);
  if (world.value < 1) {
    throw bad_input(where_of(world.var),
                    world.seen() + " ranks is not a valid world size; expected an integer >= 1");
  }
  if (rank.value < 0 || rank.value >= world.value) {
    throw bad_input(where_of(rank.var), rank.seen() + " is outside [0, " + w + "): " + world.var +
                                            " is " + w + ", so valid ranks are 0.." +
                                            std::to_string(world.value - 1));
  }
  if (local_world.value < 1 || local_world.value > world.value) {
    throw bad_input(where_of(local_world.var),
                    local_world.seen() +
                        " ranks on this node is not valid; expected an integer in [1, " + w +
                        "] (" + world.var + " is " + w + ")");
  }
  if (local_rank.value < 0 || local_rank.value >= local_world.value) {
    const std::string lw = std::to_string(local_world.value);
    const std::string origin = local_world.note.empty()
                                   ? local_world.var
                                   : std::string(local_world.var) + ": " + local_world.note;
    throw bad_input(where_of(local_rank.var), local_rank.seen() + " is outside [0, " + lw +
                                                  "): there are " + lw + " ranks on this node (" +
                                                  origin + "), so valid local ranks are 0.." +
                                                  std::to_string(local_world.value - 1));
  }
  DistEnv out;
  out.rank = rank.value;
  out.world_size = world.value;
  out.local_rank = local_rank.value;
  out.local_world_size = local_world.value;
  return out;
}

int read_port(const Env& env, int fallback) {
  if (!env.has("MASTER_PORT")) return fallback;
  int64_t port = env.integer("MASTER_PORT", "a TCP port in 1..65535");
  if (port < 1 || port > 65535) {
    throw bad_input(where_of("MASTER_PORT"),
                    std::to_string(port) + " is not a TCP port; expected an integer in 1..65535");
  }
  return static_cast<int>(port);
}

// MASTER_ADDR when set and non-empty; 127.0.0.1 for a single rank; else `fallback()`.
template <typename Fallback>
std::string read_addr(const Env& env, int64_t world_size, Fallback fallback) {
  const char* addr = env.get("MASTER_ADDR");
  if (addr != nullptr && *addr != '\0') return addr;
  if (world_size == 1) return kLoopback;
  if (addr != nullptr) {
    throw bad_input(
        where_of("MASTER_ADDR"),
        "is set but empty; with " + std::to_string(world_size) +
            " ranks it must name the host of rank 0 (export MASTER_ADDR=<host of rank 0>)");
  }
  return fallback();
}

// ---- Slurm helpers ---------------------------------------------------------------------

// "03-05" or "9" inside brackets: checks it and returns its first number, padding kept.
template <typename Fail>
std::string first_of_range(std::string_view item, const Fail& fail) {
  auto is_number = [](std::string_view s) {
    return !s.empty() &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  // Numeric order of two digit strings of any length: drop leading zeros, then the longer
  // is larger, then compare as text.
  auto less = [](std::string_view a, std::string_view b) {
    a.remove_prefix(std::min(a.find_first_not_of('0'), a.size()));
    b.remove_prefix(std::min(b.find_first_not_of('0'), b.size()));
    return a.size() != b.size() ? a.size() < b.size() : a < b;
  };
  const size_t dash = item.find('-');
  std::string_view lo = item.substr(0, dash);
  std::string_view hi = dash == std::string_view::npos ? lo : item.substr(dash + 1);
  if (!is_number(lo) || !is_number(hi)) {
    throw fail("bracket item " + in_quotes(item) + " is not a number or a range N-M");
  }
  if (less(hi, lo)) throw fail("range " + in_quotes(item) + " runs backwards");
  return std::string(lo);
}

// Validates the whole list (so a typo anywhere is reported) and returns the first host.
std::string first_host(const std::string& list, const std::string& where) {
  auto fail = [&](const std::string& why) {
    return bad_input(where, in_quotes(list) + " is malformed: " + why +
                                " (expected a Slurm node list such as \"node[01-04,07],gpu1\" or "
                                "\"a,b\")");
  };
  if (list.empty()) throw fail("it is empty");
  std::string first;
  size_t i = 0;  // next character of `list`
  for (;; ++i) {
    std::string host;
    const size_t start = i;
    while (i < list.size() && list[i] != ',') {
      const char c = list[i];
      if (c == '[') {
        const size_t close = list.find(']', i + 1);
        if (close == std::string::npos) {
          throw fail("'[' at character " + std::to_string(i + 1) + " is never closed");
        }
        std::string_view items(list.data() + i + 1, close - i - 1);
        if (items.find('[') != std::string_view::npos) throw fail("brackets cannot nest");
        if (items.empty()) throw fail("empty brackets at character " + std::to_string(i + 1));
        std::string lowest;  // first item's first number (the list order is Slurm's)
        for (size_t pos = 0;;) {
          const size_t comma = items.find(',', pos);
          std::string_view item =
              items.substr(pos, comma == std::string_view::npos ? comma : comma - pos);
          std::string number = first_of_range(item, fail);
          if (lowest.empty()) lowest = number;
          if (comma == std::string_view::npos) break;
          pos = comma + 1;
        }
        host += lowest;
        i = close + 1;
      } else if (c == ']') {
        throw fail("']' at character " + std::to_string(i + 1) + " has no '['");
      } else if (std::isspace(static_cast<unsigned char>(c)) ||
                 std::iscntrl(static_cast<unsigned char>(c))) {
        throw fail("whitespace or a control character at character " + std::to_string(i + 1));
      } else {
        host += c;
        ++i;
      }
    }
    if (host.empty()) throw fail("empty host name at character " + std::to_string(start + 1));
    if (first.empty()) first = host;
    if (i == list.size()) break;
  }
  return first;
}

// Tasks on node `node` (0-based) from SLURM_TASKS_PER_NODE's "2(x3),1" form.
int64_t tasks_on_node(const Env& env, int64_t node, const char* node_var) {
  const char* var = "SLURM_TASKS_PER_NODE";
  const std::string text = env.get(var);
  auto fail = [&](const std::string& why) {
    return bad_input(
        where_of(var),
        in_quotes(text) + " " + why +
            "; expected counts like \"4\" or \"2(x3),1\" (2 tasks on each of 3 nodes, then 1)");
  };
  // Reads a positive decimal at text[*i], advancing *i.
  auto number = [&](size_t* i) {
    int64_t value = 0;
    auto [end, ec] = std::from_chars(text.data() + *i, text.data() + text.size(), value);
    if (ec != std::errc() || value < 1)
      throw fail("is malformed at character " + std::to_string(*i + 1));
    *i = static_cast<size_t>(end - text.data());
    return value;
  };
  std::optional<int64_t> on_node;  // the count for `node`, once the walk passes it
  int64_t nodes = 0;               // nodes described so far
  for (size_t i = 0;;) {
    const int64_t count = number(&i);
    int64_t repeat = 1;
    if (text.compare(i, 2, "(x") == 0) {
      i += 2;
      repeat = number(&i);
      if (i >= text.size() || text[i] != ')')
        throw fail("is malformed at character " + std::to_string(i + 1));
      ++i;
    }
    if (!on_node && node - nodes < repeat) on_node = count;
    if (repeat > std::numeric_limits<int64_t>::max() - nodes)
      throw fail("describes too many nodes");
    nodes += repeat;
    if (i == text.size()) break;
    if (text[i] != ',') throw fail("is malformed at character " + std::to_string(i + 1));
    ++i;
  }
  if (!on_node) {
    throw bad_input(where_of(node_var),
                    std::to_string(node) + " is outside the " + std::to_string(nodes) +
                        " nodes that SLURM_TASKS_PER_NODE (" + in_quotes(text) +
                        ") describes; expected 0.." + std::to_string(nodes - 1));
  }
  return *on_node;
}

// ---- sources ---------------------------------------------------------------------------

// The four numbers of a launcher that exports them all (torchrun, mpirun); the local ones
// default to the global ones, i.e. one node.
DistEnv read_ranks(const Env& env, const char* launcher, Field rank, Field world, Field local_rank,
                   Field local_world) {
  read_pair(env, &rank, &world, launcher);
  const std::string local_expected =
      std::string("this process's rank on its node, an integer in [0, ") + local_world.var + ")";
  if (auto v = env.optional_integer(local_rank.var, local_expected)) {
    local_rank.value = *v;
  } else {
    local_rank =
        Field{local_rank.var, rank.value, std::string("unset, so it defaults to ") + rank.var};
  }
  if (auto v = env.optional_integer(local_world.var,
                                    "the number of ranks on this node, an integer >= 1")) {
    local_world.value = *v;
  } else {
    local_world =
        Field{local_world.var, world.value, std::string("unset, so it defaults to ") + world.var};
  }
  return checked_ranks(rank, world, local_rank, local_world);
}

// torchrun convention (also `gradguard launch` and `torchrun --no-python`).
DistEnv from_torchrun(const Env& env) {
  DistEnv out = read_ranks(env, "torchrun", Field{"RANK"}, Field{"WORLD_SIZE"}, Field{"LOCAL_RANK"},
                           Field{"LOCAL_WORLD_SIZE"});
  // torchrun always exports MASTER_ADDR; a hand-set RANK/WORLD_SIZE without it is taken to
  // be one node.
  out.master_addr = read_addr(env, out.world_size, [] { return std::string(kLoopback); });
  out.master_port = read_port(env, kDefaultPort);
  const char* launched = env.get("GRADGUARD_LAUNCHED");
  out.source = launched != nullptr && std::string_view(launched) == "1" ? "launch" : "torchrun";
  return out;
}

// Open MPI's mpirun.
DistEnv from_mpi(const Env& env) {
  DistEnv out =
      read_ranks(env, "mpirun", Field{"OMPI_COMM_WORLD_RANK"}, Field{"OMPI_COMM_WORLD_SIZE"},
                 Field{"OMPI_COMM_WORLD_LOCAL_RANK"}, Field{"OMPI_COMM_WORLD_LOCAL_SIZE"});
  out.master_addr = read_addr(env, out.world_size, [&]() -> std::string {
    throw bad_input(where_of("MASTER_ADDR"),
                    "is unset; mpirun does not say where rank 0 runs, so with " +
                        std::to_string(out.world_size) +
                        " ranks export MASTER_ADDR=<host of rank 0> and pass it to every rank "
                        "with `mpirun -x MASTER_ADDR`");
  });
  out.master_port = read_port(env, kDefaultPort);
  out.source = "mpi";
  return out;
}

// Slurm's srun.
DistEnv from_slurm(const Env& env) {
  Field rank{"SLURM_PROCID"}, world{"SLURM_NTASKS"}, local_rank{"SLURM_LOCALID"};
  for (const char* needed : {"SLURM_NTASKS", "SLURM_LOCALID"}) {
    if (!env.has(needed)) {
      throw bad_input(where_of(needed),
                      std::string("is unset but SLURM_PROCID is set (") +
                          in_quotes(env.get("SLURM_PROCID")) +
                          "); srun sets SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID together");
    }
  }
  world.value = env.integer(world.var, "the number of tasks in the job step, an integer >= 1");
  rank.value = env.integer(rank.var, "this task's rank, an integer in [0, SLURM_NTASKS)");
  local_rank.value = env.integer(local_rank.var, "this task's rank on its node, an integer >= 0");

  Field local_world{"SLURM_NTASKS_PER_NODE"};
  if (env.has("SLURM_NTASKS_PER_NODE")) {
    local_world.value =
        env.integer(local_world.var, "the number of tasks per node, an integer >= 1");
  } else if (env.has("SLURM_TASKS_PER_NODE")) {
    const char* node_var = "SLURM_NODEID";
    int64_t node =
        env.optional_integer(node_var, "this node's index in the job step, an integer >= 0")
            .value_or(0);
    if (node < 0) {
      throw bad_input(where_of(node_var),
                      std::to_string(node) + " is not a node index; expected an integer >= 0");
    }
    local_world = Field{
        "SLURM_TASKS_PER_NODE", tasks_on_node(env, node, node_var),
        "from " + in_quotes(env.get("SLURM_TASKS_PER_NODE")) + " for node " + std::to_string(node)};
  } else {
    local_world = Field{"SLURM_TASKS_PER_NODE", world.value,
                        "unset, as is SLURM_NTASKS_PER_NODE, so it defaults to SLURM_NTASKS"};
  }
  DistEnv out = checked_ranks(rank, world, local_rank, local_world);
  out.master_addr = read_addr(env, out.world_size, [&]() -> std::string {
    for (const char* var : {"SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
      if (env.has(var)) return first_host(env.get(var), where_of(var));
    }
    throw bad_input(where_of("SLURM_JOB_NODELIST"),
                    "is unset (and so is SLURM_NODELIST), so the host of rank 0 is unknown; "
                    "export MASTER_ADDR=<host of rank 0>");
  });
  int fallback_port = kDefaultPort;
  if (auto job = env.optional_integer("SLURM_JOB_ID", "the Slurm job id, an integer >= 0")) {
    if (*job < 0) {
      throw bad_input(where_of("SLURM_JOB_ID"),
                      std::to_string(*job) + " is not a job id; expected an integer >= 0");
    }
    fallback_port = kSlurmPortBase + static_cast<int>(*job % kSlurmPortSpan);
  }
  out.master_port = read_port(env, fallback_port);
  out.source = "slurm";
  return out;
}

}  // namespace

std::string DistEnv::describe() const {
  if (source == "single") return "single process (no launcher detected)";
  // An IPv6 address needs brackets before ":port".
  const std::string host =
      master_addr.find(':') != std::string::npos ? "[" + master_addr + "]" : master_addr;
  return "rank " + std::to_string(rank) + " of " + std::to_string(world_size) + " (local " +
         std::to_string(local_rank) + " of " + std::to_string(local_world_size) + ") via " +
         source + ", rendezvous " + host + ":" + std::to_string(master_port);
}

const char* process_env(const char* name) {
  return std::getenv(name);
}

DistEnv detect_env(const EnvLookup& lookup) {
  const Env env(lookup);
  if (env.has("RANK") || env.has("WORLD_SIZE")) return from_torchrun(env);
  if (env.has("OMPI_COMM_WORLD_RANK") || env.has("OMPI_COMM_WORLD_SIZE")) return from_mpi(env);
  if (env.has("SLURM_PROCID")) return from_slurm(env);
  return DistEnv{};
}

std::string first_slurm_host(const std::string& nodelist) {
  return first_host(nodelist, "Slurm node list");
}

int64_t gpu_for_rank(int64_t requested, int64_t local_rank, int64_t local_world_size, int64_t gpu_count) {
  const auto n = [](int64_t v, const char* what) {
    return std::to_string(v) + " " + what + (v == 1 ? "" : "s");
  };
  const std::string seen = n(gpu_count, "GPU") + " visible to rank " + std::to_string(local_rank) + " of " +
                           n(local_world_size, "rank") + " on this node";
  if (gpu_count < 1) throw bad_input("run.device", "no GPU is visible (" + seen + ")");
  if (requested >= 0) {
    if (local_world_size > 1)
      throw bad_input("run.device", "cuda:" + std::to_string(requested) + " would put all " +
                                        n(local_world_size, "rank") +
                                        " of this node on one GPU; set run.device=cuda and every rank takes "
                                        "cuda:LOCAL_RANK (" + seen + ")");
    if (requested >= gpu_count)
      throw bad_input("run.device", "cuda:" + std::to_string(requested) + " does not exist (" + seen + ")");
    return requested;
  }
  if (gpu_count >= local_world_size) return local_rank;
  if (gpu_count == 1) return 0;  // the launcher gave each rank its own GPU
  throw bad_input("run.device", "two ranks would share a GPU (" + seen +
                                    "): start at most one rank per GPU, or give each rank its own "
                                    "(CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES, srun --gpus-per-task=1)");
}

}  // namespace gradguard::dist
