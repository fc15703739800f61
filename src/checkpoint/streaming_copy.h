#pragma once

// Copies into host memory that will next be read by another thread, not by this core.
//
// Note [Streaming staging copies]
// An asynchronous save stops training for exactly one thing: copying the state into staging
// buffers that the background writer reads later. A plain copy (memcpy, at::Tensor::copy_)
// first reads every destination cache line into the cache ("read for ownership") only to
// overwrite it, so it moves three bytes over the memory bus for each byte copied, and it
// evicts the training step's working set on the way. Non-temporal ("streaming") stores
// write whole lines around the cache: two bytes per byte, measured 22-24 ms -> 14-16 ms for
// 128 MiB on one core of the 2-core CI VM, which is the whole stall of a 256 MiB save at
// world 2. The stores are weakly ordered, so every thread that issued them fences (sfence)
// before the copy returns; the writer thread then starts or is woken through a mutex,
// which orders the fenced stores before its reads.

#include <ATen/core/Tensor.h>

#include <vector>

namespace tdist::checkpoint::detail {

enum class StreamingKind { kCopy, kAvx2, kAvx512 };

/// dst.copy_(src), with streaming stores where both are dense CPU tensors of the same dtype
/// and shape, large enough for the cache to be the wrong place for the result, and the CPU
/// has AVX2 or AVX-512; otherwise (CUDA sources, dtype changes, strided views, small tensors,
/// other CPUs) exactly dst.copy_(src).
void streaming_copy_(at::Tensor& dst, const at::Tensor& src);

/// The fastest kind this CPU runs: the one streaming_copy_(dst, src) uses.
StreamingKind best_streaming_kind();

/// Every kind this CPU runs (kCopy always), so that tests reach each.
std::vector<StreamingKind> available_streaming_kinds();

/// streaming_copy_ with the given kind, which must be available.
void streaming_copy_(at::Tensor& dst, const at::Tensor& src, StreamingKind kind);

const char* to_string(StreamingKind kind);

}  // namespace tdist::checkpoint::detail
