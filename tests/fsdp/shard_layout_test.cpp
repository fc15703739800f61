// Pure arithmetic of dim-0 sharding (Note [Dim-0 padding]).
#include <gtest/gtest.h>

#include "tdist/detail/fsdp/shard_layout.h"
#include "tdist/error.h"

namespace tdist::fsdp {
namespace {

// Reference: rank i owns rows [i*c, min((i+1)*c, d0)) with c = ceil(d0/world).
void expect_partition(const std::vector<int64_t>& shape, int world) {
  const int64_t d0 = shape.empty() ? 1 : shape[0];
  int64_t covered = 0;
  int64_t expected_rows = (d0 + world - 1) / world;
  for (int r = 0; r < world; ++r) {
    ShardLayout l = ShardLayout::compute(shape, world, r);
    EXPECT_EQ(l.shard_rows, expected_rows);
    EXPECT_EQ(l.row_offset, std::min(d0, r * expected_rows));
    EXPECT_GE(l.local_rows, 0);
    EXPECT_LE(l.local_rows, l.shard_rows);
    EXPECT_EQ(l.row_offset, covered)
        << "rank " << r << " must start where rank " << r - 1 << " ended";
    covered += l.local_rows;
    EXPECT_GE(l.padded_rows(), d0);
    EXPECT_LT(l.padded_rows() - d0, world);  // padding < one row per rank
    EXPECT_EQ(l.padded_shard_numel(), l.shard_rows * l.row_numel);
  }
  EXPECT_EQ(covered, d0);
}

TEST(ShardLayout, PartitionsEveryShape) {
  for (int world : {1, 2, 3, 4, 7}) {
    for (auto shape : std::vector<std::vector<int64_t>>{
             {7, 15}, {16, 16}, {1}, {5}, {3, 2, 4}, {64}, {0, 3}, {}, {2, 1}}) {
      SCOPED_TRACE(::testing::Message() << "world " << world << " dims " << shape.size());
      expect_partition(shape, world);
    }
  }
}

TEST(ShardLayout, SevenByFifteen) {
  // world 3: 3+3+1 rows; world 4: 2+2+2+1 rows.
  std::vector<int64_t> rows3, rows4;
  for (int r = 0; r < 3; ++r) rows3.push_back(ShardLayout::compute({7, 15}, 3, r).local_rows);
  for (int r = 0; r < 4; ++r) rows4.push_back(ShardLayout::compute({7, 15}, 4, r).local_rows);
  EXPECT_EQ(rows3, (std::vector<int64_t>{3, 3, 1}));
  EXPECT_EQ(rows4, (std::vector<int64_t>{2, 2, 2, 1}));
  ShardLayout l = ShardLayout::compute({7, 15}, 4, 3);
  EXPECT_EQ(l.row_numel, 15);
  EXPECT_EQ(l.padded_unsharded_shape(), (std::vector<int64_t>{8, 15}));
  EXPECT_EQ(l.local_shape(), (std::vector<int64_t>{1, 15}));
  EXPECT_EQ(l.padded_shard_shape(), (std::vector<int64_t>{2, 15}));
}

TEST(ShardLayout, MoreRanksThanRows) {
  // 2 rows over 4 ranks: ranks 2 and 3 own nothing but still carry one padded row.
  ShardLayout l3 = ShardLayout::compute({2, 5}, 4, 3);
  EXPECT_EQ(l3.local_rows, 0);
  EXPECT_EQ(l3.row_offset, 2);
  EXPECT_EQ(l3.padded_shard_numel(), 5);
}

// Note [Sharding on another dim]: the arithmetic of dim 0 on the moved shape.
TEST(ShardLayout, AnotherDimUsesTheMovedShape) {
  // [4, 7, 3] on dim 1 over 3 ranks: torch.chunk gives 3, 3, 1 slices.
  std::vector<int64_t> locals;
  for (int r = 0; r < 3; ++r) {
    ShardLayout l = ShardLayout::compute({4, 7, 3}, 3, r, 1);
    EXPECT_EQ(l.moved_shape(), (std::vector<int64_t>{7, 4, 3}));
    EXPECT_EQ(l.dim0, 7);
    EXPECT_EQ(l.row_numel, 12);
    EXPECT_EQ(l.shard_rows, 3);
    EXPECT_EQ(l.padded_shard_shape(), (std::vector<int64_t>{3, 4, 3}));
    EXPECT_EQ(l.param_local_shape(), (std::vector<int64_t>{4, l.local_rows, 3}));
    locals.push_back(l.local_rows);
  }
  EXPECT_EQ(locals, (std::vector<int64_t>{3, 3, 1}));
  EXPECT_THROW(ShardLayout::compute({4, 7}, 2, 0, 2), InvalidArgument);
  EXPECT_THROW(ShardLayout::compute({}, 2, 0, 1), InvalidArgument);
}

TEST(ShardLayout, RejectsBadArguments) {
  EXPECT_THROW(ShardLayout::compute({4}, 0, 0), InvalidArgument);
  EXPECT_THROW(ShardLayout::compute({4}, 2, 2), InvalidArgument);
  EXPECT_THROW(ShardLayout::compute({4}, 2, -1), InvalidArgument);
  EXPECT_THROW(ShardLayout::compute({-1, 3}, 2, 0), InvalidArgument);
}

}  // namespace
}  // namespace tdist::fsdp
