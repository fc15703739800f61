// LaunchEnvironment: each launcher's variables as that launcher sets them (SLURM's srun,
// OpenMPI's and MPICH's mpirun, PMIx, a Kubeflow PyTorchJob, torchrun), the precedence
// between them, the errors for environments that contradict themselves, and SLURM's
// compressed host and task lists.
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <map>
#include <string>

#include <torch/torch.h>

#include "support/ranks.h"
#include "tdist/comm/distributed.h"
#include "tdist/comm/launch_environment.h"
#include "tdist/error.h"

namespace tdist {
// Named, not anonymous: test_comm is one unity translation unit.
namespace launch_environment_test {

using Vars = std::map<std::string, std::string>;

LaunchEnvironment detect(const Vars& vars, int64_t hydra_proxy_pid = 0) {
  return LaunchEnvironment::detect(
      [&](const char* name) -> const char* {
        auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
      },
      hydra_proxy_pid);
}

// The error detect raises for `vars`; fails the test when none is raised.
std::string error_of(const Vars& vars) {
  try {
    detect(vars);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

bool mentions(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// srun -N 2 -n 3 on node[07-08]: task 2 is the first task of the second node.
Vars srun_task_2() {
  return {{"SLURM_PROCID", "2"},
          {"SLURM_NTASKS", "3"},
          {"SLURM_LOCALID", "0"},
          {"SLURM_NODEID", "1"},
          {"SLURM_TASKS_PER_NODE", "2,1"},
          {"SLURM_JOB_NODELIST", "node[07-08]"},
          {"SLURM_STEP_NODELIST", "node[07-08]"},
          {"SLURM_JOB_ID", "123456"}};
}

TEST(LaunchEnvironment, NothingFound) {
  const LaunchEnvironment env = detect({{"HOME", "/root"}});
  EXPECT_FALSE(env.found());
  EXPECT_EQ(env.rank, -1);
}

TEST(LaunchEnvironment, Slurm) {
  const LaunchEnvironment env = detect(srun_task_2());
  EXPECT_EQ(env.launcher, "slurm");
  EXPECT_EQ(env.rank, 2);
  EXPECT_EQ(env.world_size, 3);
  EXPECT_EQ(env.local_rank, 0);
  EXPECT_EQ(env.local_world_size, 1);
  EXPECT_EQ(env.master_addr, "node07");
  EXPECT_EQ(env.master_port, 20000 + 123456 % 20000);
  EXPECT_TRUE(mentions(env.describe(), "SLURM_PROCID=2")) << env.describe();
}

TEST(LaunchEnvironment, MasterVariablesOverrideWhatIsDerived) {
  Vars vars = srun_task_2();
  vars["MASTER_ADDR"] = "10.0.0.5";
  vars["MASTER_PORT"] = "29400";
  const LaunchEnvironment env = detect(vars);
  EXPECT_EQ(env.master_addr, "10.0.0.5");
  EXPECT_EQ(env.master_port, 29400);
}

TEST(LaunchEnvironment, SlurmWorldSizeMustAgree) {
  Vars vars = srun_task_2();
  vars["WORLD_SIZE"] = "4";
  const std::string error = error_of(vars);
  EXPECT_TRUE(mentions(error, "WORLD_SIZE=4") && mentions(error, "SLURM_NTASKS=3")) << error;
  vars["WORLD_SIZE"] = "3";
  EXPECT_EQ(detect(vars).world_size, 3);
}

TEST(LaunchEnvironment, SlurmWithoutTaskCountIsRefused) {
  const std::string error = error_of({{"SLURM_PROCID", "0"}});
  EXPECT_TRUE(mentions(error, "SLURM_NTASKS") && mentions(error, "srun")) << error;
}

TEST(LaunchEnvironment, SlurmRankOutOfRange) {
  Vars vars = srun_task_2();
  vars["SLURM_PROCID"] = "3";
  const std::string error = error_of(vars);
  EXPECT_TRUE(mentions(error, "SLURM_PROCID=3") && mentions(error, "SLURM_NTASKS=3")) << error;
}

TEST(LaunchEnvironment, MalformedNumberNamesTheVariable) {
  Vars vars = srun_task_2();
  vars["SLURM_PROCID"] = "two";
  const std::string error = error_of(vars);
  EXPECT_TRUE(mentions(error, "SLURM_PROCID='two'")) << error;
}

// A job id is not a count: SLURM's ids pass 2^24 on long-lived clusters.
TEST(LaunchEnvironment, LargeSlurmJobIdDerivesAPort) {
  Vars vars = srun_task_2();
  vars["SLURM_JOB_ID"] = "123456789";
  EXPECT_EQ(detect(vars).master_port, 20000 + 123456789 % 20000);
}

TEST(LaunchEnvironment, PortOutsideItsRangeIsRefused) {
  Vars vars = srun_task_2();
  for (const char* bad : {"0", "65536", "-1"}) {
    vars["MASTER_PORT"] = bad;
    const std::string error = error_of(vars);
    EXPECT_TRUE(mentions(error, std::string("MASTER_PORT='") + bad + "'") &&
                mentions(error, "1 to 65535"))
        << error;
  }
  vars["MASTER_PORT"] = "65535";
  EXPECT_EQ(detect(vars).master_port, 65535);
}

TEST(LaunchEnvironment, OpenMpiOnOneHost) {
  const Vars vars = {{"OMPI_COMM_WORLD_RANK", "1"},
                     {"OMPI_COMM_WORLD_SIZE", "3"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"},
                     {"OMPI_MCA_ess_base_jobid", "2135752705"},
                     {"PMIX_RANK", "1"},
                     {"PMIX_NAMESPACE", "2135752705"}};
  const LaunchEnvironment env = detect(vars);
  EXPECT_EQ(env.launcher, "openmpi");
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.world_size, 3);
  EXPECT_EQ(env.local_world_size, 3);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_GE(env.master_port, 20000);
  EXPECT_LT(env.master_port, 40000);
  Vars other_job = vars;
  other_job["OMPI_MCA_ess_base_jobid"] = "2135752706";
  EXPECT_NE(detect(other_job).master_port, env.master_port);
}

TEST(LaunchEnvironment, OpenMpiAcrossHostsNeedsAnAddress) {
  const LaunchEnvironment env = detect({{"OMPI_COMM_WORLD_RANK", "0"},
                                        {"OMPI_COMM_WORLD_SIZE", "4"},
                                        {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_EQ(env.world_size, 4);
  EXPECT_TRUE(env.master_addr.empty());  // env:// then names MASTER_ADDR
}

TEST(LaunchEnvironment, MpichHydra) {
  const LaunchEnvironment env = detect({{"PMI_RANK", "2"},
                                        {"PMI_SIZE", "3"},
                                        {"MPI_LOCALRANKID", "2"},
                                        {"MPI_LOCALNRANKS", "3"},
                                        {"MASTER_PORT", "29500"}});
  EXPECT_EQ(env.launcher, "mpich");
  EXPECT_EQ(env.rank, 2);
  EXPECT_EQ(env.world_size, 3);
  EXPECT_EQ(env.local_rank, 2);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_EQ(env.master_port, 29500);
}

// Hydra exports no job id: on one host the port comes from its proxy, the parent of every
// rank, and only from a real proxy (a wrapper script between would give each rank its own).
TEST(LaunchEnvironment, MpichHydraDerivesThePortFromItsProxy) {
  const Vars vars = {
      {"PMI_RANK", "1"}, {"PMI_SIZE", "3"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "3"}};
  const LaunchEnvironment a = detect(vars, 4242);
  EXPECT_GE(a.master_port, 20000);
  EXPECT_LT(a.master_port, 40000);
  EXPECT_TRUE(mentions(a.describe(), "Hydra's proxy (4242)")) << a.describe();
  EXPECT_EQ(detect(vars).master_port, -1) << "no proxy: MASTER_PORT must be set";
  Vars other_host = vars;
  other_host["MPI_LOCALNRANKS"] = "2";  // ranks on two hosts: no shared parent
  EXPECT_EQ(detect(other_host, 4242).master_port, -1);
}

TEST(LaunchEnvironment, TwoMpiFamiliesThatDisagree) {
  const std::string error = error_of({{"OMPI_COMM_WORLD_RANK", "1"},
                                      {"OMPI_COMM_WORLD_SIZE", "2"},
                                      {"PMI_RANK", "0"},
                                      {"PMI_SIZE", "2"}});
  EXPECT_TRUE(mentions(error, "OMPI_COMM_WORLD_RANK=1") && mentions(error, "PMI_RANK=0")) << error;
}

TEST(LaunchEnvironment, PmixUnderSrunTakesTheSizeFromSlurm) {
  Vars vars = srun_task_2();
  vars["PMIX_RANK"] = "2";
  const LaunchEnvironment env = detect(vars);
  EXPECT_EQ(env.launcher, "pmix");
  EXPECT_EQ(env.world_size, 3);
  EXPECT_EQ(env.master_addr, "node07");
  vars["PMIX_RANK"] = "1";
  const std::string error = error_of(vars);
  EXPECT_TRUE(mentions(error, "PMIX_RANK=1") && mentions(error, "SLURM_PROCID=2")) << error;
}

TEST(LaunchEnvironment, MpirunInsideAnAllocationUsesMpi) {
  // sbatch -N 2 with one batch task, then mpirun -n 8: SLURM_PROCID is the batch step's.
  Vars vars = {{"SLURM_PROCID", "0"},
               {"SLURM_NTASKS", "1"},
               {"SLURM_JOB_NODELIST", "a[1-2]"},
               {"OMPI_COMM_WORLD_RANK", "5"},
               {"OMPI_COMM_WORLD_SIZE", "8"},
               {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}};
  const LaunchEnvironment env = detect(vars);
  EXPECT_EQ(env.launcher, "openmpi");
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_TRUE(env.master_addr.empty());  // the batch node list is not MPI's rank 0's
}

TEST(LaunchEnvironment, KubeflowOneProcessPerPod) {
  const LaunchEnvironment env = detect({{"PET_NODE_RANK", "1"},
                                        {"PET_NNODES", "3"},
                                        {"PET_NPROC_PER_NODE", "1"},
                                        {"PET_MASTER_ADDR", "job-master-0"},
                                        {"PET_MASTER_PORT", "23456"}});
  EXPECT_EQ(env.launcher, "kubeflow");
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.world_size, 3);
  EXPECT_EQ(env.master_addr, "job-master-0");
  EXPECT_EQ(env.master_port, 23456);
  const std::string error =
      error_of({{"PET_NODE_RANK", "0"}, {"PET_NNODES", "2"}, {"PET_NPROC_PER_NODE", "4"}});
  EXPECT_TRUE(mentions(error, "PET_NPROC_PER_NODE=4") && mentions(error, "tdistrun")) << error;
}

TEST(LaunchEnvironment, TorchrunWinsOverTheLauncherAroundIt) {
  // srun -N 2 torchrun --nproc-per-node 4: torchrun numbers the 8 workers itself.
  Vars vars = srun_task_2();
  vars["RANK"] = "6";
  vars["WORLD_SIZE"] = "8";
  vars["LOCAL_RANK"] = "2";
  vars["MASTER_ADDR"] = "node07";
  vars["MASTER_PORT"] = "29500";
  const LaunchEnvironment env = detect(vars);
  EXPECT_EQ(env.launcher, "torchrun");
  EXPECT_EQ(env.rank, 6);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 2);
}

TEST(SlurmHostlist, Expands) {
  using V = std::vector<std::string>;
  EXPECT_EQ(expand_slurm_hostlist("node07"), V{"node07"});
  EXPECT_EQ(expand_slurm_hostlist("node[01-04,07],gpu3"),
            (V{"node01", "node02", "node03", "node04", "node07", "gpu3"}));
  EXPECT_EQ(expand_slurm_hostlist("n[8-10]-ib"), (V{"n8-ib", "n9-ib", "n10-ib"}));
  EXPECT_EQ(expand_slurm_hostlist("r[1-2]n[01-02]"), (V{"r1n01", "r1n02", "r2n01", "r2n02"}));
  for (const char* bad : {"node[01-", "node]", "node[04-01]", "node[a-b]", "a,,b", ""}) {
    try {
      expand_slurm_hostlist(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_TRUE(mentions(e.what(), std::string("'") + bad + "'")) << e.what();
    }
  }
}

TEST(SlurmTasksPerNode, Expands) {
  EXPECT_EQ(expand_slurm_tasks_per_node("2(x3),1"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(expand_slurm_tasks_per_node("4"), (std::vector<int>{4}));
  for (const char* bad : {"", "x", "2(x)", "2(x3", "0"}) {
    EXPECT_THROW(expand_slurm_tasks_per_node(bad), InvalidArgument) << bad;
  }
}

// ---- init_process_group() with nothing given, in processes started as each launcher starts
// them (only the launcher's own variables; no RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

// The rank the launcher gave this process, from the variable the test set for it.
int launcher_rank() {
  for (const char* name : {"SLURM_PROCID", "PET_NODE_RANK"}) {
    if (const char* v = std::getenv(name)) return std::atoi(v);
  }
  return -1;
}

TDIST_SCENARIO(zero_flag_init) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const int world = get_world_size();
  EXPECT_EQ(get_rank(), launcher_rank());
  EXPECT_EQ(std::to_string(world), std::getenv("EXPECTED_WORLD"));
  // Every reader of the torchrun convention sees the launch (the node-local rank here; a
  // Kubeflow pod runs one process).
  const char* local = std::getenv("SLURM_LOCALID");
  EXPECT_EQ(get_node_local_rank(), local != nullptr ? std::atoi(local) : 0);
  at::Tensor t = torch::full({2}, static_cast<float>(get_rank() + 1));
  all_reduce(t);
  EXPECT_EQ(t[0].item<float>(), world * (world + 1) / 2.0f);
  destroy_process_group();
}

TEST(ZeroFlagLaunch, UnderSrunsEnvironment) {
  for (int world : {1, 3}) {
    testing::ProcessOptions options;
    options.bare_env = true;
    options.env = testing::srun_environment(world, testing::slurm_job_id_with_free_port());
    options.env["EXPECTED_WORLD"] = std::to_string(world);
    for (int r = 0; r < world; ++r) options.rank_env[r] = testing::srun_task_environment(r);
    auto results = testing::run_ranks_as_processes("zero_flag_init", world, options);
    SCOPED_TRACE("world " + std::to_string(world));
    testing::expect_all_ok(results);
  }
}

TEST(ZeroFlagLaunch, InAKubeflowPyTorchJob) {
  const int world = 2;
  testing::ProcessOptions options;
  options.bare_env = true;
  options.env = {{"PET_NNODES", "2"},
                 {"PET_NPROC_PER_NODE", "1"},
                 {"PET_MASTER_ADDR", "127.0.0.1"},
                 {"PET_MASTER_PORT", std::to_string(testing::free_port())},
                 {"EXPECTED_WORLD", "2"}};
  for (int r = 0; r < world; ++r) options.rank_env[r] = {{"PET_NODE_RANK", std::to_string(r)}};
  testing::expect_all_ok(testing::run_ranks_as_processes("zero_flag_init", world, options));
}

TDIST_SCENARIO(zero_flag_init_refused) {
  try {
    init_process_group(InitProcessGroupOptions().backend("gloo"));
  } catch (const InvalidArgument& e) {
    std::cout << "ERROR: " << e.what() << std::endl;
    return;
  }
  std::cout << "init_process_group did not raise" << std::endl;
  std::exit(3);
}

TEST(ZeroFlagLaunch, AnAllocationThatDisagreesWithWorldSizeIsNamed) {
  testing::ProcessOptions options;
  options.bare_env = true;
  options.env = {{"SLURM_NTASKS", "2"},
                 {"SLURM_JOB_NODELIST", "localhost"},
                 {"SLURM_JOB_ID", "77"},
                 {"WORLD_SIZE", "3"}};
  for (int r = 0; r < 2; ++r) options.rank_env[r] = {{"SLURM_PROCID", std::to_string(r)}};
  auto results = testing::run_ranks_as_processes("zero_flag_init_refused", 2, options);
  testing::expect_all_ok(results);
  for (const auto& r : results) {
    EXPECT_NE(r.output.find("WORLD_SIZE=3 but SLURM_NTASKS=2"), std::string::npos) << r.output;
  }
}

}  // namespace launch_environment_test
}  // namespace tdist
