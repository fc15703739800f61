// Object collectives: serialize (object.h), exchange sizes, then exchange padded byte
// tensors through the ordinary tensor collectives: on the CPU when the group has a CPU
// backend, else (a group of nccl alone, as c10d) on this rank's current CUDA device.

#include "tdist/comm/object_collectives.h"

#include <cstring>

#include <torch/torch.h>

#include "comm/collective_call.h"
#include "comm/state.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"

namespace tdist {

namespace {

at::Tensor to_bytes_tensor(const std::vector<uint8_t>& bytes, int64_t padded,
                           const c10::Device& device) {
  at::Tensor t = torch::zeros({std::max<int64_t>(padded, 1)}, torch::kUInt8);
  if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t.to(device);
}

at::Tensor empty_on(at::IntArrayRef sizes, at::ScalarType type, const c10::Device& device) {
  return torch::empty(sizes, torch::TensorOptions().dtype(type).device(device));
}

at::Tensor int64_on(int64_t value, const c10::Device& device) {
  return torch::tensor({value}, torch::kInt64).to(device);
}

Object from_bytes_tensor(const at::Tensor& t, int64_t size, const std::string& op, int from) {
  if (size < 0 || size > t.numel()) {
    TDIST_THROW(InvalidArgument, op + ": global rank " + std::to_string(from) +
                                     " reported an object of " + std::to_string(size) +
                                     " bytes, which does not fit the exchanged buffer");
  }
  try {
    const at::Tensor host = t.cpu().contiguous();
    return deserialize_object(host.data_ptr<uint8_t>(), static_cast<size_t>(size));
  } catch (const InvalidArgument& e) {
    TDIST_THROW(InvalidArgument, op + ": the object from global rank " + std::to_string(from) +
                                     " is corrupt: " + e.what());
  }
}

/// All members learn every member's byte count (exchanged on `device`, the group's default device).
std::vector<int64_t> all_gather_sizes(int64_t mine, const ProcessGroupPtr& pg,
                                      const c10::Device& device) {
  at::Tensor in = int64_on(mine, device);
  at::Tensor out = empty_on({pg->size()}, torch::kInt64, device);
  all_gather_into_tensor(out, in, pg);
  out = out.cpu();
  auto* p = out.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + pg->size());
}

}  // namespace

void send_object_list(const std::vector<Object>& object_list, std::optional<int> dst,
                      const ProcessGroupPtr& group, std::optional<int> group_dst) {
  const detail::Call c(group, "send_object_list");
  const int peer = c.root_of(dst, group_dst, "dst", "group_dst");
  const ProcessGroupPtr& pg = c.pg;
  if (!pg->is_member()) return;
  const std::vector<uint8_t> bytes = serialize_object(Object(object_list));
  const c10::Device device = pg->default_device();
  const auto size = static_cast<int64_t>(bytes.size());
  send(int64_on(size, device), std::nullopt, pg, 0, peer);
  send(to_bytes_tensor(bytes, size, device), std::nullopt, pg, 0, peer);
}

int recv_object_list(std::vector<Object>& object_list, std::optional<int> src,
                     const ProcessGroupPtr& group, std::optional<int> group_src) {
  const detail::Call c(group, "recv_object_list");
  // As torch.distributed 2.11's recv_object_list: a named source, in either form.
  const int peer = c.root_of(src, group_src, "src", "group_src");
  const ProcessGroupPtr& pg = c.pg;
  if (!pg->is_member()) return -1;
  const int from = pg->global_rank(peer);
  const c10::Device device = pg->default_device();
  at::Tensor size = empty_on({1}, torch::kInt64, device);
  recv(size, std::nullopt, pg, 0, peer);
  const int64_t n = size.item<int64_t>();
  TDIST_CHECK_ARG(n >= 0, "recv_object_list: global rank " + std::to_string(from) + " announced " +
                              std::to_string(n) + " bytes; was its send a send_object_list?");
  at::Tensor data = empty_on({std::max<int64_t>(n, 1)}, torch::kUInt8, device);
  recv(data, std::nullopt, pg, 0, peer);
  object_list = from_bytes_tensor(data, n, "recv_object_list", from).as_list();
  return from;
}

void broadcast_object_list(std::vector<Object>& object_list, std::optional<int> src,
                           const ProcessGroupPtr& group, std::optional<int> group_src) {
  const detail::Call c(group, "broadcast_object_list");
  const int root = c.root_of(src, group_src, "src", "group_src", /*fallback=*/0);
  const ProcessGroupPtr& pg = c.pg;
  if (!pg->is_member()) return;
  const bool is_src = pg->rank() == root;
  std::vector<uint8_t> bytes;
  if (is_src) bytes = serialize_object(Object(object_list));
  const c10::Device device = pg->default_device();
  at::Tensor size = int64_on(static_cast<int64_t>(bytes.size()), device);
  broadcast(size, std::nullopt, pg, false, root);
  const int64_t n = size.item<int64_t>();
  at::Tensor data = is_src ? to_bytes_tensor(bytes, n, device)
                           : empty_on({std::max<int64_t>(n, 1)}, torch::kUInt8, device);
  broadcast(data, std::nullopt, pg, false, root);
  if (is_src) return;
  object_list =
      from_bytes_tensor(data, n, "broadcast_object_list", pg->global_rank(root)).as_list();
}

