#include "support/ranks.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

#include "tdist/store/hash_store.h"

extern char** environ;

namespace tdist::testing {

namespace {
std::map<std::string, Scenario>& scenarios() {
  static std::map<std::string, Scenario> registry;
  return registry;
}
}  // namespace

ScenarioRegistrar::ScenarioRegistrar(const std::string& name, Scenario fn) {
  scenarios()[name] = std::move(fn);
}

// Used by main.cpp.
bool run_scenario_if_requested(int* exit_code) {
  const char* name = std::getenv("TDIST_TEST_SCENARIO");
  if (name == nullptr) return false;
  auto it = scenarios().find(name);
  if (it == scenarios().end()) {
    std::cerr << "unknown scenario '" << name << "'\n";
    *exit_code = 3;
    return true;
  }
  try {
    it->second();
    *exit_code = ::testing::Test::HasFailure() ? 1 : 0;
  } catch (const std::exception& e) {
    std::cerr << "scenario '" << name << "' threw: " << e.what() << "\n";
    *exit_code = 2;
  }
  return true;
}

void run_ranks_as_threads(int world_size, const std::function<void(int, int, StorePtr)>& fn) {
  auto store = std::make_shared<HashStore>(std::chrono::seconds(60));
  std::vector<std::thread> threads;
  std::mutex mutex;
  std::string first_error;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        fn(rank, world_size, store);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mutex);
        if (first_error.empty()) first_error = "rank " + std::to_string(rank) + ": " + e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (!first_error.empty()) throw std::runtime_error(first_error);
}

namespace {

// Binds a TCP socket to `port` on 127.0.0.1 (0: any free port) and returns the port bound,
// or -1 when it is taken; the socket is closed again.
int bind_loopback(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  int bound = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    socklen_t len = sizeof(addr);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    bound = ntohs(addr.sin_port);
  }
  ::close(fd);
  return bound;
}

}  // namespace

int free_port() {
  const int port = bind_loopback(0);
  if (port < 0) throw std::runtime_error("free_port: bind failed");
  return port;
}

int slurm_job_id_with_free_port() {
  std::mt19937 gen(std::random_device{}());
  for (int tries = 0; tries < 100; ++tries) {
    const int id = static_cast<int>(gen() % 1000000);
    if (bind_loopback(static_cast<uint16_t>(20000 + id % 20000)) >= 0) return id;
  }
  throw std::runtime_error("slurm_job_id_with_free_port: no free port in 100 tries");
}

std::map<std::string, std::string> srun_environment(int world_size, int job_id) {
  const std::string tasks = std::to_string(world_size);
  return {{"SLURM_NTASKS", tasks},
          {"SLURM_NPROCS", tasks},
          {"SLURM_NODEID", "0"},
          {"SLURM_TASKS_PER_NODE", tasks},
          {"SLURM_JOB_NODELIST", "localhost"},
          {"SLURM_STEP_NODELIST", "localhost"},
          {"SLURM_JOB_ID", std::to_string(job_id)}};
}

std::map<std::string, std::string> srun_task_environment(int rank) {
  return {{"SLURM_PROCID", std::to_string(rank)}, {"SLURM_LOCALID", std::to_string(rank)}};
}

std::string self_executable() {
  return std::filesystem::read_symlink("/proc/self/exe").string();
}

int env_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value ? std::atoi(value) : fallback;
}

std::string env_str(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value ? value : fallback;
}

