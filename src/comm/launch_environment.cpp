#include "tdist/comm/launch_environment.h"

#include <cctype>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>

#include "tdist/error.h"

#include <unistd.h>

namespace tdist {
namespace {

constexpr int64_t kMaxWorld = 1 << 24;
constexpr int64_t kMaxPort = 65535;
constexpr int64_t kMaxJobId = INT64_MAX;

class Env {
 public:
  explicit Env(const std::function<const char*(const char*)>& getenv) : getenv_(getenv) {}

  std::optional<std::string> get(const char* name) const {
    const char* v = getenv_ ? getenv_(name) : std::getenv(name);
    if (v == nullptr || *v == '\0') return std::nullopt;
    return std::string(v);
  }
  bool has(const char* name) const { return get(name).has_value(); }
  std::string text(const char* name) const { return std::string(name) + "=" + *get(name); }

  /// A whole number in [min, max]; each variable has its own range (a rank, a port, a job id).
  std::optional<int64_t> number(const char* name, int64_t min, int64_t max) const {
    const auto v = get(name);
    if (!v) return std::nullopt;
    int64_t value = 0;
    const auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), value);
    if (ec != std::errc() || end != v->data() + v->size() || value < min || value > max) {
      TDIST_THROW(InvalidArgument, std::string(name) + "='" + *v +
                                       "': expected a whole number from " + std::to_string(min) +
                                       " to " + std::to_string(max) +
                                       " (launchers set it; fix or unset the variable)");
    }
    return value;
  }
  /// A rank, world or node count: at least `min`, at most 2^24.
  std::optional<int> count(const char* name, int min) const {
    const auto v = number(name, min, kMaxWorld);
    return v ? std::optional<int>(static_cast<int>(*v)) : std::nullopt;
  }
  std::optional<int> port(const char* name) const {
    const auto v = number(name, 1, kMaxPort);
    return v ? std::optional<int>(static_cast<int>(*v)) : std::nullopt;
  }

 private:
  const std::function<const char*(const char*)>& getenv_;
};

// What one launcher's variables say about this process.
struct Claim {
  std::string launcher;
  int rank = -1;
  int world = -1;
  int local_rank = -1;
  int local_world = -1;
  std::string rank_var;   // "SLURM_PROCID=2"
  std::string world_var;  // "SLURM_NTASKS=3"
  std::vector<std::string> provenance;
};

// Fills a claim from its launcher's variable names; `world_name` may be null (unknown here).
Claim claim_of(const Env& env, const char* launcher, const char* rank_name, const char* world_name,
               const char* local_rank_name, const char* local_world_name) {
  Claim c;
  c.launcher = launcher;
  c.rank = *env.count(rank_name, 0);
  c.rank_var = env.text(rank_name);
  c.provenance.push_back("rank " + c.rank_var);
  if (world_name != nullptr && env.has(world_name)) {
    c.world = *env.count(world_name, 1);
    c.world_var = env.text(world_name);
    c.provenance.push_back("world size " + c.world_var);
  }
  if (local_rank_name != nullptr && env.has(local_rank_name)) {
    c.local_rank = *env.count(local_rank_name, 0);
    c.provenance.push_back("local rank " + env.text(local_rank_name));
  }
  if (local_world_name != nullptr && env.has(local_world_name)) {
    c.local_world = *env.count(local_world_name, 1);
    c.provenance.push_back("local world size " + env.text(local_world_name));
  }
  if (c.world > 0 && c.rank >= c.world) {
    TDIST_THROW(InvalidArgument, c.rank_var + " is not below " + c.world_var + " (" + launcher +
                                     "): ranks run from 0 to the world size - 1");
  }
  return c;
}

