#pragma once

// Value types shared by every collective: reduce operations and per-call options.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tdist {

/// How a reduction combines values, as torch.distributed.ReduceOp (c10d's C++ ReduceOp: a
/// kind, plus PREMUL_SUM's factor). BAND/BOR/BXOR are for integer and bool tensors only.
/// `ReduceOp::SUM` and the other names are kinds; a kind converts to a ReduceOp, and a
/// ReduceOp to its kind, so ReduceOps compare with `==` and work in `switch`.
///
/// PREMUL_SUM multiplies every rank's input by a factor, then sums: made by
/// make_nccl_premul_sum (the bare kind, without a factor, is refused). Floating dtypes only,
/// as PyTorch's NCCL has it; NCCL applies it natively (ncclRedOpCreatePreMulSum), the other
/// backends scale the input first (Note [PREMUL_SUM without NCCL], src/comm/premul_sum.cpp).
class ReduceOp {
 public:
  enum class Kind : uint8_t { SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR, PREMUL_SUM };
  static constexpr Kind SUM = Kind::SUM;
  static constexpr Kind AVG = Kind::AVG;
  static constexpr Kind PRODUCT = Kind::PRODUCT;
  static constexpr Kind MIN = Kind::MIN;
  static constexpr Kind MAX = Kind::MAX;
  static constexpr Kind BAND = Kind::BAND;
  static constexpr Kind BOR = Kind::BOR;
  static constexpr Kind BXOR = Kind::BXOR;
  static constexpr Kind PREMUL_SUM = Kind::PREMUL_SUM;

  /*implicit*/ ReduceOp(Kind kind = Kind::SUM) : kind_(kind) {}
  /*implicit*/ operator Kind() const { return kind_; }
  Kind kind() const { return kind_; }
  /// The kind's number (SUM 0 ... PREMUL_SUM 8), for headers and fingerprints.
  int code() const { return static_cast<int>(kind_); }
  /// The kind numbered `code`; throws InvalidArgument for a number that names none.
  static ReduceOp from_code(int code);

  /// PREMUL_SUM's factor (made by make_nccl_premul_sum): a scalar, or a one-element tensor.
  bool has_factor() const { return factor_ != nullptr; }
  /// The scalar factor; 1 when the factor is a tensor or there is none.
  double scalar_factor() const;
  /// The tensor factor; undefined when the factor is a scalar or there is none.
  const at::Tensor& tensor_factor() const;
  /// The factor as a 0-dim tensor of `like`'s dtype on `like`'s device (either form).
  at::Tensor factor_like(const at::Tensor& like) const;

 private:
  friend ReduceOp make_nccl_premul_sum(double factor);
  friend ReduceOp make_nccl_premul_sum(const at::Tensor& factor);
  struct Factor {
    double scalar = 1.0;
    at::Tensor tensor;
  };
  Kind kind_;
  std::shared_ptr<const Factor> factor_;
};

/// ReduceOp PREMUL_SUM with a scalar factor, as torch.distributed._make_nccl_premul_sum.
ReduceOp make_nccl_premul_sum(double factor);
/// ReduceOp PREMUL_SUM with a one-element floating tensor factor (NCCL reads it on the
/// device at run time). Throws InvalidArgument for any other tensor.
ReduceOp make_nccl_premul_sum(const at::Tensor& factor);

/// "SUM", ..., "PREMUL_SUM" (the kind's name).
std::string to_string(ReduceOp op);

/// Sentinel meaning "use the group's timeout".
constexpr std::chrono::milliseconds kUseGroupTimeout{-1};

/// Options every backend call takes. `timeout` bounds the whole collective.
struct CollectiveOptions {
  std::chrono::milliseconds timeout = kUseGroupTimeout;
  /// Who issued the collective (e.g. "FSDP::all_gather layers.3"); recorded by the flight
  /// recorder and shown in timeout reports.
  std::string tag;
};

struct BroadcastOptions : CollectiveOptions {
  int root = 0;  // group rank
};
struct AllreduceOptions : CollectiveOptions {
  ReduceOp op = ReduceOp::SUM;
};
struct ReduceOptions : CollectiveOptions {
  ReduceOp op = ReduceOp::SUM;
  int root = 0;  // group rank
};
struct AllgatherOptions : CollectiveOptions {};
struct GatherOptions : CollectiveOptions {
  int root = 0;
};
struct ScatterOptions : CollectiveOptions {
  int root = 0;
};
struct ReduceScatterOptions : CollectiveOptions {
  ReduceOp op = ReduceOp::SUM;
};
struct AllToAllOptions : CollectiveOptions {};
struct BarrierOptions : CollectiveOptions {};
struct SendRecvOptions : CollectiveOptions {
  int tag_id = 0;  // matches a send with the recv of the same tag
};

/// One send or receive of a batch (CollectiveBackend::batch_send_recv); `peer` is a group
/// rank.
struct PointToPoint {
  bool is_send = true;
  at::Tensor tensor;
  int peer = -1;
  int tag = 0;
};

}  // namespace tdist
