// Launcher detection: each source (torchrun, `gradguard launch`, Open MPI, Slurm, none)
// read from a map standing in for the environment, the precedence of nested launchers,
// the defaults, every rejected value with the variable named in the message, Slurm node
// and task lists, and describe().
#include "gradguard/dist/env.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "gradguard/core/error.h"
#include "test_util.h"

namespace gradguard::dist {
namespace {
using ::testing::AllOf;
using ::testing::HasSubstr;

using Vars = std::map<std::string, std::string>;  // [variable name] -> value

DistEnv detect(const Vars& vars) {
  return detect_env([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

std::string error_of(const Vars& vars) {
  return test::bad_input_message([&] { detect(vars); });
}

std::string node_list_error(const std::string& list) {
  return test::bad_input_message([&] { first_slurm_host(list); });
}

// What torchrun exports for rank 1 of 2 on one node.
Vars torchrun_rank1() {
  return {{"RANK", "1"},
          {"WORLD_SIZE", "2"},
          {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", "2"},
          {"MASTER_ADDR", "10.0.0.1"},
          {"MASTER_PORT", "29500"}};
}

// What srun exports for task 5 of 8, two nodes of four, in job 12345.
Vars srun_task5() {
  return {{"SLURM_PROCID", "5"},
          {"SLURM_NTASKS", "8"},
          {"SLURM_LOCALID", "1"},
          {"SLURM_NODEID", "1"},
          {"SLURM_TASKS_PER_NODE", "4(x2)"},
          {"SLURM_JOB_NODELIST", "gpu[07-08]"},
          {"SLURM_JOB_ID", "12345"}};
}

// What mpirun exports for rank 3 of 4, two per node.
Vars mpirun_rank3() {
  return {{"OMPI_COMM_WORLD_RANK", "3"},
          {"OMPI_COMM_WORLD_SIZE", "4"},
          {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
          {"MASTER_ADDR", "node1"}};
}

// ---- sources ---------------------------------------------------------------------------

TEST(DistEnv, NoLauncherIsASingleProcess) {
  DistEnv env = detect({{"PATH", "/usr/bin"}, {"SLURM_JOB_ID", "7"}, {"SLURM_NTASKS", "4"}});
  EXPECT_EQ(env.source, "single");  // a salloc shell without srun: no SLURM_PROCID
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.local_rank, 0);
  EXPECT_EQ(env.local_world_size, 1);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_EQ(env.master_port, 29500);
  EXPECT_FALSE(env.distributed());
}

TEST(DistEnv, ProcessEnvReadsTheRealEnvironment) {
  ASSERT_EQ(::setenv("GRADGUARD_ENV_TEST_VAR", "42", 1), 0);
  EXPECT_STREQ(process_env("GRADGUARD_ENV_TEST_VAR"), "42");
  ::unsetenv("GRADGUARD_ENV_TEST_VAR");
  EXPECT_EQ(process_env("GRADGUARD_ENV_TEST_VAR"), nullptr);
}

TEST(DistEnvTorchrun, ReadsEveryVariable) {
  DistEnv env = detect(torchrun_rank1());
  EXPECT_EQ(env.source, "torchrun");
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.world_size, 2);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "10.0.0.1");
  EXPECT_EQ(env.master_port, 29500);
  EXPECT_TRUE(env.distributed());

  Vars two_nodes = torchrun_rank1();
  two_nodes["RANK"] = "3";
  two_nodes["WORLD_SIZE"] = "4";
  two_nodes["MASTER_PORT"] = "1234";
  env = detect(two_nodes);
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_port, 1234);
}

TEST(DistEnvTorchrun, DefaultsLocalValuesAndRendezvous) {
  DistEnv env = detect({{"RANK", "2"}, {"WORLD_SIZE", "3"}});
  EXPECT_EQ(env.source, "torchrun");
  EXPECT_EQ(env.local_rank, 2);        // LOCAL_RANK defaults to RANK
  EXPECT_EQ(env.local_world_size, 3);  // LOCAL_WORLD_SIZE to WORLD_SIZE
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_EQ(env.master_port, 29500);

  env = detect({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", ""}});
  EXPECT_EQ(env.master_addr, "127.0.0.1");  // empty is fine for one rank
  EXPECT_FALSE(env.distributed());
}

TEST(DistEnvTorchrun, GradguardLaunchedMarksOurLauncher) {
  Vars vars = torchrun_rank1();
  vars["GRADGUARD_LAUNCHED"] = "1";
  DistEnv env = detect(vars);
  EXPECT_EQ(env.source, "launch");
  EXPECT_EQ(env.rank, 1);
  vars["GRADGUARD_LAUNCHED"] = "0";
  EXPECT_EQ(detect(vars).source, "torchrun");
}

TEST(DistEnvTorchrun, BeatsSlurmAndMpiWhenNested) {
  // `srun torchrun ...`: srun's variables describe the torchrun agent, not this worker.
  Vars vars = srun_task5();
  for (const auto& [name, value] : torchrun_rank1()) vars[name] = value;
  for (const auto& [name, value] : mpirun_rank3()) vars.emplace(name, value);
  DistEnv env = detect(vars);
  EXPECT_EQ(env.source, "torchrun");
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.world_size, 2);
  EXPECT_EQ(env.master_addr, "10.0.0.1");
  EXPECT_EQ(env.master_port, 29500);  // not Slurm's job-id port
}

TEST(DistEnvMpi, ReadsOpenMpiVariables) {
  DistEnv env = detect(mpirun_rank3());
  EXPECT_EQ(env.source, "mpi");
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "node1");
  EXPECT_EQ(env.master_port, 29500);

  Vars vars = mpirun_rank3();
  vars["MASTER_PORT"] = "40000";
  EXPECT_EQ(detect(vars).master_port, 40000);
}

TEST(DistEnvMpi, BeatsSlurm) {
  Vars vars = srun_task5();
  for (const auto& [name, value] : mpirun_rank3()) vars[name] = value;
  EXPECT_EQ(detect(vars).source, "mpi");
}

TEST(DistEnvMpi, NeedsMasterAddrForSeveralRanks) {
  Vars vars = mpirun_rank3();
  vars.erase("MASTER_ADDR");
  EXPECT_THAT(error_of(vars), AllOf(HasSubstr("environment variable MASTER_ADDR"),
                                    HasSubstr("export MASTER_ADDR=<host of rank 0>"),
                                    HasSubstr("mpirun -x MASTER_ADDR")));
  DistEnv one = detect({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}});
  EXPECT_EQ(one.source, "mpi");
  EXPECT_EQ(one.master_addr, "127.0.0.1");
  EXPECT_EQ(one.local_world_size, 1);
}

TEST(DistEnvSlurm, ReadsSrunVariables) {
  DistEnv env = detect(srun_task5());
  EXPECT_EQ(env.source, "slurm");
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.master_addr, "gpu07");        // first host of the node list
  EXPECT_EQ(env.master_port, 20000 + 12345);  // 20000 + job id % 20000
}

TEST(DistEnvSlurm, RanksPerNode) {
  Vars vars = srun_task5();
  vars["SLURM_NTASKS_PER_NODE"] = "4";  // wins over SLURM_TASKS_PER_NODE
  vars["SLURM_TASKS_PER_NODE"] = "junk";
  EXPECT_EQ(detect(vars).local_world_size, 4);

  // "2(x3),1": 2 tasks on nodes 0..2, 1 on node 3; SLURM_NODEID picks the entry.
  vars = {{"SLURM_PROCID", "0"},
          {"SLURM_NTASKS", "7"},
          {"SLURM_LOCALID", "0"},
          {"SLURM_TASKS_PER_NODE", "2(x3),1"},
          {"MASTER_ADDR", "head"}};
  EXPECT_EQ(detect(vars).local_world_size, 2);  // no SLURM_NODEID: the first entry
  vars["SLURM_NODEID"] = "2";
  EXPECT_EQ(detect(vars).local_world_size, 2);
  vars["SLURM_NODEID"] = "3";
  vars["SLURM_PROCID"] = "6";
  EXPECT_EQ(detect(vars).local_world_size, 1);

  vars = {{"SLURM_PROCID", "0"},
          {"SLURM_NTASKS", "1"},
          {"SLURM_LOCALID", "0"},
          {"SLURM_TASKS_PER_NODE", "1"}};
  DistEnv one = detect(vars);
  EXPECT_EQ(one.local_world_size, 1);
  EXPECT_EQ(one.master_addr, "127.0.0.1");
  EXPECT_EQ(one.master_port, 29500);  // no job id

  vars.erase("SLURM_TASKS_PER_NODE");  // neither count: one node
  vars["SLURM_NTASKS"] = "3";
  vars["SLURM_PROCID"] = "2";
  vars["SLURM_LOCALID"] = "2";
  vars["MASTER_ADDR"] = "head";
  EXPECT_EQ(detect(vars).local_world_size, 3);
}

TEST(DistEnvSlurm, Rendezvous) {
  Vars vars = srun_task5();
  vars["SLURM_JOB_ID"] = "40001";
  EXPECT_EQ(detect(vars).master_port, 20001);  // stays in 20000..39999
  vars["MASTER_PORT"] = "29400";
  vars["MASTER_ADDR"] = "login-free-host";
  EXPECT_EQ(detect(vars).master_port, 29400);
  EXPECT_EQ(detect(vars).master_addr, "login-free-host");

  vars = srun_task5();
  vars.erase("SLURM_JOB_ID");
  vars.erase("SLURM_JOB_NODELIST");
  vars["SLURM_NODELIST"] = "cn005,cn006";  // older Slurm name
  EXPECT_EQ(detect(vars).master_addr, "cn005");
  EXPECT_EQ(detect(vars).master_port, 29500);

  vars.erase("SLURM_NODELIST");
  EXPECT_THAT(error_of(vars), AllOf(HasSubstr("environment variable SLURM_JOB_NODELIST"),
                                    HasSubstr("export MASTER_ADDR")));
}

// ---- rejected values -------------------------------------------------------------------

TEST(DistEnvErrors, HalfAPairIsAnError) {
  EXPECT_THAT(error_of({{"RANK", "0"}}),
              AllOf(HasSubstr("environment variable WORLD_SIZE"), HasSubstr("RANK is set")));
  EXPECT_THAT(error_of({{"WORLD_SIZE", "2"}}),
              AllOf(HasSubstr("environment variable RANK"), HasSubstr("WORLD_SIZE is set")));
  EXPECT_THAT(error_of({{"OMPI_COMM_WORLD_RANK", "0"}}),
              HasSubstr("environment variable OMPI_COMM_WORLD_SIZE"));
  EXPECT_THAT(error_of({{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}}),
              HasSubstr("environment variable SLURM_NTASKS"));
  EXPECT_THAT(error_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}),
              HasSubstr("environment variable SLURM_LOCALID"));
}

