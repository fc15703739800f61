// init_process_group() with no arguments under a real `srun -n 3`: a private single-node
// SLURM (Debian's slurmctld and slurmd, as tools/setup.sh installs them) is started for the
// test on free ports, in a directory of its own, and stopped after it. The ranks get only what
// srun sets (no RANK, WORLD_SIZE, MASTER_ADDR or MASTER_PORT): rank, world and local rank from
// SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID, rank 0's host from SLURM_STEP_NODELIST and the
// port from SLURM_JOB_ID (Note [Launch environment precedence]). Skipped, saying why, where
// SLURM is not installed or the test does not run as root (slurmd starts the tasks as their
// user, and a private slurmd can only do that as root).
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "support/ranks.h"
#include "support/scoped_env.h"
#include "tdist/comm/distributed.h"
#include "tdist/comm/launch_environment.h"
#include "tdist/error.h"

namespace tdist {
namespace slurm_srun_test {

int env_number(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : -1;
}

TDIST_SCENARIO(srun_zero_flag) {
  ASSERT_EQ(std::getenv("RANK"), nullptr) << "srun alone sets the job";
  ASSERT_EQ(std::getenv("MASTER_PORT"), nullptr) << "srun alone sets the job";
  const LaunchEnvironment launch = LaunchEnvironment::detect();
  EXPECT_EQ(launch.launcher, "slurm") << launch.describe();
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  EXPECT_EQ(get_rank(), env_number("SLURM_PROCID"));
  EXPECT_EQ(get_world_size(), env_number("SLURM_NTASKS"));
  EXPECT_EQ(get_node_local_rank(), env_number("SLURM_LOCALID"));
  const int rank = get_rank();
  const int world = get_world_size();
  at::Tensor t = torch::full({2}, static_cast<float>(rank + 1));
  all_reduce(t);
  EXPECT_EQ(t[0].item<float>(), world * (world + 1) / 2.0f);
  destroy_process_group();
  std::printf("rank %d of %d: %s\n", rank, world, launch.describe().c_str());
}

TDIST_SCENARIO(srun_zero_flag_refused) {
  try {
    init_process_group(InitProcessGroupOptions().backend("gloo"));
  } catch (const InvalidArgument& e) {
    std::printf("ERROR: %s\n", e.what());
    return;
  }
  std::printf("init_process_group did not raise\n");
  std::exit(3);
}

std::string find_program(const std::string& name) {
  for (const char* dir : {"/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"}) {
    const std::string path = std::string(dir) + "/" + name;
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

struct CommandResult {
  int status = -1;
  std::string output;
};

CommandResult run_command(const std::string& command) {
  CommandResult r;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buffer{};
  size_t n = 0;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) r.output.append(buffer.data(), n);
  const int status = pclose(pipe);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

/// slurmctld and slurmd for one node named localhost, on free ports, with no authentication
/// (auth/none: nothing but this test talks to them), stopped by the destructor.
class PrivateSlurm {
 public:
  PrivateSlurm() : dir_(testing::make_temp_dir("slurm")), conf_(dir_ + "/slurm.conf") {
    write_config();
    controller_ = spawn({find_program("slurmctld"), "-D", "-i", "-f", conf_}, "slurmctld.out");
    node_ = spawn({find_program("slurmd"), "-D", "-N", "localhost", "-f", conf_}, "slurmd.out");
  }
  ~PrivateSlurm() {
    stop(node_);
    stop(controller_);
  }
  PrivateSlurm(const PrivateSlurm&) = delete;
  PrivateSlurm& operator=(const PrivateSlurm&) = delete;

  const std::string& conf() const { return conf_; }

  /// Waits until the node takes jobs; false (with the daemons' logs in `why`) after 60 s.
  bool wait_until_idle(std::string& why) const {
    const std::string sinfo = find_program("sinfo") + " -h -o %T";
    CommandResult r;
    for (int i = 0; i < 600; ++i) {
      r = run_command("SLURM_CONF=" + conf_ + " " + sinfo);
      if (r.status == 0 && r.output.rfind("idle", 0) == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    why = "sinfo: " + r.output + "\nslurmctld: " + read(dir_ + "/slurmctld.log") +
          "\nslurmd: " + read(dir_ + "/slurmd.log");
    return false;
  }

 private:
  void write_config() const {
    const int job_id = testing::slurm_job_id_with_free_port();
    std::ofstream conf(conf_);
    conf << "ClusterName=tdisttest\n"
         << "SlurmctldHost=localhost(127.0.0.1)\n"
         << "SlurmctldPort=" << testing::free_port() << "\n"
         << "SlurmdPort=" << testing::free_port() << "\n"
         << "AuthType=auth/none\nCredType=cred/none\n"
         << "ProctrackType=proctrack/pgid\nTaskPlugin=task/none\n"
         << "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
         << "SlurmUser=root\nSlurmdUser=root\n"
         << "StateSaveLocation=" << dir_ << "/state\nSlurmdSpoolDir=" << dir_ << "/spool\n"
         << "SlurmctldPidFile=" << dir_ << "/slurmctld.pid\n"
         << "SlurmdPidFile=" << dir_ << "/slurmd.pid\n"
         << "SlurmctldLogFile=" << dir_ << "/slurmctld.log\n"
         << "SlurmdLogFile=" << dir_
         << "/slurmd.log\n"
         // The node offers 4 CPUs whatever the machine has: srun -n 3 runs on 2 cores.
         << "SlurmdParameters=config_overrides\n"
         << "MpiDefault=none\nReturnToService=2\n"
         << "JobAcctGatherType=jobacct_gather/none\n"
         << "AccountingStorageType=accounting_storage/none\n"
         << "FirstJobId=" << job_id << "\n"
         << "NodeName=localhost NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN\n"
         << "PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP "
            "OverSubscribe=FORCE:4\n";
  }

  pid_t spawn(const std::vector<std::string>& argv, const std::string& output) const {
    const std::string log = dir_ + "/" + output;
    const pid_t pid = fork();
    if (pid == 0) {
      FILE* out = std::freopen(log.c_str(), "w", stdout);
      if (out != nullptr) dup2(fileno(stdout), STDERR_FILENO);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    return pid;
  }

  static void stop(pid_t pid) {
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    for (int i = 0; i < 100; ++i) {
      if (waitpid(pid, nullptr, WNOHANG) == pid) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }

  static std::string read(const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  std::string dir_;
  std::string conf_;
  pid_t controller_ = -1;
  pid_t node_ = -1;
};

class SrunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* program : {"slurmctld", "slurmd", "srun", "sinfo"}) {
      if (find_program(program).empty()) {
        GTEST_SKIP() << program << " not installed: install Debian's slurmctld, slurmd and "
                     << "slurm-client (tools/setup.sh does)";
      }
    }
    if (geteuid() != 0) GTEST_SKIP() << "a private slurmd must run as root to start tasks";
    slurm_ = std::make_unique<PrivateSlurm>();
    std::string why;
    ASSERT_TRUE(slurm_->wait_until_idle(why)) << "the private SLURM did not come up:\n" << why;
  }

  /// `srun -n <tasks>` of this binary running `scenario`, with `extra` variables.
  CommandResult srun(int tasks, const std::string& scenario, const std::string& extra = "") {
    return run_command(
        "env -u RANK -u WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT SLURM_CONF=" + slurm_->conf() +
        " TDIST_TEST_SCENARIO=" + scenario + " OMP_NUM_THREADS=1 " + extra + " timeout 120 " +
        find_program("srun") + " -n " + std::to_string(tasks) + " --kill-on-bad-exit=1 " +
        testing::self_executable());
  }

  std::unique_ptr<PrivateSlurm> slurm_;
};

TEST_F(SrunTest, ThreeTasksInitWithNoFlags) {
  const CommandResult r = srun(3, "srun_zero_flag");
  EXPECT_EQ(r.status, 0) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_NE(r.output.find("rank " + std::to_string(rank) + " of 3: launch environment: slurm"),
              std::string::npos)
        << r.output;
  }
  EXPECT_NE(r.output.find("the first host of SLURM_STEP_NODELIST=localhost"), std::string::npos)
      << r.output;
}

TEST_F(SrunTest, AWorldSizeUnlikeTheTaskCountIsNamed) {
  const CommandResult r = srun(3, "srun_zero_flag_refused", "WORLD_SIZE=2");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("WORLD_SIZE=2 but SLURM_NTASKS=3"), std::string::npos) << r.output;
}

}  // namespace slurm_srun_test
}  // namespace tdist
