#include "launch/run_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace tdist::launch::testing {

namespace {
std::vector<std::string>& temp_dirs() {
  static std::vector<std::string> dirs;
  static struct Cleaner {
    ~Cleaner() {
      std::error_code ec;
      for (auto& d : temp_dirs()) std::filesystem::remove_all(d, ec);
    }
  } cleaner;
  return dirs;
}
}  // namespace

std::string temp_dir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "tdist-launch-XXXXXX").string();
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed");
  temp_dirs().push_back(buf.data());
  return buf.data();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

Proc::Proc(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env)
    : dir_(temp_dir()) {
  std::vector<std::string> env_strings;
  std::map<std::string, std::string> merged;
  for (char** e = environ; *e; ++e) {
    std::string s(*e);
    auto eq = s.find('=');
    if (eq != std::string::npos) merged[s.substr(0, eq)] = s.substr(eq + 1);
  }
  for (const auto& [k, v] : env) merged[k] = v;
  for (const auto& [k, v] : merged) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& a : argv_copy) args.push_back(a.data());
  args.push_back(nullptr);
  std::string out = dir_ + "/out", err = dir_ + "/err";
  pid_ = fork();
  if (pid_ == 0) {
    int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(o, 1);
    dup2(e, 2);
    int null = open("/dev/null", O_RDONLY);
    dup2(null, 0);
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
}

Proc::~Proc() {
  if (!waited_) {
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

void Proc::kill(int signal) const {
  ::kill(pid_, signal);
}

std::string Proc::out_so_far() const {
  return read_file(dir_ + "/out");
}

std::string Proc::err_so_far() const {
  return read_file(dir_ + "/err");
}

ProcResult Proc::wait(std::chrono::milliseconds timeout) {
  ProcResult result;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (true) {
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      result.timed_out = true;
      ::kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  waited_ = true;
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  result.out = read_file(dir_ + "/out");
  result.err = read_file(dir_ + "/err");
  return result;
}

ProcResult run(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
               std::chrono::milliseconds timeout) {
  Proc proc(argv, env);
  return proc.wait(timeout);
}

std::string tdistrun() {
  return TDISTRUN_PATH;
}
std::string worker() {
  return LAUNCH_WORKER_PATH;
}

bool process_alive(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  // A zombie is dead for our purposes.
  std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  auto close = stat.rfind(')');
  return close == std::string::npos || stat.size() < close + 3 || stat[close + 2] != 'Z';
}

std::vector<std::string> lines_with(const std::string& text, const std::string& prefix) {
  std::vector<std::string> found;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) found.push_back(line);
  }
  return found;
}

std::string env_of(const std::string& out, int rank, const std::string& key) {
  std::string prefix = "[rank " + std::to_string(rank) + "]: ENV " + key + "=";
  auto found = lines_with(out, prefix);
  return found.empty() ? "" : found.front().substr(prefix.size());
}

int free_tcp_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace tdist::launch::testing
