#include "comm/debug_check.h"

#include <torch/torch.h>

#include <chrono>
#include <thread>

#include "tdist/detail/comm/engine/op_codes.h"
#include "tdist/error.h"
#include "tdist/store/store_all_gather.h"

namespace tdist::detail {

namespace {

constexpr int64_t kMagic = 0x7d15c0de;
constexpr int kMaxDims = 12;
// Layout of one fingerprint.
enum Field : int {
  kMagicF,
  kOp,
  kDtype,
  kCheckShape,
  kRoot,
  kReduceOp,
  kNdim,
  kDims,
  kFields = kDims + kMaxDims
};

// An op the table lacks still gets a code of its own, so two different ones still differ.
int64_t op_code(const std::string& op) {
  if (const int32_t code = collective_op_code(op)) return code;
  return static_cast<int64_t>(std::hash<std::string>{}(op)&0xffffff) + 1000;
}

std::vector<int64_t> fingerprint(const CallSignature& s) {
  std::vector<int64_t> f(kFields, 0);
  f[kMagicF] = kMagic;
  f[kOp] = op_code(s.op);
  f[kDtype] = s.dtype;
  f[kCheckShape] = s.check_shape ? 1 : 0;
  f[kRoot] = s.root;
  f[kReduceOp] = s.reduce_op;
  if (s.check_shape) {
    const auto& sizes = s.shape;
    f[kNdim] = static_cast<int64_t>(sizes.size());
    for (size_t d = 0; d < sizes.size(); ++d) {
      // Dimensions past the last slot fold into it, so a difference still shows.
      size_t slot = std::min<size_t>(d, kMaxDims - 1);
      f[kDims + slot] = d < kMaxDims ? sizes[d] : f[kDims + slot] * 1000003 + sizes[d];
    }
  } else {
    f[kNdim] = -1;
  }
  return f;
}

std::string describe(const int64_t* f) {
  if (f[kMagicF] != kMagic) return "<unreadable fingerprint>";
  const char* name = collective_op_name(f[kOp]);
  std::string op = name ? name : "op#" + std::to_string(f[kOp]);
  std::string out = op + "(";
  if (f[kDtype] >= 0) {
    out += std::string("dtype=") + c10::toString(static_cast<c10::ScalarType>(f[kDtype]));
  }
  if (f[kNdim] >= 0) {
    out += ", shape=[";
    for (int64_t d = 0; d < std::min<int64_t>(f[kNdim], kMaxDims); ++d) {
      out += (d ? "," : "") + std::to_string(f[kDims + d]);
    }
    out += "]";
  }
  if (f[kRoot] >= 0) out += ", root=" + std::to_string(f[kRoot]);
  if (f[kReduceOp] >= 0)
    out += ", op=" + to_string(ReduceOp(static_cast<ReduceOp::Kind>(f[kReduceOp])));
  return out + ")";
}

}  // namespace

CallSignature signature_of(std::string op, const at::Tensor& tensor, bool check_shape, int root,
                           int reduce_op) {
  CallSignature s;
  s.op = std::move(op);
  if (tensor.defined()) {
    s.dtype = static_cast<int64_t>(tensor.scalar_type());
    s.shape = tensor.sizes().vec();
  }
  s.check_shape = check_shape && tensor.defined();
  s.root = root;
  s.reduce_op = reduce_op;
  return s;
}

namespace {

/// Every rank's fingerprint through the group's host backend, rank after rank.
std::vector<int64_t> gather_through_backend(ProcessGroup& pg, const std::vector<int64_t>& mine) {
  at::Tensor input = torch::tensor(mine, torch::kInt64);
  at::Tensor output = torch::empty({pg.size() * kFields}, torch::kInt64);
  AllgatherOptions opts;
  opts.timeout = pg.timeout();
  opts.tag = "TDIST_DEBUG signature check";
  pg.backend("cpu").all_gather_into_tensor(output, input, opts)->wait();
  return std::vector<int64_t>(output.data_ptr<int64_t>(),
                              output.data_ptr<int64_t>() + output.numel());
}

/// The gather's keys: store_all_gather's rounds under this prefix, numbered by sequence number.
constexpr const char* kSignaturePrefix = "signature_check";

StoreAllGatherOptions signature_gather(const ProcessGroup& pg) {
  return StoreAllGatherOptions()
      .prefix(kSignaturePrefix)
      .rank(pg.rank())
      .world_size(pg.size())
      .timeout(pg.timeout())
      .purpose("TDIST_DEBUG=DETAIL signature check in process group '" + pg.name() +
               "' at sequence number " + std::to_string(pg.sequence_number()));
}

/// A counter ranks leave a failed check by, "signature_check_exit/<sequence number>/<name>":
/// a prefix of its own, so the gather's key layout stays store_all_gather's business.
std::string exit_counter_key(const ProcessGroup& pg, const std::string& name) {
  return "signature_check_exit/" + std::to_string(pg.sequence_number()) + "/" + name;
}

/// Every rank's fingerprint through the group's store, for a group with device backends only
/// (an "nccl" group): fingerprints are host data, and a device collective would return them
/// stream-ordered (c10d pairs such a group with a gloo helper for these checks instead).
/// Checks are numbered one after another, so sequence numbers serve as the rounds.
std::vector<int64_t> gather_through_store(ProcessGroup& pg, const std::vector<int64_t>& mine) {
  const StoreAllGatherOptions options = signature_gather(pg);
  const auto* bytes = reinterpret_cast<const uint8_t*>(mine.data());
  const std::vector<std::vector<uint8_t>> values =
      store_all_gather(*pg.store(), pg.sequence_number(),
                       std::vector<uint8_t>(bytes, bytes + mine.size() * sizeof(int64_t)), options);
  std::vector<int64_t> all;
  for (size_t r = 0; r < values.size(); ++r) {
    if (values[r].size() != kFields * sizeof(int64_t)) {
      TDIST_THROW(DistBackendError,
                  "TDIST_DEBUG=DETAIL: the store holds a malformed signature "
                  "under '" +
                      store_all_gather_key(options, pg.sequence_number(), static_cast<int>(r)) +
                      "' (" + std::to_string(values[r].size()) +
                      " bytes); do all ranks run the same tdist?");
    }
    const auto* fields = reinterpret_cast<const int64_t*>(values[r].data());
    all.insert(all.end(), fields, fields + kFields);
  }
  return all;
}

/// Until `key` counts `n` or a short bound passes (a rank that never arrives does not hold
/// the error back long).
void wait_for_count(Store& store, const std::string& key, int64_t n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (store.add(key, 0) < n && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

/// Before a mismatch found through the store is raised on every rank: the rank hosting the
/// store (whichever it is) must not exit while another still talks to it. Each rank counts
/// itself "read" and waits for all; then "leaving", and waits for all while the store lasts.
/// No rank can leave before every rank has finished the first wait, and only the second
/// round, whose answers nobody needs, may meet a store already gone.
void leave_store_together(ProcessGroup& pg) {
  Store& store = *pg.store();
  const std::string read = exit_counter_key(pg, "read");
  const std::string leaving = exit_counter_key(pg, "leaving");
  store.add(read, 1);
  wait_for_count(store, read, pg.size());
  try {
    store.add(leaving, 1);
    wait_for_count(store, leaving, pg.size());
  } catch (const Error&) {
    // The store's host left first; everyone was past the first round.
  }
}

}  // namespace

void check_call_signature(ProcessGroup& pg, const CallSignature& signature) {
  if (pg.size() == 1) return;
  const bool through_store = pg.backend_names().count("cpu") == 0;
  const std::vector<int64_t> gathered = through_store
                                            ? gather_through_store(pg, fingerprint(signature))
                                            : gather_through_backend(pg, fingerprint(signature));
  const int64_t* all = gathered.data();
  for (int r = 1; r < pg.size(); ++r) {
    if (!std::equal(all, all + kFields, all + r * kFields)) {
      if (through_store) leave_store_together(pg);
      TDIST_THROW(DistBackendError,
                  "rank " + std::to_string(pg.rank()) +
                      ": TDIST_DEBUG=DETAIL found a collective "
                      "mismatch in process group '" +
                      pg.name() + "' at sequence number " + std::to_string(pg.sequence_number()) +
                      ": global rank " + std::to_string(pg.global_rank(0)) + " called " +
                      describe(all) + " but global rank " + std::to_string(pg.global_rank(r)) +
                      " called " + describe(all + r * kFields) +
                      "; every rank must issue the same collectives in the same order with "
                      "matching dtypes and shapes");
    }
  }
}

}  // namespace tdist::detail
