#include "debug_check.h"

#include <torch/torch.h>

#include "tdist/comm/engine/op_codes.h"
#include "tdist/error.h"

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
  if (f[kReduceOp] >= 0) out += ", op=" + to_string(static_cast<ReduceOp>(f[kReduceOp]));
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

void check_call_signature(ProcessGroup& pg, const CallSignature& signature) {
  if (pg.size() == 1) return;
  auto mine = fingerprint(signature);
  at::Tensor input = torch::tensor(mine, torch::kInt64);
  at::Tensor output = torch::empty({pg.size() * kFields}, torch::kInt64);
  CollectiveBackend& backend = pg.default_backend();
  AllgatherOptions opts;
  opts.timeout = pg.timeout();
  opts.tag = "TDIST_DEBUG signature check";
  backend.all_gather_into_tensor(output, input, opts)->wait();
  const int64_t* all = output.data_ptr<int64_t>();
  for (int r = 1; r < pg.size(); ++r) {
    if (!std::equal(all, all + kFields, all + r * kFields)) {
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
