// ShardedParam and the flat all-gather layout without communication: every rank simulated in
// one process.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "fsdp/collectives.h"
#include "fsdp/sharded_param.h"
#include "tdist/detail/util/torch_compat.h"

namespace tdist::fsdp::detail {
namespace {

TEST(TorchCompat, FreeAndReallocateStorageInPlace) {
  auto t = torch::ones({4, 3});
  auto view = t.t();  // a view, like those autograd saves
  const void* impl = t.storage().unsafeGetStorageImpl();
  util::free_storage(t);
  EXPECT_EQ(util::storage_nbytes(t), 0u);
  EXPECT_EQ(util::storage_nbytes(view), 0u);
  util::allocate_storage(t, 12 * sizeof(float));
  EXPECT_EQ(t.storage().unsafeGetStorageImpl(), impl);
  t.fill_(2.0);
  EXPECT_EQ(view.sum().item<float>(), 24.0f) << "the view sees the new bytes";
}

TEST(ShardedParam, ShardsInPlaceAndRebuilds) {
  for (int world : {1, 2, 3, 4}) {
    SCOPED_TRACE(::testing::Message() << "world " << world);
    const auto full = torch::arange(7 * 15, torch::kFloat).view({7, 15});
    std::vector<at::Tensor> params;
    std::vector<std::unique_ptr<ShardedParam>> ranks;
    for (int r = 0; r < world; ++r) {
      params.push_back(full.clone().set_requires_grad(true));
      const c10::TensorImpl* impl = params.back().unsafeGetTensorImpl();
      ranks.push_back(std::make_unique<ShardedParam>("w", params.back(), world, r));
      const ShardLayout& l = ranks.back()->layout();
      EXPECT_EQ(params.back().unsafeGetTensorImpl(), impl) << "identity kept";
      EXPECT_EQ(params.back().sizes().vec(), l.local_shape());
      if (l.local_rows > 0) {
        EXPECT_TRUE(params.back().equal(full.narrow(0, l.row_offset, l.local_rows)));
      }
      EXPECT_EQ(ranks.back()->unsharded_nbytes(), 0u);
    }
    // Simulated all-gather: rank-major concatenation of the padded shards.
    std::vector<ShardedParam*> one = {ranks[0].get()};
    FlatLayout flat = FlatLayout::of(one);
    std::vector<at::Tensor> pieces;
    for (auto& r : ranks) pieces.push_back(r->padded_shard_flat());
    AllGatherResult result;
    result.output = torch::cat(pieces);
    result.world = world;
    ranks[0]->alloc_unsharded();
    foreach_all_gather_copy_out(result, one, flat);
    ranks[0]->use_unsharded();
    EXPECT_TRUE(params[0].equal(full)) << "unsharded data equals the original";
    ranks[0]->use_sharded();
    ranks[0]->free_unsharded();
    EXPECT_EQ(ranks[0]->unsharded_nbytes(), 0u);
    EXPECT_EQ(params[0].size(0), ranks[0]->layout().local_rows);
  }
}

TEST(ShardedParam, GradientStashAndAccumulate) {
  auto p = torch::ones({5, 2}).set_requires_grad(true);
  ShardedParam sp("w", p, 2, 0);  // owns rows 0..2
  p.mutable_grad() = torch::full({3, 2}, 1.0);
  sp.stash_sharded_grad();
  EXPECT_FALSE(p.grad().defined());
  sp.accumulate_sharded_grad(torch::full({3, 2}, 2.0));
  EXPECT_TRUE(p.grad().equal(torch::full({3, 2}, 3.0)));
}

}  // namespace
}  // namespace tdist::fsdp::detail