std::optional<Claim> torchrun_claim(const Env& env) {
  if (!env.has("RANK")) return std::nullopt;
  return claim_of(env, "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
}

enum class Disagreement { kRank, kWorldSize };

[[noreturn]] void conflict(const Claim& a, const Claim& b, Disagreement on) {
  const bool rank = on == Disagreement::kRank;
  TDIST_THROW(InvalidArgument,
              "launch environment: " + a.launcher + " and " + b.launcher + " disagree on " +
                  (rank ? "the rank (" + a.rank_var + " but " + b.rank_var
                        : "the world size (" + a.world_var + " but " + b.world_var) +
                  "); this process's environment mixes two launches: unset the stale "
                  "variables, or start the job with one launcher");
}

// OpenMPI, MPICH's Hydra and PMIx, checked against each other (OpenMPI sets PMIX_RANK too).
std::optional<Claim> mpi_claim(const Env& env) {
  std::vector<Claim> found;
  if (env.has("OMPI_COMM_WORLD_RANK")) {
    found.push_back(claim_of(env, "openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                             "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"));
  }
  if (env.has("PMI_RANK")) {
    found.push_back(
        claim_of(env, "mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"));
  }
  if (env.has("PMIX_RANK")) {
    found.push_back(claim_of(env, "pmix", "PMIX_RANK", nullptr, nullptr, nullptr));
  }
  if (found.empty()) return std::nullopt;
  for (size_t i = 1; i < found.size(); ++i) {
    if (found[i].rank != found[0].rank) conflict(found[0], found[i], Disagreement::kRank);
    if (found[i].world > 0 && found[0].world > 0 && found[i].world != found[0].world) {
      conflict(found[0], found[i], Disagreement::kWorldSize);
    }
  }
  for (const Claim& c : found) {
    if (c.world > 0) return c;
  }
  return found.front();  // PMIx alone: the size comes from SLURM or WORLD_SIZE
}

// The entry of SLURM_TASKS_PER_NODE for this node, if SLURM says which node this is.
int slurm_local_world(const Env& env) {
  const auto counts = env.get("SLURM_TASKS_PER_NODE");
  const auto node = env.count("SLURM_NODEID", 0);
  if (!counts || !node) return -1;
  const std::vector<int> per_node = expand_slurm_tasks_per_node(*counts);
  if (*node >= static_cast<int>(per_node.size())) {
    TDIST_THROW(InvalidArgument, env.text("SLURM_NODEID") + " has no entry in " +
                                     env.text("SLURM_TASKS_PER_NODE") +
                                     " (launch environment: slurm)");
  }
  return per_node[*node];
}

std::optional<Claim> slurm_claim(const Env& env) {
  if (!env.has("SLURM_PROCID")) return std::nullopt;
  const char* world = env.has("SLURM_NTASKS") ? "SLURM_NTASKS" : "SLURM_NPROCS";
  if (!env.has(world)) {
    TDIST_THROW(InvalidArgument,
                env.text("SLURM_PROCID") +
                    " is set but neither SLURM_NTASKS nor SLURM_NPROCS is: start the ranks "
                    "with srun (srun -n N ...), which sets both");
  }
  Claim c = claim_of(env, "slurm", "SLURM_PROCID", world, "SLURM_LOCALID", nullptr);
  c.local_world = slurm_local_world(env);
  if (c.local_world > 0) {
    c.provenance.push_back("local world size from " + env.text("SLURM_TASKS_PER_NODE") + " at " +
                           env.text("SLURM_NODEID"));
  }
  return c;
}

std::optional<Claim> kubeflow_claim(const Env& env) {
  if (!env.has("PET_NODE_RANK")) return std::nullopt;
  if (const auto per_pod = env.count("PET_NPROC_PER_NODE", 1); per_pod && *per_pod > 1) {
    TDIST_THROW(InvalidArgument,
                env.text("PET_NPROC_PER_NODE") +
                    ": this process was started alone in a pod that asks for several; start "
                    "them with tdistrun (tdistrun --nnodes $PET_NNODES --node-rank "
                    "$PET_NODE_RANK --nproc-per-node $PET_NPROC_PER_NODE ...) or set the "
                    "PyTorchJob's nprocPerNode to 1");
  }
  if (!env.has("PET_NNODES")) {
    TDIST_THROW(InvalidArgument, env.text("PET_NODE_RANK") +
                                     " is set but PET_NNODES is not: the PyTorchJob's "
                                     "environment is incomplete; set WORLD_SIZE");
  }
  Claim c = claim_of(env, "kubeflow", "PET_NODE_RANK", "PET_NNODES", nullptr, nullptr);
  c.local_rank = 0;
  c.local_world = 1;
  return c;
}

// 64-bit FNV-1a: the same on every rank for the same text (std::hash promises nothing).
uint64_t stable_hash(const std::string& text) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char ch : text) {
    h ^= ch;
    h *= 1099511628211ULL;
  }
  return h;
}

// Ports 20000-39999: above the well-known range, below Linux's ephemeral ports (32768+ on
// most hosts overlap; the collision shows as "address in use", naming MASTER_PORT).
int derived_port(uint64_t id) {
  return 20000 + static_cast<int>(id % 20000);
}

// `slurm_job`: SLURM's variables describe this job (srun started it, perhaps through an MPI
// plugin), so its node list and job id say where rank 0 is.
void derive_master_addr(const Env& env, const Claim& chosen, bool slurm_job,
                        LaunchEnvironment& out) {
  if (env.has("MASTER_ADDR")) {
    out.master_addr = *env.get("MASTER_ADDR");
    out.provenance.push_back("address " + env.text("MASTER_ADDR"));
    return;
  }
  if (slurm_job) {
    for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
      if (!env.has(name)) continue;
      out.master_addr = expand_slurm_hostlist(*env.get(name)).front();
      out.provenance.push_back("address: the first host of " + env.text(name));
      return;
    }
  }
  if (chosen.launcher == "kubeflow" && env.has("PET_MASTER_ADDR")) {
    out.master_addr = *env.get("PET_MASTER_ADDR");
    out.provenance.push_back("address " + env.text("PET_MASTER_ADDR"));
    return;
  }
  if (chosen.local_world > 0 && chosen.local_world == chosen.world) {
    out.master_addr = "127.0.0.1";
    out.provenance.push_back("address 127.0.0.1 (every rank on this host)");
  }
}

