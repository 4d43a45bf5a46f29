// Which rank this process is and where the ranks meet, read from the environment the
// launcher left behind. Nothing here is configuration: torchrun, our own `gradguard
// launch`, Open MPI's mpirun and Slurm's srun each export the answer under their own
// names, and detect_env() turns whichever is present into one DistEnv. The sources are
// tried in a fixed order (torchrun convention, then Open MPI, then Slurm, then a single
// process) so that nested launchers resolve to the innermost one: under `srun torchrun`
// both Slurm and torchrun variables are set and torchrun's describe the process.
//
// The environment is read through an EnvLookup so tests can pass a map instead of
// mutating the real environment. Every value is parsed strictly (no trailing junk, no
// overflow) and a bad or inconsistent one throws gradguard::Error (bad input, exit 2)
// naming the variable, the value seen and what would be valid: a wrong rank discovered
// at rendezvous is a hang, found here it is a one-line message.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace gradguard::dist {

struct DistEnv {
  int64_t rank = 0;                       // global rank, 0 <= rank < world_size
  int64_t world_size = 1;                 // number of ranks in the job, >= 1
  int64_t local_rank = 0;                 // rank on this node, 0 <= local_rank < local_world_size
  int64_t local_world_size = 1;           // ranks on this node, 1 <= local_world_size <= world_size
  std::string master_addr = "127.0.0.1";  // rendezvous (TCPStore) host: host of rank 0
  int master_port = 29500;                // rendezvous port, 1..65535
  std::string source = "single";          // "single" | "launch" | "torchrun" | "slurm" | "mpi"

  bool distributed() const { return world_size > 1; }
  // One line for logs, e.g.
  // "rank 1 of 2 (local 1 of 2) via torchrun, rendezvous 10.0.0.1:29500";
  // a single process without a launcher reads "single process (no launcher detected)".
  std::string describe() const;
};

// Reads a variable; returns nullptr when unset (a variable set to "" is set, and empty).
// Tests pass a map-backed function.
using EnvLookup = std::function<const char*(const char* name)>;

// The real environment (std::getenv).
const char* process_env(const char* name);

// Detects the launcher and reads rank, sizes and rendezvous address:
//   torchrun   RANK, WORLD_SIZE, LOCAL_RANK (default RANK), LOCAL_WORLD_SIZE (default
//              WORLD_SIZE), MASTER_ADDR (default 127.0.0.1), MASTER_PORT (default 29500);
//              source "launch" instead when GRADGUARD_LAUNCHED=1 (set by `gradguard launch`).
//   mpi        OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE; MASTER_ADDR must be
//              exported when there is more than one rank; MASTER_PORT default 29500.
//   slurm      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; ranks on this node from
//              SLURM_NTASKS_PER_NODE, else SLURM_TASKS_PER_NODE ("4", "2(x3),1": the
//              entry of node SLURM_NODEID, or the first when that is unset); MASTER_ADDR
//              default the first host of SLURM_JOB_NODELIST (or SLURM_NODELIST);
//              MASTER_PORT default 20000 + SLURM_JOB_ID % 20000 (29500 without a job id),
//              so two jobs sharing a node do not collide.
//   single     none of the above: rank 0 of 1.
// Throws gradguard::Error (bad input) naming the variable ("environment variable RANK").
DistEnv detect_env(const EnvLookup& lookup = process_env);

// The GPU index a rank trains on, among the `gpu_count` devices it sees. `requested` is
// the index of run.device ("cuda:K"), or -1 for "cuda"/"auto". A node's ranks must not
// share a GPU (NCCL refuses two ranks on one device), so without an index rank
// LOCAL_RANK takes cuda:LOCAL_RANK; when every rank sees exactly one GPU -- launchers that
// give each task its own (srun --gpus-per-task=1, one CUDA_VISIBLE_DEVICES per rank) --
// that one. An explicit index is for single-process runs and for nodes with one rank.
// Throws gradguard::Error (bad input, "run.device") saying how many ranks and GPUs this
// node has when no such choice exists.
int64_t gpu_for_rank(int64_t requested, int64_t local_rank, int64_t local_world_size, int64_t gpu_count);

// First host name of a Slurm node list: "node[03-05,9],gpu1" -> "node03"; "a,b" -> "a";
// "rack[1-2]-n[01-04]" -> "rack1-n01". Zero padding is kept. Throws gradguard::Error (bad
// input) when the list is malformed (empty, empty host, unbalanced or nested brackets,
// a bracket item that is not N or N-M with N <= M).
std::string first_slurm_host(const std::string& nodelist);

}  // namespace gradguard::dist
