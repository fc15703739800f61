// A tiny worker for tdistrun's tests (no LibTorch). Options:
//   --print-env              print the launcher's env contract as "ENV KEY=VALUE" lines
//   --print-cpus             print the CPUs it may run on (sched_getaffinity) as "CPUS 0,1"
//   --wait-for-world N       while WORLD_SIZE < N, wait (until the launcher stops it)
//   --lines N                print N stdout lines, each in three separate writes
//   --stderr TEXT            print TEXT on stderr (the failing rank, before failing)
//   --fail-rank R            only rank R fails (default: every rank fails when told to)
//   --exit CODE              the failing rank exits with CODE
//   --signal SIG             the failing rank kills itself with SIG instead
//   --fail-until-restart K   fail only while TORCHELASTIC_RESTART_COUNT < K
//   --fail-delay S           the failing rank waits S seconds first
//   --sleep S                the other ranks sleep S seconds before exiting 0
//   --pid-dir DIR            write DIR/rank_R.pid (and rank_R.child.pid with --spawn-child)
//   --spawn-child            fork a grandchild that sleeps (orphan test)
//   --on-term                on SIGTERM print "rank R got SIGTERM" and exit 143
//   --ignore-term            ignore SIGTERM (forces the launcher's SIGKILL)
//   --cascade                the other ranks print tdist's "lost the connection to rank R"
//                            for the failing rank R and abort at once (its slow exit's peers)
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace {
int g_rank = -1;

void on_term(int) {
  char msg[64];
  int n = snprintf(msg, sizeof(msg), "rank %d got SIGTERM\n", g_rank);
  [[maybe_unused]] ssize_t w = write(1, msg, n);
  _exit(143);
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

void sleep_seconds(double s) {
  if (s > 0) usleep(static_cast<useconds_t>(s * 1e6));
}

void print_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
    printf("CPUS error\n");
    return;
  }
  std::string list;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) list += (list.empty() ? "" : ",") + std::to_string(cpu);
  }
  printf("CPUS %s\n", list.c_str());
  fflush(stdout);
}
}  // namespace

int main(int argc, char** argv) {
  bool print_env = false, spawn_child = false, cascade = false, cpus = false;
  int wait_for_world = 0, lines = 0, fail_rank = -1, exit_code = 0, sig = 0, fail_until = -1;
  double fail_delay = 0, sleep_s = 0;
  std::string stderr_text, pid_dir;
  g_rank = env_int("RANK", -1);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return std::string(i + 1 < argc ? argv[++i] : ""); };
    if (a == "--print-env")
      print_env = true;
    else if (a == "--print-cpus")
      cpus = true;
    else if (a == "--wait-for-world")
      wait_for_world = std::stoi(next());
    else if (a == "--lines")
      lines = std::stoi(next());
    else if (a == "--stderr")
      stderr_text = next();
    else if (a == "--fail-rank")
      fail_rank = std::stoi(next());
    else if (a == "--exit")
      exit_code = std::stoi(next());
    else if (a == "--signal")
      sig = std::stoi(next());
    else if (a == "--fail-until-restart")
      fail_until = std::stoi(next());
    else if (a == "--fail-delay")
      fail_delay = std::stod(next());
    else if (a == "--sleep")
      sleep_s = std::stod(next());
    else if (a == "--pid-dir")
      pid_dir = next();
    else if (a == "--spawn-child")
      spawn_child = true;
    else if (a == "--on-term")
      signal(SIGTERM, on_term);
    else if (a == "--ignore-term")
      signal(SIGTERM, SIG_IGN);
    else if (a == "--cascade")
      cascade = true;
    else {
      fprintf(stderr, "test_worker: unknown option %s\n", a.c_str());
      return 64;
    }
  }
  if (!pid_dir.empty()) {
    std::ofstream(pid_dir + "/rank_" + std::to_string(g_rank) + ".pid") << getpid() << "\n";
    if (spawn_child) {
      pid_t child = fork();
      if (child == 0) {
        // Leave the worker's pipes and session: only the launcher's subreaper sweep or
        // the process-group kill can find it.
        for (int fd = 0; fd < 3; ++fd) close(fd);
        setsid();
        pause();
        _exit(0);
      }
      std::ofstream(pid_dir + "/rank_" + std::to_string(g_rank) + ".child.pid") << child << "\n";
    }
  }
  if (print_env) {
    for (const char* key :
         {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
          "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
          "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
          "TDIST_ELASTIC_ROUND", "TDIST_STORE_SECRET_FILE", "OMP_NUM_THREADS",
          "OPENBLAS_CORETYPE"}) {
      const char* v = std::getenv(key);
      printf("ENV %s=%s\n", key, v ? v : "<unset>");
    }
    if (const char* f = std::getenv("TDIST_STORE_SECRET_FILE")) {
      struct stat st {};
      if (stat(f, &st) == 0) printf("SECRET_MODE=%o\n", st.st_mode & 0777);
      std::ifstream in(f);
      std::string secret;
      in >> secret;
      printf("SECRET=%s\n", secret.c_str());
    }
    fflush(stdout);
  }
  if (cpus) print_cpus();
  // An elastic job's first workers, waiting for a node to join (the launcher restarts them).
  while (env_int("WORLD_SIZE", 0) < wait_for_world) pause();
  for (int i = 0; i < lines; ++i) {
    std::string a = "line " + std::to_string(i), b = " of rank ",
                c = std::to_string(g_rank) + " end\n";
    for (const auto& part : {a, b, c}) {
      [[maybe_unused]] ssize_t w = write(1, part.data(), part.size());
    }
  }
  int restart = env_int("TORCHELASTIC_RESTART_COUNT", 0);
  bool fails = (fail_rank < 0 || fail_rank == g_rank) && (exit_code != 0 || sig != 0) &&
               (fail_until < 0 || restart < fail_until);
  if (fails) {
    sleep_seconds(fail_delay);
    if (!stderr_text.empty()) fprintf(stderr, "%s\n", stderr_text.c_str());
    fflush(stderr);
    if (sig != 0) raise(sig);
    return exit_code;
  }
  if (cascade && fail_rank >= 0) {
    fprintf(stderr,
            "rank %d: gloo all_reduce #1 (receiving from rank %d): lost the connection to rank "
            "%d (the peer died or closed the group); the group is now broken\n",
            g_rank, fail_rank, fail_rank);
    fflush(stderr);
    abort();
  }
  sleep_seconds(sleep_s);
  printf("rank %d done\n", g_rank);
  return 0;
}