TEST(DistEnvErrors, NonIntegersNameTheVariableAndTheValue) {
  const Vars base_torchrun = torchrun_rank1();
  const Vars base_slurm = srun_task5();
  const Vars base_mpi = mpirun_rank3();
  struct Case {
    const Vars* base;
    std::string var;
  };
  const Case cases[] = {
      {&base_torchrun, "RANK"},
      {&base_torchrun, "WORLD_SIZE"},
      {&base_torchrun, "LOCAL_RANK"},
      {&base_torchrun, "LOCAL_WORLD_SIZE"},
      {&base_torchrun, "MASTER_PORT"},
      {&base_mpi, "OMPI_COMM_WORLD_RANK"},
      {&base_mpi, "OMPI_COMM_WORLD_SIZE"},
      {&base_mpi, "OMPI_COMM_WORLD_LOCAL_RANK"},
      {&base_mpi, "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {&base_slurm, "SLURM_PROCID"},
      {&base_slurm, "SLURM_NTASKS"},
      {&base_slurm, "SLURM_LOCALID"},
      {&base_slurm, "SLURM_NODEID"},
      {&base_slurm, "SLURM_NTASKS_PER_NODE"},
      {&base_slurm, "SLURM_JOB_ID"},
  };
  for (const Case& c : cases) {
    for (const std::string bad :
         {"1x", "", " 1", "1 ", "+1", "0x10", "1.0", "two", "99999999999999999999"}) {
      Vars vars = *c.base;
      vars[c.var] = bad;
      SCOPED_TRACE(c.var + "=" + bad);
      EXPECT_THAT(error_of(vars), AllOf(HasSubstr("environment variable " + c.var),
                                        HasSubstr("\"" + bad + "\""), HasSubstr("expected")));
    }
  }
}

TEST(DistEnvErrors, WorldSizeBelowOne) {
  EXPECT_THAT(
      error_of({{"RANK", "0"}, {"WORLD_SIZE", "0"}}),
      AllOf(HasSubstr("environment variable WORLD_SIZE"), HasSubstr("0 ranks"), HasSubstr(">= 1")));
  Vars vars = srun_task5();
  vars["SLURM_NTASKS"] = "-2";
  EXPECT_THAT(error_of(vars), AllOf(HasSubstr("environment variable SLURM_NTASKS"), HasSubstr("-2"),
                                    HasSubstr(">= 1")));
}

TEST(DistEnvErrors, RankOutsideTheWorld) {
  EXPECT_THAT(error_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}}),
              AllOf(HasSubstr("environment variable RANK"), HasSubstr("2 is outside [0, 2)"),
                    HasSubstr("0..1")));
  EXPECT_THAT(error_of({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}),
              AllOf(HasSubstr("environment variable RANK"), HasSubstr("-1 is outside")));
  Vars vars = mpirun_rank3();
  vars["OMPI_COMM_WORLD_RANK"] = "4";
  EXPECT_THAT(error_of(vars), HasSubstr("environment variable OMPI_COMM_WORLD_RANK: 4"));
  vars = srun_task5();
  vars["SLURM_PROCID"] = "8";
  EXPECT_THAT(error_of(vars), HasSubstr("environment variable SLURM_PROCID: 8"));
}

