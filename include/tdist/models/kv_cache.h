#pragma once

// The keys and values of the positions a decoder has already seen, one pair per layer, so
// that generating a token runs the model over that token alone (transformers' DynamicCache).
//
//   tdist::models::KVCache cache;
//   auto logits = model->forward(prompt_ids, &cache);      // fills the cache
//   logits = model->forward(next_id.view({1, 1}), &cache);  // attends to the cached positions

#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tdist::models {

class KVCache {
 public:
  /// Positions cached so far (0 before the first forward).
  int64_t length() const { return length_; }
  /// Appends this forward's keys and values [B, Hkv, T, D] of `layer` and returns all of that
  /// layer's: [B, Hkv, length() + T, D]. The last layer's append advances length().
  std::pair<at::Tensor, at::Tensor> append(int64_t layer, const at::Tensor& keys,
                                           const at::Tensor& values, int64_t num_layers);
  /// Keeps the first `length` positions (transformers' DynamicCache.crop): a forward that
  /// ran over padding past its tokens forgets the padding's keys and values.
  void crop(int64_t length);
  /// Forgets every position (a new sequence).
  void clear();

 private:
  std::vector<at::Tensor> keys_, values_;
  int64_t length_ = 0;
};

}  // namespace tdist::models
