#include "tdist/tensor/placement.h"

#include <algorithm>
#include <cctype>

#include "tdist/error.h"

namespace tdist::tensor {

bool is_shard(const Placement& placement) {
  return std::holds_alternative<Shard>(placement);
}

bool is_shard(const Placement& placement, int64_t dim) {
  return is_shard(placement) && std::get<Shard>(placement).dim == dim;
}

bool is_replicate(const Placement& placement) {
  return std::holds_alternative<Replicate>(placement);
}

bool is_partial(const Placement& placement) {
  return std::holds_alternative<Partial>(placement);
}

int64_t shard_dim(const Placement& placement) {
  TDIST_CHECK_ARG(is_shard(placement), "tdist::tensor: " + to_string(placement) +
                                           " is not a Shard placement and splits no dimension");
  return std::get<Shard>(placement).dim;
}

std::string to_string(const Placement& placement) {
  if (const auto* s = std::get_if<Shard>(&placement)) {
    return "Shard(dim=" + std::to_string(s->dim) + ")";
  }
  if (const auto* p = std::get_if<Partial>(&placement)) {
    std::string op = tdist::to_string(p->reduce_op);
    std::transform(op.begin(), op.end(), op.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    return "Partial(" + op + ")";
  }
  return "Replicate()";
}

std::string to_string(const Placements& placements) {
  std::string text = "(";
  for (size_t i = 0; i < placements.size(); ++i) {
    text += (i ? ", " : "") + to_string(placements[i]);
  }
  return text + ")";
}

std::pair<int64_t, int64_t> local_shard_size_and_offset(int64_t size, int64_t num_chunks,
                                                        int64_t index) {
  TDIST_CHECK_ARG(num_chunks > 0 && index >= 0 && index < num_chunks && size >= 0,
                  "tdist::tensor: chunk " + std::to_string(index) + " of " +
                      std::to_string(num_chunks) + " of a dimension of size " +
                      std::to_string(size) + " does not exist");
  const int64_t chunk = (size + num_chunks - 1) / num_chunks;
  const int64_t begin = std::min(index * chunk, size);
  const int64_t end = std::min(begin + chunk, size);
  return {end - begin, begin};
}

Placements normalize_placements_for_grad(const Placements& placements) {
  Placements normalized;
  normalized.reserve(placements.size());
  for (const Placement& p : placements) {
    normalized.push_back(is_partial(p) ? Placement(Replicate()) : p);
  }
  return normalized;
}

}  // namespace tdist::tensor