TEST(DistEnvErrors, LocalRankOutsideTheNode) {
  Vars vars = torchrun_rank1();
  vars["LOCAL_RANK"] = "2";
  EXPECT_THAT(error_of(vars), AllOf(HasSubstr("environment variable LOCAL_RANK"),
                                    HasSubstr("2 is outside [0, 2)")));
  // A defaulted value says where it came from.
  vars = {{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "4"}};
  EXPECT_THAT(error_of(vars), AllOf(HasSubstr("environment variable LOCAL_RANK"),
                                    HasSubstr("defaults to RANK"), HasSubstr("[0, 4)")));
  vars = srun_task5();
  vars["SLURM_LOCALID"] = "4";
  EXPECT_THAT(error_of(vars),
              AllOf(HasSubstr("environment variable SLURM_LOCALID: 4"), HasSubstr("\"4(x2)\"")));
  vars = mpirun_rank3();
  vars["OMPI_COMM_WORLD_LOCAL_RANK"] = "-1";
  EXPECT_THAT(error_of(vars), HasSubstr("environment variable OMPI_COMM_WORLD_LOCAL_RANK: -1"));
}

TEST(DistEnvErrors, LocalWorldSizeOutOfRange) {
  Vars vars = torchrun_rank1();
  vars["LOCAL_WORLD_SIZE"] = "0";
  EXPECT_THAT(error_of(vars),
              AllOf(HasSubstr("environment variable LOCAL_WORLD_SIZE"), HasSubstr("[1, 2]")));
  vars["LOCAL_WORLD_SIZE"] = "3";  // more on this node than in the job
  EXPECT_THAT(error_of(vars), HasSubstr("environment variable LOCAL_WORLD_SIZE: 3"));
  vars = srun_task5();
  vars["SLURM_NTASKS_PER_NODE"] = "0";
  EXPECT_THAT(error_of(vars), HasSubstr("environment variable SLURM_NTASKS_PER_NODE: 0"));
}