// The parent process when it is MPICH's hydra_pmi_proxy (every rank on a host is its child);
// 0 otherwise: a wrapper script between them would give each rank another parent, and so
// another port.
int64_t parent_hydra_proxy_pid() {
  const pid_t parent = getppid();
  std::ifstream comm("/proc/" + std::to_string(parent) + "/comm");
  std::string name;
  std::getline(comm, name);
  return name == "hydra_pmi_proxy" ? static_cast<int64_t>(parent) : 0;
}

void derive_master_port(const Env& env, const Claim& chosen, bool slurm_job,
                        int64_t hydra_proxy_pid, LaunchEnvironment& out) {
  if (env.has("MASTER_PORT")) {
    out.master_port = *env.port("MASTER_PORT");
    out.provenance.push_back("port " + env.text("MASTER_PORT"));
    return;
  }
  if (chosen.launcher == "kubeflow" && env.has("PET_MASTER_PORT")) {
    out.master_port = *env.port("PET_MASTER_PORT");
    out.provenance.push_back("port " + env.text("PET_MASTER_PORT"));
    return;
  }
  if (slurm_job && env.has("SLURM_JOB_ID")) {
    out.master_port =
        derived_port(static_cast<uint64_t>(*env.number("SLURM_JOB_ID", 0, kMaxJobId)));
    out.provenance.push_back("port " + std::to_string(out.master_port) + " from " +
                             env.text("SLURM_JOB_ID"));
    return;
  }
  if (out.master_addr == "127.0.0.1") {
    for (const char* name : {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"}) {
      if (!env.has(name)) continue;
      out.master_port = derived_port(stable_hash(*env.get(name)));
      out.provenance.push_back("port " + std::to_string(out.master_port) + " from " +
                               env.text(name));
      return;
    }
    if (chosen.launcher == "mpich" && hydra_proxy_pid > 0) {
      out.master_port =
          derived_port(stable_hash("hydra_pmi_proxy " + std::to_string(hydra_proxy_pid)));
      out.provenance.push_back("port " + std::to_string(out.master_port) +
                               " from the process id of Hydra's proxy (" +
                               std::to_string(hydra_proxy_pid) + ")");
    }
  }
}

}  // namespace

