#include "launch/process_util.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "tdist/error.h"

namespace tdist::launch::detail {

namespace {
int g_signal_write_fd = -1;

void on_signal(int signal) {
  int saved = errno;
  unsigned char byte = static_cast<unsigned char>(signal);
  [[maybe_unused]] ssize_t n = ::write(g_signal_write_fd, &byte, 1);
  errno = saved;
}

std::string address_text(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof(buf));
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof(buf));
  }
  return buf;
}
}  // namespace

SignalPipe::SignalPipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    TDIST_THROW(Error, std::string("tdistrun: pipe2 failed: ") + std::strerror(errno));
  }
  read_fd_ = fds[0];
  g_signal_write_fd = fds[1];
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD}) sigaction(s, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

SignalPipe& SignalPipe::instance() {
  static SignalPipe pipe;
  return pipe;
}

int SignalPipe::drain() {
  int terminating = 0;
  unsigned char buf[64];
  while (true) {
    ssize_t n = ::read(read_fd_, buf, sizeof(buf));
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] != SIGCHLD) terminating = buf[i];
    }
  }
  return terminating;
}

std::string resolve_program(const std::string& program) {
  auto usable = [](const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
           ::access(path.c_str(), X_OK) == 0;
  };
  if (program.find('/') != std::string::npos) {
    if (usable(program)) return program;
    TDIST_THROW(InvalidArgument, "tdistrun: cannot execute '" + program +
                                     "': missing or not executable (check the path and "
                                     "chmod +x)");
  }
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (usable(candidate)) return candidate;
  }
  TDIST_THROW(InvalidArgument, "tdistrun: program '" + program +
                                   "' not found on PATH (give a path like ./" + program + ")");
}

std::string signal_name(int signal) {
  const char* abbrev = sigabbrev_np(signal);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(signal);
}

int free_port(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), "0", &hints, &found) != 0 || !found) {
    TDIST_THROW(NetworkError, "tdistrun: cannot resolve '" + host + "' to pick a free port");
  }
  int port = -1;
  for (addrinfo* ai = found; ai && port < 0; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      sockaddr_storage addr{};
      socklen_t len = sizeof(addr);
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
        port = addr.ss_family == AF_INET ? ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port)
                                         : ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
      }
    }
    ::close(fd);
  }
  freeaddrinfo(found);
  if (port < 0) TDIST_THROW(NetworkError, "tdistrun: no free port on '" + host + "'");
  return port;
}

bool is_local_host(const std::string& host) {
  std::set<std::string> local;
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) == 0) {
    for (ifaddrs* i = ifs; i; i = i->ifa_next) {
      if (i->ifa_addr) local.insert(address_text(i->ifa_addr));
    }
    freeifaddrs(ifs);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  bool is_local = false;
  for (addrinfo* ai = found; ai; ai = ai->ai_next) {
    std::string text = address_text(ai->ai_addr);
    if (local.count(text) || text.rfind("127.", 0) == 0) is_local = true;
  }
  freeaddrinfo(found);
  return is_local;
}

std::string random_hex(size_t bytes) {
  std::string raw(bytes, '\0');
  size_t got = 0;
  while (got < bytes) {
    ssize_t n = getrandom(raw.data() + got, bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      TDIST_THROW(Error, std::string("tdistrun: getrandom failed: ") + std::strerror(errno));
    }
    got += static_cast<size_t>(n);
  }
  static const char* kHex = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : raw) {
    hex.push_back(kHex[c >> 4]);
    hex.push_back(kHex[c & 15]);
  }
  return hex;
}

void kill_adopted_children(const std::vector<pid_t>& keep) {
  std::set<pid_t> keep_set(keep.begin(), keep.end());
  pid_t self = getpid();
  // Killing an adopted child re-parents its own children to us: sweep until none is left.
  for (int sweep = 0; sweep < 8; ++sweep) {
    std::vector<pid_t> victims;
    if (DIR* proc = opendir("/proc")) {
      while (dirent* entry = readdir(proc)) {
        char* end = nullptr;
        long pid = std::strtol(entry->d_name, &end, 10);
        if (*end != '\0' || pid <= 0) continue;
        std::ifstream stat("/proc/" + std::string(entry->d_name) + "/stat");
        std::string line;
        if (!std::getline(stat, line)) continue;
        // pid (comm) state ppid ...: comm may hold spaces, so parse after the last ')'.
        auto close = line.rfind(')');
        if (close == std::string::npos) continue;
        std::istringstream rest(line.substr(close + 1));
        std::string state;
        long ppid = 0;
        rest >> state >> ppid;
        if (ppid == self && !keep_set.count(static_cast<pid_t>(pid))) {
          victims.push_back(static_cast<pid_t>(pid));
        }
      }
      closedir(proc);
    }
    if (victims.empty()) return;
    for (pid_t pid : victims) ::kill(pid, SIGKILL);
    for (pid_t pid : victims) ::waitpid(pid, nullptr, 0);
  }
}

std::string run_dir_prefix(pid_t pid) {
  // The pid namespace is part of the name: a pid is only meaningful inside its namespace,
  // and another container may share /tmp.
  struct stat ns {};
  unsigned long ns_id = ::stat("/proc/self/ns/pid", &ns) == 0 ? ns.st_ino : 0;
  return "tdistrun-" + std::to_string(ns_id) + "-" + std::to_string(pid) + "-";
}

void remove_stale_run_dirs(const std::string& parent) {
  std::string mine = run_dir_prefix(0);
  std::string ns_prefix = mine.substr(0, mine.size() - 2);  // "tdistrun-<ns>-"
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(parent, ec)) {
    std::string name = entry.path().filename().string();
    if (name.rfind(ns_prefix, 0) != 0) continue;
    char* end = nullptr;
    long pid = std::strtol(name.c_str() + ns_prefix.size(), &end, 10);
    if (pid <= 0 || *end != '-') continue;
    struct stat st {};
    if (::lstat(entry.path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid()) {
      continue;
    }
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // still running
    std::filesystem::remove_all(entry.path(), ec);
  }
}

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

}  // namespace tdist::launch::detail
