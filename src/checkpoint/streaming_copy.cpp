#include "checkpoint/streaming_copy.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tdist::checkpoint::detail {
namespace {

/// Below this the destination fits the caches and a plain copy is as fast.
constexpr int64_t kMinStreamingBytes = int64_t{1} << 20;
/// Each intra-op task copies this much, so the tasks start on whole cache lines.
constexpr int64_t kChunkBytes = int64_t{256} << 10;
constexpr uintptr_t kLine = 64;

using CopyFn = void (*)(char* dst, const char* src, size_t n);

#if defined(__x86_64__)
/// Bytes up to dst's next cache line, copied plainly so the streaming stores are aligned.
size_t head_bytes(const char* dst, size_t n) {
  const size_t head = (kLine - reinterpret_cast<uintptr_t>(dst) % kLine) % kLine;
  return head < n ? head : n;
}

__attribute__((target("avx512f"))) void copy_avx512(char* dst, const char* src, size_t n) {
  const size_t head = head_bytes(dst, n);
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + 4 * kLine <= n; i += 4 * kLine) {
    const __m512i a = _mm512_loadu_si512(src + i);
    const __m512i b = _mm512_loadu_si512(src + i + kLine);
    const __m512i c = _mm512_loadu_si512(src + i + 2 * kLine);
    const __m512i d = _mm512_loadu_si512(src + i + 3 * kLine);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), a);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i + kLine), b);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i + 2 * kLine), c);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i + 3 * kLine), d);
  }
  _mm_sfence();
  std::memcpy(dst + i, src + i, n - i);
}

__attribute__((target("avx2"))) void copy_avx2(char* dst, const char* src, size_t n) {
  const size_t head = head_bytes(dst, n);
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + 2 * kLine <= n; i += 2 * kLine) {
    __m256i v[4];
    for (int k = 0; k < 4; ++k)
      v[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32 * k));
    for (int k = 0; k < 4; ++k)
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32 * k), v[k]);
  }
  _mm_sfence();
  std::memcpy(dst + i, src + i, n - i);
}
#endif

bool cpu_runs(StreamingKind kind) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (kind == StreamingKind::kAvx512) return __builtin_cpu_supports("avx512f");
  if (kind == StreamingKind::kAvx2) return __builtin_cpu_supports("avx2");
#endif
  return kind == StreamingKind::kCopy;
}

CopyFn copy_fn(StreamingKind kind) {
#if defined(__x86_64__)
  if (kind == StreamingKind::kAvx512) return copy_avx512;
  if (kind == StreamingKind::kAvx2) return copy_avx2;
#endif
  return nullptr;
}

bool streams(const at::Tensor& dst, const at::Tensor& src) {
  return dst.device().is_cpu() && src.device().is_cpu() && dst.scalar_type() == src.scalar_type() &&
         dst.sizes() == src.sizes() && dst.is_contiguous() && src.is_contiguous() &&
         !src.is_conj() && !src.is_neg() && src.layout() == at::kStrided &&
         dst.layout() == at::kStrided && static_cast<int64_t>(src.nbytes()) >= kMinStreamingBytes;
}

}  // namespace

StreamingKind best_streaming_kind() {
  static const StreamingKind best = available_streaming_kinds().back();
  return best;
}

std::vector<StreamingKind> available_streaming_kinds() {
  std::vector<StreamingKind> kinds;
  for (const auto kind : {StreamingKind::kCopy, StreamingKind::kAvx2, StreamingKind::kAvx512})
    if (cpu_runs(kind)) kinds.push_back(kind);
  return kinds;
}

void streaming_copy_(at::Tensor& dst, const at::Tensor& src) {
  streaming_copy_(dst, src, best_streaming_kind());
}

void streaming_copy_(at::Tensor& dst, const at::Tensor& src, StreamingKind kind) {
  TORCH_CHECK(cpu_runs(kind), "streaming_copy_: this CPU does not run ", to_string(kind));
  const CopyFn copy = copy_fn(kind);
  if (copy == nullptr || !streams(dst, src)) {
    dst.copy_(src);
    return;
  }
  auto* out = static_cast<char*>(dst.data_ptr());
  const auto* in = static_cast<const char*>(src.const_data_ptr());
  const int64_t bytes = static_cast<int64_t>(src.nbytes());
  const int64_t chunks = (bytes + kChunkBytes - 1) / kChunkBytes;
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    const int64_t from = begin * kChunkBytes;
    const int64_t to = std::min(end * kChunkBytes, bytes);
    copy(out + from, in + from, static_cast<size_t>(to - from));
  });
}

const char* to_string(StreamingKind kind) {
  switch (kind) {
    case StreamingKind::kAvx512:
      return "avx512";
    case StreamingKind::kAvx2:
      return "avx2";
    case StreamingKind::kCopy:
      break;
  }
  return "copy_";
}

}  // namespace tdist::checkpoint::detail
