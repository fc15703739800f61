#include "gloo/ring.h"

#include <algorithm>
#include <cstring>
#include <memory>

namespace tdist::detail {

namespace {

int mod(int a, int n) {
  return ((a % n) + n) % n;
}

// Segment j of a chunk of `total` units, segments of `seg` units: [begin, begin + len).
struct Segment {
  size_t begin;
  size_t len;
};
Segment segment(size_t total, size_t seg, size_t j) {
  size_t begin = std::min(total, j * seg);
  return {begin, std::min(seg, total - begin)};
}

}  // namespace

std::vector<size_t> even_chunks(size_t numel, int n) {
  std::vector<size_t> out(n, numel / n);
  for (size_t i = 0; i < numel % n; ++i) out[i]++;
  return out;
}

void ring_reduce_scatter(Exchange& ex, const std::vector<const char*>& src,
                         const std::vector<char*>& dst, const std::vector<size_t>& numel,
                         size_t esz, const ReduceFn& reduce, uint64_t key_base) {
  const int n = ex.size();
  const int r = ex.rank();
  if (n == 1) {
    if (dst[0] != src[0]) std::memmove(dst[0], src[0], numel[0] * esz);
    return;
  }
  const int right = mod(r + 1, n);
  const int left = mod(r - 1, n);
  const int channels = ex.comm().channels();
  const size_t seg = std::max<size_t>(1, ex.comm().segment_bytes() / esz);
  const size_t max_chunk = *std::max_element(numel.begin(), numel.end());
  const size_t nseg = std::max<size_t>(1, (max_chunk + seg - 1) / seg);
  const int steps = n - 1;

  char* tmp[2] = {ex.comm().scratch(0, max_chunk * esz), ex.comm().scratch(1, max_chunk * esz)};
  auto sent_chunk = [&](int s) { return mod(r - s - 1, n); };
  auto recv_chunk = [&](int s) { return mod(r - s - 2, n); };
  // Where step s writes its partial sum (the chunk step s+1 sends).
  auto uses_scratch = [&](int s) { return s < steps - 1 && dst[recv_chunk(s)] == nullptr; };
  auto out_of = [&](int s) -> char* {
    if (!uses_scratch(s)) return dst[recv_chunk(s)];
    return ex.comm().scratch(2 + s % 2, max_chunk * esz);
  };
  auto key = [&](int s, size_t j) { return key_base + static_cast<uint64_t>(s) * nseg + j; };

  std::vector<std::vector<size_t>> recv_h(steps, std::vector<size_t>(nseg));
  std::vector<std::vector<size_t>> send_h(steps, std::vector<size_t>(nseg));
  auto post_recv = [&](int s, size_t j) {
    Segment g = segment(numel[recv_chunk(s)], seg, j);
    recv_h[s][j] = ex.post_recv(left, tmp[s % 2] + g.begin * esz, g.len * esz, key(s, j),
                                static_cast<int>(j % channels));
  };
  auto post_send = [&](int s, size_t j, const char* from) {
    Segment g = segment(numel[sent_chunk(s)], seg, j);
    send_h[s][j] = ex.post_send(right, from + g.begin * esz, g.len * esz, key(s, j),
                                static_cast<int>(j % channels));
  };

  for (size_t j = 0; j < nseg; ++j) post_recv(0, j);
  for (size_t j = 0; j < nseg; ++j) post_send(0, j, src[sent_chunk(0)]);
  for (int s = 0; s < steps; ++s) {
    char* out = out_of(s);
    const int c = recv_chunk(s);
    for (size_t j = 0; j < nseg; ++j) {
      if (s + 1 < steps) post_recv(s + 1, j);
      ex.wait(recv_h[s][j]);
      // scratch[s % 2] was sent at step s - 1; that send must be done before overwriting.
      if (uses_scratch(s) && s >= 2 && uses_scratch(s - 2)) ex.wait(send_h[s - 1][j]);
      Segment g = segment(numel[c], seg, j);
      reduce(out + g.begin * esz, src[c] + g.begin * esz, tmp[s % 2] + g.begin * esz, g.len);
      if (s + 1 < steps) post_send(s + 1, j, out);
    }
  }
  ex.wait_all();
}

void ring_all_gather(Exchange& ex, const std::vector<char*>& chunk,
                     const std::vector<size_t>& bytes, uint64_t key_base) {
  const int n = ex.size();
  const int r = ex.rank();
  if (n == 1) return;
  const int right = mod(r + 1, n);
  const int left = mod(r - 1, n);
  const int channels = ex.comm().channels();
  const size_t seg = ex.comm().segment_bytes();
  const size_t max_chunk = *std::max_element(bytes.begin(), bytes.end());
  const size_t nseg = std::max<size_t>(1, (max_chunk + seg - 1) / seg);
  const int steps = n - 1;
  auto sent_chunk = [&](int s) { return mod(r - s, n); };
  auto recv_chunk = [&](int s) { return mod(r - s - 1, n); };
  auto key = [&](int s, size_t j) { return key_base + static_cast<uint64_t>(s) * nseg + j; };

  std::vector<std::vector<size_t>> recv_h(steps, std::vector<size_t>(nseg));
  for (int s = 0; s < steps; ++s) {
    const int c = recv_chunk(s);
    for (size_t j = 0; j < nseg; ++j) {
      Segment g = segment(bytes[c], seg, j);
      recv_h[s][j] =
          ex.post_recv(left, chunk[c] + g.begin, g.len, key(s, j), static_cast<int>(j % channels));
    }
  }
  auto post_send = [&](int s, size_t j) {
    const int c = sent_chunk(s);
    Segment g = segment(bytes[c], seg, j);
    ex.post_send(right, chunk[c] + g.begin, g.len, key(s, j), static_cast<int>(j % channels));
  };
  for (size_t j = 0; j < nseg; ++j) post_send(0, j);
  for (int s = 0; s < steps; ++s) {
    for (size_t j = 0; j < nseg; ++j) {
      ex.wait(recv_h[s][j]);
      if (s + 1 < steps) post_send(s + 1, j);
    }
  }
  ex.wait_all();
}

void chain_broadcast(Exchange& ex, char* data, size_t bytes, int root, uint64_t key_base) {
  const int n = ex.size();
  const int r = ex.rank();
  if (n == 1) return;
  const int pos = mod(r - root, n);
  const int prev = mod(r - 1, n);
  const int next = mod(r + 1, n);
  const bool forwards = pos < n - 1;
  const int channels = ex.comm().channels();
  const size_t seg = ex.comm().segment_bytes();
  const size_t nseg = std::max<size_t>(1, (bytes + seg - 1) / seg);
  if (pos == 0) {
    for (size_t j = 0; j < nseg; ++j) {
      Segment g = segment(bytes, seg, j);
      ex.post_send(next, data + g.begin, g.len, key_base + j, static_cast<int>(j % channels));
    }
  } else {
    std::vector<size_t> recv_h(nseg);
    for (size_t j = 0; j < nseg; ++j) {
      Segment g = segment(bytes, seg, j);
      recv_h[j] =
          ex.post_recv(prev, data + g.begin, g.len, key_base + j, static_cast<int>(j % channels));
    }
    for (size_t j = 0; j < nseg; ++j) {
      ex.wait(recv_h[j]);
      if (forwards) {
        Segment g = segment(bytes, seg, j);
        ex.post_send(next, data + g.begin, g.len, key_base + j, static_cast<int>(j % channels));
      }
    }
  }
  ex.wait_all();
}

}  // namespace tdist::detail
