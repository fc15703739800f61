#include "mesh/gather_strings.h"

#include <cstring>

#include <ATen/ATen.h>

#include "tdist/comm/distributed.h"

namespace tdist::mesh::detail {

std::vector<std::string> all_gather_strings(const std::string& value,
                                            const ProcessGroupPtr& group) {
  const int world = get_world_size(group);
  if (world == 1) return {value};
  // Two rounds: the lengths, then the bytes padded to the longest.
  at::Tensor length = at::full({1}, static_cast<int64_t>(value.size()), at::kLong);
  std::vector<at::Tensor> lengths;
  for (int r = 0; r < world; ++r) lengths.push_back(at::empty({1}, at::kLong));
  all_gather(lengths, length, group);
  int64_t max_len = 1;
  for (const auto& l : lengths) max_len = std::max(max_len, l.item<int64_t>());

  at::Tensor bytes = at::zeros({max_len}, at::kByte);
  if (!value.empty()) std::memcpy(bytes.data_ptr<uint8_t>(), value.data(), value.size());
  std::vector<at::Tensor> gathered;
  for (int r = 0; r < world; ++r) gathered.push_back(at::empty({max_len}, at::kByte));
  all_gather(gathered, bytes, group);

  std::vector<std::string> out;
  out.reserve(world);
  for (int r = 0; r < world; ++r) {
    const auto* p = reinterpret_cast<const char*>(gathered[r].data_ptr<uint8_t>());
    out.emplace_back(p, static_cast<size_t>(lengths[r].item<int64_t>()));
  }
  return out;
}

int first_mismatch(const std::vector<std::string>& values) {
  for (size_t r = 1; r < values.size(); ++r) {
    if (values[r] != values[0]) return static_cast<int>(r);
  }
  return -1;
}

}  // namespace tdist::mesh::detail