TEST(DistEnvErrors, PortOutOfRange) {
  for (const char* port : {"0", "65536", "-1"}) {
    Vars vars = torchrun_rank1();
    vars["MASTER_PORT"] = port;
    EXPECT_THAT(error_of(vars), AllOf(HasSubstr("environment variable MASTER_PORT"),
                                      HasSubstr(port), HasSubstr("1..65535")));
  }
  Vars vars = torchrun_rank1();
  vars["MASTER_PORT"] = "65535";
  EXPECT_EQ(detect(vars).master_port, 65535);
  vars["MASTER_PORT"] = "1";
  EXPECT_EQ(detect(vars).master_port, 1);
}

TEST(DistEnvErrors, EmptyMasterAddrWithSeveralRanks) {
  for (Vars vars : {torchrun_rank1(), mpirun_rank3(), srun_task5()}) {
    vars["MASTER_ADDR"] = "";
    EXPECT_THAT(error_of(vars), AllOf(HasSubstr("environment variable MASTER_ADDR"),
                                      HasSubstr("empty"), HasSubstr("host of rank 0")));
  }
}

TEST(DistEnvErrors, MalformedSlurmLists) {
  Vars vars = srun_task5();
  vars["SLURM_JOB_NODELIST"] = "gpu[07-08";
  EXPECT_THAT(error_of(vars), AllOf(HasSubstr("environment variable SLURM_JOB_NODELIST"),
                                    HasSubstr("\"gpu[07-08\""), HasSubstr("never closed")));

  for (const char* bad : {"", "x", "4(x", "4(x2", "4(x0)", "0", "4,", "4;2", "-4", "4(2)"}) {
    vars = srun_task5();
    vars["SLURM_TASKS_PER_NODE"] = bad;
    SCOPED_TRACE(bad);
    EXPECT_THAT(error_of(vars),
                AllOf(HasSubstr("environment variable SLURM_TASKS_PER_NODE"),
                      HasSubstr(std::string("\"") + bad + "\""), HasSubstr("2(x3),1")));
  }
  vars = srun_task5();
  vars["SLURM_NODEID"] = "2";  // "4(x2)" describes nodes 0 and 1
  EXPECT_THAT(error_of(vars), AllOf(HasSubstr("environment variable SLURM_NODEID"),
                                    HasSubstr("2 is outside the 2 nodes")));
  vars["SLURM_NODEID"] = "-1";
  EXPECT_THAT(error_of(vars), HasSubstr("environment variable SLURM_NODEID: -1"));
  vars = srun_task5();
  vars["SLURM_JOB_ID"] = "-5";
  EXPECT_THAT(error_of(vars), HasSubstr("environment variable SLURM_JOB_ID: -5"));
}

