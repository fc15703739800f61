#pragma once

// Many tensors broadcast in few collectives (c10d's _broadcast_coalesced): DDP's start-up
// and buffer syncs and FSDP's sync_module_states. Tensors of one dtype and device are
// flattened into buckets, each bucket is one broadcast, and the values are copied back in
// place. Buckets are bounded so that a large model needs a bucket's worth of extra memory,
// not a second copy of itself.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tdist/comm/process_group.h"

namespace tdist {

/// PyTorch's bucket for module-state broadcasts (DDP's and FSDP's 250 MiB).
constexpr int64_t kBroadcastBucketBytes = int64_t{250} << 20;

/// Which tensors travel together: indices into `tensors`, one list per bucket, in the order
/// the buckets are sent. A bucket holds one dtype on one device and at most `bucket_bytes`,
/// except a tensor larger than that, which travels alone. Every rank that passes the same
/// dtypes and sizes in the same order gets the same plan (device indices may differ).
std::vector<std::vector<size_t>> plan_broadcast_buckets(const std::vector<at::Tensor>& tensors,
                                                        int64_t bucket_bytes);

/// After the call every member's `tensors` hold global rank `src`'s values. Every member
/// passes the same count, shapes and dtypes in the same order (checked under
/// TDIST_DEBUG=DETAIL, one broadcast per bucket). Tensors are written in place, so views of
/// them (a module's parameters) see the result.
void broadcast_coalesced(const std::vector<at::Tensor>& tensors, int src,
                         const ProcessGroupPtr& group = nullptr,
                         int64_t bucket_bytes = kBroadcastBucketBytes);

}  // namespace tdist
