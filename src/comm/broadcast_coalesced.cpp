#include "tdist/comm/broadcast_coalesced.h"

#include <algorithm>
#include <string>
#include <utility>

#include <ATen/ATen.h>

#include "comm/state.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"

namespace tdist {

namespace {

struct OpenBucket {
  at::ScalarType dtype;
  c10::Device device;
  std::vector<size_t> members;
  int64_t bytes = 0;
};

int64_t bytes_of(const at::Tensor& t) {
  return t.numel() * static_cast<int64_t>(t.element_size());
}

}  // namespace

std::vector<std::vector<size_t>> plan_broadcast_buckets(const std::vector<at::Tensor>& tensors,
                                                        int64_t bucket_bytes) {
  TDIST_CHECK_ARG(bucket_bytes > 0, "broadcast_coalesced: bucket_bytes " +
                                        std::to_string(bucket_bytes) + " must be positive");
  std::vector<std::vector<size_t>> plan;
  // One open bucket per kind, kept in the order first seen: the order the leftovers go in
  // then depends on the dtypes' order only, the same on every rank.
  std::vector<OpenBucket> open;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    TDIST_CHECK_ARG(t.defined(),
                    "broadcast_coalesced: tensor " + std::to_string(i) + " is undefined");
    auto it = std::find_if(open.begin(), open.end(), [&](const OpenBucket& b) {
      return b.dtype == t.scalar_type() && b.device == t.device();
    });
    if (it == open.end())
      it = open.insert(open.end(), OpenBucket{t.scalar_type(), t.device(), {}, 0});
    if (!it->members.empty() && it->bytes + bytes_of(t) > bucket_bytes) {
      plan.push_back(std::exchange(it->members, {}));
      it->bytes = 0;
    }
    it->members.push_back(i);
    it->bytes += bytes_of(t);
  }
  for (auto& b : open) {
    if (!b.members.empty()) plan.push_back(std::move(b.members));
  }
  return plan;
}

void broadcast_coalesced(const std::vector<at::Tensor>& tensors, int src,
                         const ProcessGroupPtr& group, int64_t bucket_bytes) {
  auto pg = detail::resolve_group(group, "broadcast_coalesced");
  const auto plan = plan_broadcast_buckets(tensors, bucket_bytes);
  if (!pg->is_member() || pg->size() == 1) return;
  at::NoGradGuard no_grad;
  for (const auto& bucket : plan) {
    std::vector<at::Tensor> parts;
    parts.reserve(bucket.size());
    for (size_t i : bucket) parts.push_back(tensors[i].reshape({-1}));
    at::Tensor flat = parts.size() == 1 ? parts.front().contiguous() : at::cat(parts);
    // A single contiguous tensor is sent in place; anything else through `flat`.
    broadcast(flat, src, pg);
    int64_t offset = 0;
    for (size_t i : bucket) {
      const at::Tensor& t = tensors[i];
      if (!flat.is_alias_of(t)) t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

}  // namespace tdist