// ---- node lists and describe() ---------------------------------------------------------

TEST(DistEnvNodeList, FirstHost) {
  EXPECT_EQ(first_slurm_host("node[03-05,9],gpu1"), "node03");
  EXPECT_EQ(first_slurm_host("a,b"), "a");
  EXPECT_EQ(first_slurm_host("solo"), "solo");
  EXPECT_EQ(first_slurm_host("node[9,03-05]"), "node9");  // Slurm's order is kept
  EXPECT_EQ(first_slurm_host("n[0001-0100]"), "n0001");   // zero padding kept
  EXPECT_EQ(first_slurm_host("n[8-10]"), "n8");           // numeric, not text, order
  EXPECT_EQ(first_slurm_host("gpu1,node[03-05]"), "gpu1");
  EXPECT_EQ(first_slurm_host("rack[1-2]-n[01-04]"), "rack1-n01");
  EXPECT_EQ(first_slurm_host("n[1]-ib"), "n1-ib");
  EXPECT_EQ(first_slurm_host("host-1.cluster.org,host-2.cluster.org"), "host-1.cluster.org");
}

TEST(DistEnvNodeList, RejectsMalformedLists) {
  struct Case {
    std::string list, why;
  };
  const Case cases[] = {
      {"", "empty"},
      {",a", "empty host name"},
      {"a,", "empty host name"},
      {"a,,b", "empty host name"},
      {"node[01-02", "never closed"},
      {"node01]", "has no '['"},
      {"node[]", "empty brackets"},
      {"node[[1]]", "cannot nest"},
      {"node[05-03]", "runs backwards"},
      {"node[a-b]", "not a number or a range"},
      {"node[1-]", "not a number or a range"},
      {"node[1,,2]", "not a number or a range"},
      {"node[-1]", "not a number or a range"},
      {"node 1", "whitespace"},
      {"a,b[", "never closed"},  // the whole list is checked, not only the first host
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.list);
    EXPECT_THAT(node_list_error(c.list), AllOf(HasSubstr("Slurm node list"),
                                               HasSubstr("\"" + c.list + "\""), HasSubstr(c.why)));
  }
}

