#pragma once

// Collectives over plain-data Objects (torch.distributed's *_object functions), without
// pickle: values travel in the data-only format of object.h. src/dst are global ranks; the
// group_src/group_dst forms name a rank of `group` instead (exactly one of the two).
// Each call runs a few tensor collectives on the group's default device (get_default_device):
// the host when the group has a CPU backend, else its GPU.

#include <optional>
#include <vector>

#include "tdist/comm/object.h"
#include "tdist/comm/process_group.h"

namespace tdist {

/// src's object_list replaces every other rank's (resized to src's length). Neither src nor
/// group_src: global rank 0.
void broadcast_object_list(std::vector<Object>& object_list, std::optional<int> src = std::nullopt,
                           const ProcessGroupPtr& group = nullptr,
                           std::optional<int> group_src = std::nullopt);
/// object_list becomes [obj of group rank 0, obj of group rank 1, ...] on every rank.
void all_gather_object(std::vector<Object>& object_list, const Object& obj,
                       const ProcessGroupPtr& group = nullptr);
/// On dst, object_gather_list becomes every rank's obj in group-rank order; elsewhere it is
/// left untouched (pass nullptr there). Neither dst nor group_dst: global rank 0.
void gather_object(const Object& obj, std::vector<Object>* object_gather_list,
                   std::optional<int> dst = std::nullopt, const ProcessGroupPtr& group = nullptr,
                   std::optional<int> group_dst = std::nullopt);
/// src gives one object per group rank in scatter_object_input_list; every rank receives
/// its own in scatter_object_output_list[0] (the list is resized to 1 if empty). Neither src
/// nor group_src: global rank 0.
void scatter_object_list(std::vector<Object>& scatter_object_output_list,
                         const std::vector<Object>& scatter_object_input_list,
                         std::optional<int> src = std::nullopt,
                         const ProcessGroupPtr& group = nullptr,
                         std::optional<int> group_src = std::nullopt);

/// Sends object_list to global rank dst, which receives it with recv_object_list; as
/// torch.distributed.send_object_list (tag 0, on the group's default device).
void send_object_list(const std::vector<Object>& object_list, std::optional<int> dst = std::nullopt,
                      const ProcessGroupPtr& group = nullptr,
                      std::optional<int> group_dst = std::nullopt);
/// Receives the list global rank src sent with send_object_list: object_list becomes it,
/// resized to the sender's length (torch.distributed needs the lengths to match beforehand).
/// Returns src; -1 on a rank outside the group, which receives nothing. A source must be
/// named (as torch.distributed 2.11's recv_object_list requires).
int recv_object_list(std::vector<Object>& object_list, std::optional<int> src = std::nullopt,
                     const ProcessGroupPtr& group = nullptr,
                     std::optional<int> group_src = std::nullopt);

}  // namespace tdist
