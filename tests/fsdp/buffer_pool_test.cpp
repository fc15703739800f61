// The buffer pool's idle cache and the TDIST_FSDP_PERSISTENT_BUFFERS switch, without
// communication.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "fsdp/buffer_pool.h"
#include "tdist/error.h"

namespace tdist::fsdp::detail {
namespace {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() { had_ ? (void)::setenv(name_, old_.c_str(), 1) : (void)::unsetenv(name_); }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(PersistentBuffers, OnByDefaultOffWithZeroAndAnythingElseRaises) {
  {
    ScopedEnv on("TDIST_FSDP_PERSISTENT_BUFFERS", "1");
    EXPECT_TRUE(persistent_buffers_enabled());
  }
  {
    ScopedEnv off("TDIST_FSDP_PERSISTENT_BUFFERS", "0");
    EXPECT_FALSE(persistent_buffers_enabled());
  }
  {
    ScopedEnv bad("TDIST_FSDP_PERSISTENT_BUFFERS", "yes");
    try {
      persistent_buffers_enabled();
      ADD_FAILURE() << "a malformed value was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("TDIST_FSDP_PERSISTENT_BUFFERS='yes'"),
                std::string::npos)
          << e.what();
    }
  }
  if (std::getenv("TDIST_FSDP_PERSISTENT_BUFFERS") == nullptr) {
    EXPECT_TRUE(persistent_buffers_enabled());
  }
}

// Released blocks are reused (same memory back) while the idle bytes stay within
// kIdleBlocks times the largest request; beyond that they are freed, oldest first.
TEST(BufferPool, ReusesReleasedBlocksAndCapsTheIdleBytes) {
  BufferPool pool;
  const size_t n = 1 << 20;
  const c10::Device cpu(c10::kCPU);
  PooledBlock a = pool.acquire(n, cpu);
  void* a_ptr = a.data.get();
  pool.release(std::move(a));
  EXPECT_EQ(pool.idle_bytes(), n);
  PooledBlock again = pool.acquire(n / 2, cpu);  // best fit: the idle block
  EXPECT_EQ(again.data.get(), a_ptr);
  EXPECT_EQ(pool.idle_bytes(), 0u);
  std::vector<PooledBlock> held;
  held.push_back(std::move(again));
  for (size_t i = 0; i < BufferPool::kIdleBlocks + 2; ++i) held.push_back(pool.acquire(n, cpu));
  for (auto& block : held) pool.release(std::move(block));
  EXPECT_EQ(pool.idle_bytes(), BufferPool::kIdleBlocks * n);
}

}  // namespace
}  // namespace tdist::fsdp::detail
