#include "tdist/ddp/comm_hooks.h"

#include <ATen/ATen.h>

#include "tdist/comm/distributed.h"

namespace tdist::ddp {

namespace {

/// All-reduces `bucket` cast to `dtype` (divided first, as PyTorch's hooks do, so that the
/// sum stays in range), then casts the result back into the bucket's buffer.
CommHookFuture compress_hook(GradBucket& bucket, at::ScalarType dtype) {
  const at::Tensor buffer = bucket.buffer();
  const auto& group = bucket.process_group();
  at::Tensor compressed = buffer.to(dtype).div_(group->size());
  WorkPtr work = all_reduce(compressed, ReduceOp::SUM, group, /*async_op=*/true);
  return CommHookFuture(std::move(work), [buffer, compressed]() {
    buffer.copy_(compressed);
    return buffer;
  });
}

}  // namespace

CommHookFuture CommHookFuture::ready(at::Tensor value) {
  return CommHookFuture(nullptr, [value = std::move(value)]() { return value; });
}

at::Tensor CommHookFuture::wait(std::chrono::milliseconds timeout) {
  if (work_) work_->wait(timeout);
  return then_();
}

CommHookFuture allreduce_hook(GradBucket& bucket) {
  at::Tensor buffer = bucket.buffer();
  const auto& group = bucket.process_group();
  buffer.div_(group->size());
  WorkPtr work = all_reduce(buffer, ReduceOp::SUM, group, /*async_op=*/true);
  return CommHookFuture(std::move(work), [buffer]() { return buffer; });
}

CommHookFuture fp16_compress_hook(GradBucket& bucket) {
  return compress_hook(bucket, at::kHalf);
}

CommHookFuture bf16_compress_hook(GradBucket& bucket) {
  return compress_hook(bucket, at::kBFloat16);
}

}  // namespace tdist::ddp