TEST(DistEnv, Describe) {
  EXPECT_EQ(detect(torchrun_rank1()).describe(),
            "rank 1 of 2 (local 1 of 2) via torchrun, rendezvous 10.0.0.1:29500");
  EXPECT_EQ(detect(srun_task5()).describe(),
            "rank 5 of 8 (local 1 of 4) via slurm, rendezvous gpu07:32345");
  EXPECT_EQ(detect({}).describe(), "single process (no launcher detected)");
  DistEnv v6;
  v6.source = "launch";
  v6.master_addr = "fe80::1";
  EXPECT_EQ(v6.describe(), "rank 0 of 1 (local 0 of 1) via launch, rendezvous [fe80::1]:29500");
}

TEST(GpuForRank, EachRankOfANodeTakesItsOwnGpu) {
  EXPECT_EQ(gpu_for_rank(-1, 0, 1, 1), 0);  // single process
  EXPECT_EQ(gpu_for_rank(-1, 0, 1, 8), 0);
  EXPECT_EQ(gpu_for_rank(-1, 3, 4, 8), 3);  // torchrun's convention: cuda:LOCAL_RANK
  EXPECT_EQ(gpu_for_rank(-1, 7, 8, 8), 7);
  EXPECT_EQ(gpu_for_rank(-1, 2, 4, 1), 0);  // srun --gpus-per-task=1: every rank sees its own one
  EXPECT_EQ(gpu_for_rank(2, 0, 1, 4), 2);   // run.device=cuda:2 in a single process
}

TEST(GpuForRank, ImpossibleChoicesNameRunDeviceAndTheCounts) {
  auto message = [](int64_t requested, int64_t local_rank, int64_t local_world, int64_t gpus) {
    return test::bad_input_message([&] { gpu_for_rank(requested, local_rank, local_world, gpus); });
  };
  EXPECT_THAT(message(-1, 1, 4, 2), AllOf(HasSubstr("run.device"), HasSubstr("two ranks would share a GPU"),
                                          HasSubstr("2 GPUs visible to rank 1 of 4 ranks on this node")));
  EXPECT_THAT(message(1, 0, 2, 4), AllOf(HasSubstr("run.device"), HasSubstr("cuda:1 would put all 2 ranks"),
                                         HasSubstr("set run.device=cuda")));
  EXPECT_THAT(message(5, 0, 1, 2), AllOf(HasSubstr("cuda:5 does not exist"), HasSubstr("2 GPUs visible")));
  EXPECT_THAT(message(-1, 0, 1, 0), AllOf(HasSubstr("run.device"), HasSubstr("no GPU is visible")));
}

}  // namespace
}  // namespace gradguard::dist
