#include "tdist/models/kv_cache.h"

#include <ATen/ATen.h>

#include "tdist/error.h"

namespace tdist::models {

std::pair<at::Tensor, at::Tensor> KVCache::append(int64_t layer, const at::Tensor& keys,
                                                  const at::Tensor& values, int64_t num_layers) {
  TDIST_CHECK_ARG(layer >= 0 && layer < num_layers, "KVCache: layer " + std::to_string(layer) +
                                                        " outside [0, " +
                                                        std::to_string(num_layers) + ")");
  if (keys_.empty()) {
    keys_.resize(static_cast<size_t>(num_layers));
    values_.resize(static_cast<size_t>(num_layers));
  }
  TDIST_CHECK_ARG(static_cast<int64_t>(keys_.size()) == num_layers,
                  "KVCache: filled by a model of " + std::to_string(keys_.size()) +
                      " layers, used with one of " + std::to_string(num_layers) +
                      "; use one cache per model (or clear() it)");
  auto& k = keys_[static_cast<size_t>(layer)];
  auto& v = values_[static_cast<size_t>(layer)];
  k = k.defined() ? at::cat({k, keys}, 2) : keys;
  v = v.defined() ? at::cat({v, values}, 2) : values;
  if (layer == num_layers - 1) length_ = k.size(2);
  return {k, v};
}

void KVCache::crop(int64_t length) {
  TDIST_CHECK_ARG(length >= 0 && length <= length_, "KVCache::crop: " + std::to_string(length) +
                                                        " positions of " + std::to_string(length_) +
                                                        " cached");
  for (auto* tensors : {&keys_, &values_}) {
    for (at::Tensor& t : *tensors) {
      if (t.defined()) t = t.narrow(2, 0, length);
    }
  }
  length_ = length;
}

void KVCache::clear() {
  keys_.clear();
  values_.clear();
  length_ = 0;
}

}  // namespace tdist::models