std::string make_temp_dir(const std::string& prefix) {
  std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (::mkdtemp(buffer.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  std::string dir(buffer.data());
  static std::vector<std::string> to_remove;
  static bool registered = false;
  to_remove.push_back(dir);
  if (!registered) {
    registered = true;
    std::atexit([] {
      std::error_code ec;
      for (const auto& d : to_remove) std::filesystem::remove_all(d, ec);
    });
  }
  return dir;
}

namespace {

struct Child {
  pid_t pid = -1;
  int out_fd = -1;
  std::string output;
  bool done = false;
  int status = 0;
  std::chrono::steady_clock::time_point ended;
};

std::vector<std::string> build_env(const std::map<std::string, std::string>& overrides) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    auto eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  for (const auto& [k, v] : overrides) env[k] = v;
  std::vector<std::string> out;
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

}  // namespace

std::vector<RankResult> run_ranks_as_processes(const std::string& scenario, int world_size,
                                               const ProcessOptions& options) {
  const std::string exe = self_executable();
  const int port = free_port();
  std::vector<Child> children(world_size);
  for (int rank = 0; rank < world_size; ++rank) {
    std::map<std::string, std::string> env;
    env["TDIST_TEST_SCENARIO"] = scenario;
    env["OMP_NUM_THREADS"] = "1";
    if (!options.bare_env) {
      env["RANK"] = std::to_string(rank);
      env["LOCAL_RANK"] = std::to_string(rank);
      env["WORLD_SIZE"] = std::to_string(world_size);
      env["LOCAL_WORLD_SIZE"] = std::to_string(world_size);
      env["MASTER_ADDR"] = "127.0.0.1";
      env["MASTER_PORT"] = std::to_string(port);
    }
    for (const auto& [k, v] : options.env) env[k] = v;
    auto it = options.rank_env.find(rank);
    if (it != options.rank_env.end()) {
      for (const auto& [k, v] : it->second) env[k] = v;
    }
    auto env_strings = build_env(env);
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);

    int pipe_fds[2];
    if (::pipe(pipe_fds) != 0) throw std::runtime_error("pipe failed");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 1);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 2);
    posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
    std::string arg0 = exe;
    char* argv[] = {arg0.data(), nullptr};
    pid_t pid;
    int rc = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv, envp.data());
    posix_spawn_file_actions_destroy(&actions);
    ::close(pipe_fds[1]);
    if (rc != 0) throw std::runtime_error("posix_spawn failed: " + std::string(strerror(rc)));
    ::fcntl(pipe_fds[0], F_SETFL, O_NONBLOCK);
    children[rank].pid = pid;
    children[rank].out_fd = pipe_fds[0];
  }

  std::vector<RankResult> results(world_size);
  const auto deadline = std::chrono::steady_clock::now() + options.timeout;
  bool timed_out = false;
  auto drain = [](Child& c) {
    char buf[4096];
    while (true) {
      ssize_t n = ::read(c.out_fd, buf, sizeof(buf));
      if (n > 0) {
        c.output.append(buf, n);
      } else {
        break;
      }
    }
  };
  size_t remaining = children.size();
  while (remaining > 0) {
    std::vector<pollfd> fds;
    for (auto& c : children) fds.push_back({c.out_fd, POLLIN, 0});
    ::poll(fds.data(), fds.size(), 50);
    for (auto& c : children) {
      drain(c);
      if (!c.done && ::waitpid(c.pid, &c.status, WNOHANG) == c.pid) {
        c.done = true;
        c.ended = std::chrono::steady_clock::now();
        --remaining;
        if (options.kill_all_when_one_is_killed && WIFSIGNALED(c.status)) {
          for (auto& other : children) {
            if (!other.done) ::kill(other.pid, SIGKILL);
          }
        }
      }
    }
    if (!timed_out && std::chrono::steady_clock::now() > deadline) {
      timed_out = true;
      for (auto& c : children) {
        if (!c.done) ::kill(c.pid, SIGKILL);
      }
    }
  }
  for (int rank = 0; rank < world_size; ++rank) {
    auto& c = children[rank];
    drain(c);
    ::close(c.out_fd);
    RankResult& r = results[rank];
    r.rank = rank;
    r.output = c.output;
    r.ended = c.ended;
    r.timed_out = timed_out && WIFSIGNALED(c.status) && WTERMSIG(c.status) == SIGKILL;
    if (WIFEXITED(c.status)) {
      r.exit_code = WEXITSTATUS(c.status);
    } else if (WIFSIGNALED(c.status)) {
      r.exit_code = -1;
      r.signal = WTERMSIG(c.status);
    }
  }
  return results;
}

void expect_all_ok(const std::vector<RankResult>& results) {
  for (const auto& r : results) {
    EXPECT_TRUE(r.ok()) << "rank " << r.rank << " exit=" << r.exit_code << " signal=" << r.signal
                        << (r.timed_out ? " (timed out)" : "") << "\n--- output ---\n"
                        << r.output;
  }
}

void expect_all_ok_at_worlds(const std::string& scenario, std::initializer_list<int> worlds,
                             const ProcessOptions& options) {
  for (int world : worlds) {
    SCOPED_TRACE(::testing::Message() << "world " << world);
    expect_all_ok(run_ranks_as_processes(scenario, world, options));
  }
}

}  // namespace tdist::testing
