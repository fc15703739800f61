#pragma once

// Note [Staging device tensors through the host]: a backend that computes on host memory
// (gloo, mpi) can still serve a process group's CUDA tensors, as c10d's Gloo does: each
// collective copies its device tensors into pinned host memory on a side stream (after the
// caller's queued kernels), runs the host collective, and copies the results back on that
// stream, which the caller's current stream then waits on. Two processes can so share one
// GPU on every CUDA path (NCCL refuses that). Device-generic through c10's stream and event
// interfaces: nothing here includes CUDA. Point-to-point ops are not staged (a blocking
// staged send would deadlock two ranks that each send before they receive), as in c10d.

#include "tdist/comm/collective_backend.h"

namespace tdist::detail {

/// Wraps `host` for tensors of `device_type`; the result's calls block until the host
/// collective is done and return completed Work (device copies stay stream-ordered).
CollectiveBackendPtr stage_through_host(CollectiveBackendPtr host, c10::DeviceType device_type);

}  // namespace tdist::detail