LaunchEnvironment LaunchEnvironment::detect(const std::function<const char*(const char*)>& getenv,
                                            std::optional<int64_t> hydra_proxy_pid) {
  const Env env(getenv);
  const std::optional<Claim> torchrun = torchrun_claim(env);
  const std::optional<Claim> mpi = mpi_claim(env);
  const std::optional<Claim> slurm = slurm_claim(env);
  const std::optional<Claim> kubeflow = kubeflow_claim(env);
  LaunchEnvironment out;
  std::optional<Claim> chosen;
  if (torchrun) {
    chosen = torchrun;  // torchrun / tdistrun under srun or mpirun numbers its own processes
  } else if (mpi) {
    chosen = mpi;
    if (slurm && (chosen->world < 0 || chosen->world == slurm->world)) {
      // srun started the MPI processes: one job, so one numbering.
      if (chosen->rank != slurm->rank) conflict(*chosen, *slurm, Disagreement::kRank);
      if (chosen->world < 0) {
        chosen->world = slurm->world;
        chosen->world_var = slurm->world_var;
        chosen->provenance.push_back("world size " + slurm->world_var);
      }
      if (chosen->local_world < 0) chosen->local_world = slurm->local_world;
      if (chosen->local_rank < 0) chosen->local_rank = slurm->local_rank;
    }
  } else if (slurm) {
    chosen = slurm;
  } else if (kubeflow) {
    chosen = kubeflow;
  }
  if (!chosen) return out;
  if (chosen->launcher != "torchrun" && env.has("WORLD_SIZE")) {
    const int world = *env.count("WORLD_SIZE", 1);
    if (chosen->world < 0) {
      chosen->world = world;
      chosen->provenance.push_back("world size " + env.text("WORLD_SIZE"));
    } else if (world != chosen->world) {
      TDIST_THROW(InvalidArgument, "launch environment: " + env.text("WORLD_SIZE") + " but " +
                                       chosen->world_var + " (" + chosen->launcher +
                                       "); unset WORLD_SIZE, or start as many processes");
    }
  }
  if (chosen->world < 0) {
    TDIST_THROW(InvalidArgument, "launch environment: " + chosen->rank_var + " (" +
                                     chosen->launcher +
                                     ") gives this process's rank but nothing gives the world "
                                     "size: set WORLD_SIZE");
  }
  out.launcher = chosen->launcher;
  out.rank = chosen->rank;
  out.world_size = chosen->world;
  out.local_rank = chosen->local_rank;
  out.local_world_size = chosen->local_world;
  out.provenance = chosen->provenance;
  const bool slurm_job = slurm && (chosen->launcher == "slurm" || chosen->world == slurm->world);
  derive_master_addr(env, *chosen, slurm_job, out);
  if (!hydra_proxy_pid) {
    hydra_proxy_pid = getenv || chosen->launcher != "mpich" ? 0 : parent_hydra_proxy_pid();
  }
  derive_master_port(env, *chosen, slurm_job, *hydra_proxy_pid, out);
  return out;
}

std::vector<std::string> LaunchEnvironment::export_torchrun_variables() const {
  std::vector<std::string> set;
  auto put = [&](const char* name, const std::string& value) {
    const char* current = std::getenv(name);
    if (current != nullptr && *current != '\0') return;
    ::setenv(name, value.c_str(), 1);
    set.push_back(name);
  };
  if (!found()) return set;
  put("RANK", std::to_string(rank));
  put("WORLD_SIZE", std::to_string(world_size));
  if (local_rank >= 0) put("LOCAL_RANK", std::to_string(local_rank));
  if (local_world_size > 0) put("LOCAL_WORLD_SIZE", std::to_string(local_world_size));
  if (!master_addr.empty()) put("MASTER_ADDR", master_addr);
  if (master_port > 0) put("MASTER_PORT", std::to_string(master_port));
  return set;
}

std::string LaunchEnvironment::describe() const {
  if (!found()) return "launch environment: no launcher's variables found";
  std::string text = "launch environment: " + launcher + " (";
  for (size_t i = 0; i < provenance.size(); ++i) text += (i ? "; " : "") + provenance[i];
  return text + ")";
}

