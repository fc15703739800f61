#pragma once

// Which GPU a rank's NCCL communicator binds. Pure, so that every branch is tested on
// machines without a GPU.

#include <string>

namespace tdist::nccl::detail {

/// `requested` (>= 0) if given; else the index of `device_id` ("cuda:1"; "cuda" or "": not
/// given); else LOCAL_RANK (as torchrun and tdistrun set it), except that a process whose
/// CUDA_VISIBLE_DEVICES (`visible_devices_set`) leaves it one GPU takes that one; else
/// `rank % device_count`, c10d's guess. Throws DistBackendError when there is no GPU and
/// InvalidArgument when the choice is not below `device_count`, or device_id / LOCAL_RANK is
/// malformed.
int choose_device_index(int requested, const std::string& device_id, const std::string& local_rank,
                        int rank, int device_count, bool visible_devices_set = false);

}  // namespace tdist::nccl::detail