void all_gather_object(std::vector<Object>& object_list, const Object& obj,
                       const ProcessGroupPtr& group) {
  auto pg = detail::resolve_group(group, "all_gather_object");
  if (!pg->is_member()) return;
  auto bytes = serialize_object(obj);
  const c10::Device device = pg->default_device();
  auto sizes = all_gather_sizes(static_cast<int64_t>(bytes.size()), pg, device);
  int64_t max_size = *std::max_element(sizes.begin(), sizes.end());
  at::Tensor in = to_bytes_tensor(bytes, max_size, device);
  at::Tensor out = empty_on({pg->size(), in.numel()}, torch::kUInt8, device);
  all_gather_into_tensor(out, in, pg);
  out = out.cpu();
  std::vector<Object> result;
  for (int r = 0; r < pg->size(); ++r) {
    result.push_back(from_bytes_tensor(out[r], sizes[r], "all_gather_object", pg->global_rank(r)));
  }
  object_list = std::move(result);
}

void gather_object(const Object& obj, std::vector<Object>* object_gather_list,
                   std::optional<int> dst, const ProcessGroupPtr& group,
                   std::optional<int> group_dst) {
  const detail::Call c(group, "gather_object");
  const int root = c.root_of(dst, group_dst, "dst", "group_dst", /*fallback=*/0);
  const ProcessGroupPtr& pg = c.pg;
  if (!pg->is_member()) return;
  const bool is_dst = root == pg->rank();
  TDIST_CHECK_ARG(!is_dst || object_gather_list != nullptr,
                  "gather_object: global rank " + std::to_string(pg->global_rank(root)) +
                      " is the destination and must pass an object_gather_list");
  auto bytes = serialize_object(obj);
  const c10::Device device = pg->default_device();
  auto sizes = all_gather_sizes(static_cast<int64_t>(bytes.size()), pg, device);
  int64_t max_size = *std::max_element(sizes.begin(), sizes.end());
  at::Tensor in = to_bytes_tensor(bytes, max_size, device);
  std::vector<at::Tensor> outputs;
  if (is_dst) {
    for (int r = 0; r < pg->size(); ++r) outputs.push_back(torch::empty_like(in));
  }
  gather(in, outputs, std::nullopt, pg, false, root);
  if (!is_dst) return;
  std::vector<Object> result;
  for (int r = 0; r < pg->size(); ++r) {
    result.push_back(from_bytes_tensor(outputs[r], sizes[r], "gather_object", pg->global_rank(r)));
  }
  *object_gather_list = std::move(result);
}

void scatter_object_list(std::vector<Object>& scatter_object_output_list,
                         const std::vector<Object>& scatter_object_input_list,
                         std::optional<int> src, const ProcessGroupPtr& group,
                         std::optional<int> group_src) {
  const detail::Call c(group, "scatter_object_list");
  const int root = c.root_of(src, group_src, "src", "group_src", /*fallback=*/0);
  const ProcessGroupPtr& pg = c.pg;
  if (!pg->is_member()) return;
  const bool is_src = root == pg->rank();
  const int src_rank = pg->global_rank(root);
  std::vector<std::vector<uint8_t>> parts;
  int64_t max_size = 0;
  if (is_src) {
    TDIST_CHECK_ARG(static_cast<int>(scatter_object_input_list.size()) == pg->size(),
                    "scatter_object_list: src rank " + std::to_string(src_rank) + " gave " +
                        std::to_string(scatter_object_input_list.size()) +
                        " objects but the group has " + std::to_string(pg->size()) + " ranks");
    for (const auto& obj : scatter_object_input_list) {
      parts.push_back(serialize_object(obj));
      max_size = std::max<int64_t>(max_size, parts.back().size());
    }
  }
  const c10::Device device = pg->default_device();
  at::Tensor max_t = int64_on(max_size, device);
  broadcast(max_t, std::nullopt, pg, false, root);
  max_size = max_t.item<int64_t>();
  std::vector<at::Tensor> data_in, size_in;
  if (is_src) {
    for (const auto& bytes : parts) {
      data_in.push_back(to_bytes_tensor(bytes, max_size, device));
      size_in.push_back(int64_on(static_cast<int64_t>(bytes.size()), device));
    }
  }
  at::Tensor data = empty_on({std::max<int64_t>(max_size, 1)}, torch::kUInt8, device);
  at::Tensor size = empty_on({1}, torch::kInt64, device);
  scatter(size, size_in, std::nullopt, pg, false, root);
  scatter(data, data_in, std::nullopt, pg, false, root);
  if (scatter_object_output_list.empty()) scatter_object_output_list.resize(1);
  scatter_object_output_list[0] =
      from_bytes_tensor(data, size.item<int64_t>(), "scatter_object_list", src_rank);
}

}  // namespace tdist
