#pragma once

// Value types shared by every collective: reduce operations and per-call options.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tdist {

/// How a reduction combines values, as torch.distributed.ReduceOp.
/// BAND/BOR/BXOR are for integer and bool tensors only.
enum class ReduceOp { SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR };

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
