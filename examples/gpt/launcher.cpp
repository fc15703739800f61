#include "gpt/launcher.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>

#include "tdist/error.h"
#ifdef TDIST_GPT_WITH_COMM
#include "tdist/comm/launch_environment.h"
#endif

namespace gpt {
namespace {

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    TDIST_THROW(tdist::Error,
                "gpt launcher: socket() failed: " + std::string(std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    TDIST_THROW(tdist::Error,
                "gpt launcher: cannot find a free port on 127.0.0.1; set MASTER_PORT");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string self_path() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) TDIST_THROW(tdist::Error, "gpt launcher: cannot read /proc/self/exe");
  buf[n] = '\0';
  return buf;
}

}  // namespace

bool adopt_launch_environment() {
  const char* rank = std::getenv("RANK");
  if (rank != nullptr && *rank != '\0') return true;
#ifdef TDIST_GPT_WITH_COMM
  // Note [Launch environment precedence] (tdist/comm/launch_environment.h).
  const tdist::LaunchEnvironment launch = tdist::LaunchEnvironment::detect();
  launch.export_torchrun_variables();
  return launch.found();
#else
  return false;
#endif
}

int spawn_local_ranks(int nproc, const std::vector<std::string>& argv) {
  const std::string exe = self_path();
  const char* port_env = std::getenv("MASTER_PORT");
  const std::string port =
      port_env != nullptr && *port_env != '\0' ? port_env : std::to_string(free_port());
  std::cout.flush();
  std::cerr.flush();

  std::map<pid_t, int> ranks;  // pid -> rank
  for (int rank = 0; rank < nproc; ++rank) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      for (const auto& [p, r] : ranks) ::kill(p, SIGTERM);
      TDIST_THROW(tdist::Error, "gpt launcher: fork failed for rank " + std::to_string(rank));
    }
    if (pid == 0) {
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 0);
      ::setenv("MASTER_PORT", port.c_str(), 1);
      ::setenv("TDIST_GPT_SPAWNED", "1", 1);
      std::vector<char*> args;
      args.push_back(const_cast<char*>(exe.c_str()));
      for (size_t i = 1; i < argv.size(); ++i) args.push_back(const_cast<char*>(argv[i].c_str()));
      args.push_back(nullptr);
      ::execv(exe.c_str(), args.data());
      std::cerr << "gpt launcher: exec " << exe << " failed: " << std::strerror(errno) << "\n";
      ::_exit(127);
    }
    ranks[pid] = rank;
  }

  int result = 0;
  bool stopping = false;
  while (!ranks.empty()) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    auto it = ranks.find(pid);
    if (it == ranks.end()) continue;
    const int rank = it->second;
    ranks.erase(it);
    int code = 0;
    if (WIFEXITED(status))
      code = WEXITSTATUS(status);
    else if (WIFSIGNALED(status))
      code = 128 + WTERMSIG(status);
    if (code != 0 && !stopping) {
      result = code;
      stopping = true;
      std::cerr << "gpt launcher: rank " << rank << " exited with code " << code
                << "; stopping the other ranks\n";
      for (const auto& [p, r] : ranks) ::kill(p, SIGTERM);
    }
  }
  return result;
}

}  // namespace gpt