namespace {

[[noreturn]] void bad_hostlist(const std::string& list, const std::string& why) {
  TDIST_THROW(InvalidArgument, "SLURM host list '" + list + "' cannot be parsed: " + why +
                                   " (expected e.g. node[01-04,07],gpu3)");
}

int64_t parse_number(const std::string& list, const std::string& text) {
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value < 0) {
    bad_hostlist(list, "'" + text + "' is not a number");
  }
  return value;
}

std::string padded(int64_t value, size_t width) {
  std::string digits = std::to_string(value);
  if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
  return digits;
}

// "01-04,07" after `prefix`, then `suffix` (itself possibly bracketed, expanded recursively).
void expand_brackets(const std::string& list, const std::string& prefix, const std::string& ranges,
                     const std::string& suffix, std::vector<std::string>& out) {
  std::vector<std::string> tails =
      suffix.empty() ? std::vector<std::string>{""} : expand_slurm_hostlist(suffix);
  std::stringstream parts(ranges);
  for (std::string part; std::getline(parts, part, ',');) {
    const size_t dash = part.find('-');
    const std::string first = part.substr(0, dash);
    const int64_t lo = parse_number(list, first);
    const int64_t hi = dash == std::string::npos ? lo : parse_number(list, part.substr(dash + 1));
    if (hi < lo) bad_hostlist(list, "the range '" + part + "' runs backwards");
    if (hi - lo > kMaxWorld) bad_hostlist(list, "the range '" + part + "' is too long");
    for (int64_t n = lo; n <= hi; ++n) {
      for (const auto& tail : tails) out.push_back(prefix + padded(n, first.size()) + tail);
    }
  }
}

}  // namespace

std::vector<std::string> expand_slurm_hostlist(const std::string& list) {
  std::vector<std::string> hosts;
  size_t start = 0;
  int depth = 0;
  // Split on the commas outside brackets, then expand each host expression.
  for (size_t i = 0; i <= list.size(); ++i) {
    const char ch = i < list.size() ? list[i] : ',';
    if (ch == '[') ++depth;
    if (ch == ']' && --depth < 0) bad_hostlist(list, "a ']' without its '['");
    if (ch != ',' || depth > 0) continue;
    const std::string item = list.substr(start, i - start);
    start = i + 1;
    if (item.empty()) bad_hostlist(list, "an empty host name");
    const size_t open = item.find('[');
    if (open == std::string::npos) {
      if (item.find(']') != std::string::npos) bad_hostlist(list, "a ']' without its '['");
      hosts.push_back(item);
      continue;
    }
    const size_t close = item.find(']', open);
    if (close == std::string::npos) bad_hostlist(list, "a '[' without its ']'");
    expand_brackets(list, item.substr(0, open), item.substr(open + 1, close - open - 1),
                    item.substr(close + 1), hosts);
  }
  if (depth != 0) bad_hostlist(list, "a '[' without its ']'");
  return hosts;
}

std::vector<int> expand_slurm_tasks_per_node(const std::string& counts) {
  std::vector<int> out;
  std::stringstream parts(counts);
  auto bad = [&](const std::string& why) -> void {
    TDIST_THROW(InvalidArgument, "SLURM_TASKS_PER_NODE='" + counts + "' cannot be parsed: " + why +
                                     " (expected e.g. 2(x3),1)");
  };
  for (std::string part; std::getline(parts, part, ',');) {
    int count = 0, repeat = 1;
    const size_t paren = part.find("(x");
    const std::string number = part.substr(0, paren);
    auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), count);
    if (number.empty() || ec != std::errc() || end != number.data() + number.size() || count < 1) {
      bad("'" + part + "'");
    }
    if (paren != std::string::npos) {
      if (part.back() != ')') bad("'" + part + "'");
      const std::string times = part.substr(paren + 2, part.size() - paren - 3);
      auto [tend, tec] = std::from_chars(times.data(), times.data() + times.size(), repeat);
      if (times.empty() || tec != std::errc() || tend != times.data() + times.size() ||
          repeat < 1 || repeat > kMaxWorld) {
        bad("'" + part + "'");
      }
    }
    out.insert(out.end(), static_cast<size_t>(repeat), count);
  }
  if (out.empty()) bad("no counts");
  return out;
}

}  // namespace tdist
