// The buffer pool's idle cache and the TDIST_FSDP_PERSISTENT_BUFFERS and
// TDIST_FSDP_SYMMETRIC switches, without communication.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include <ATen/ATen.h>

#include "fsdp/buffer_pool.h"
#include "fsdp/environment.h"
#include "support/scoped_env.h"
#include "tdist/comm/symmetric_memory.h"
#include "tdist/error.h"

namespace tdist::fsdp::detail {
namespace {

using tdist::testing::expect_env_value_rejected;
using tdist::testing::ScopedEnv;

bool persistent_buffers_from_env() {
  return FSDPEnvironment::from_env().persistent_buffers;
}
bool symmetric_buffers_from_env() {
  return FSDPEnvironment::from_env().symmetric_buffers;
}

TEST(PersistentBuffers, OnByDefaultOffWithZeroAndAnythingElseRaises) {
  {
    ScopedEnv on("TDIST_FSDP_PERSISTENT_BUFFERS", "1");
    EXPECT_TRUE(persistent_buffers_from_env());
  }
  {
    ScopedEnv off("TDIST_FSDP_PERSISTENT_BUFFERS", "0");
    EXPECT_FALSE(persistent_buffers_from_env());
  }
  expect_env_value_rejected("TDIST_FSDP_PERSISTENT_BUFFERS", "yes", persistent_buffers_from_env);
  if (std::getenv("TDIST_FSDP_PERSISTENT_BUFFERS") == nullptr) {
    EXPECT_TRUE(persistent_buffers_from_env());
  }
}

// Released blocks are reused (same memory back) while the idle bytes stay within
// max(kIdleBlocks times the largest request, kIdleFloorBytes); beyond that they are freed,
// oldest first.
TEST(BufferPool, ReusesReleasedBlocksAndCapsTheIdleBytes) {
  BufferPool pool;
  const c10::Device cpu(c10::kCPU);
  const size_t small = 1 << 20;
  PooledBlock a = pool.acquire(small, cpu);
  void* a_ptr = a.data.get();
  pool.release(std::move(a));
  EXPECT_EQ(pool.idle_bytes(), small);
  PooledBlock again = pool.acquire(small / 2, cpu);  // best fit: the idle block
  EXPECT_EQ(again.data.get(), a_ptr);
  EXPECT_EQ(pool.idle_bytes(), 0u);

  // Small blocks: all of them stay idle, under the floor.
  std::vector<PooledBlock> held;
  held.push_back(std::move(again));
  for (size_t i = 0; i < BufferPool::kIdleBlocks + 2; ++i) held.push_back(pool.acquire(small, cpu));
  for (auto& block : held) pool.release(std::move(block));
  held.clear();
  const size_t kept_small = (BufferPool::kIdleBlocks + 3) * small;
  ASSERT_LT(kept_small, BufferPool::kIdleFloorBytes);
  EXPECT_EQ(pool.idle_bytes(), kept_small);

  // Large blocks: kIdleBlocks of them stay (the small ones, oldest, go first).
  const size_t large = BufferPool::kIdleFloorBytes * 3 / 4;
  for (size_t i = 0; i < BufferPool::kIdleBlocks + 1; ++i) held.push_back(pool.acquire(large, cpu));
  for (auto& block : held) pool.release(std::move(block));
  EXPECT_EQ(pool.idle_bytes(), BufferPool::kIdleBlocks * large);
}

// Blocks asked for in symmetric memory are, others are not, and the idle cache never hands
// one kind out for the other (ranks must agree on the kind of every collective's buffers).
TEST(SymmetricBlocks, TheKindAskedForAndNeverTheOther) {
  if (!symmetric_memory::is_available()) GTEST_SKIP() << "no POSIX shared memory here";
  BufferPool pool;
  const c10::Device cpu(c10::kCPU);
  const size_t n = 1 << 16;
  auto in_symmetric_memory = [](const PooledBlock& block) {
    return symmetric_memory::is_symmetric(
        at::from_blob(block.data.get(), {static_cast<int64_t>(block.capacity)}, at::kByte));
  };
  PooledBlock sym = pool.acquire(n, cpu, /*symmetric=*/true);
  EXPECT_TRUE(sym.symmetric);
  EXPECT_TRUE(in_symmetric_memory(sym));
  PooledBlock plain = pool.acquire(n, cpu, /*symmetric=*/false);
  EXPECT_FALSE(plain.symmetric);
  EXPECT_FALSE(in_symmetric_memory(plain));
  void* sym_ptr = sym.data.get();
  pool.release(std::move(sym));
  PooledBlock other = pool.acquire(n, cpu, /*symmetric=*/false);  // not the idle symmetric one
  EXPECT_NE(other.data.get(), sym_ptr);
  EXPECT_FALSE(in_symmetric_memory(other));
  PooledBlock again = pool.acquire(n, cpu, /*symmetric=*/true);
  EXPECT_EQ(again.data.get(), sym_ptr);
}

TEST(SymmetricBlocks, SwitchOnByDefaultOffWithZeroAndAnythingElseRaises) {
  {
    ScopedEnv on("TDIST_FSDP_SYMMETRIC", "1");
    EXPECT_EQ(symmetric_buffers_from_env(), symmetric_memory::is_available());
  }
  {
    ScopedEnv off("TDIST_FSDP_SYMMETRIC", "0");
    EXPECT_FALSE(symmetric_buffers_from_env());
  }
  expect_env_value_rejected("TDIST_FSDP_SYMMETRIC", "on", symmetric_buffers_from_env);
  if (std::getenv("TDIST_FSDP_SYMMETRIC") == nullptr) {
    EXPECT_EQ(symmetric_buffers_from_env(), symmetric_memory::is_available());
  }
}

}  // namespace
}  // namespace tdist::fsdp::detail
