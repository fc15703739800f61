// ProcessGroup: rank translation and routing of each tensor to its device's backend.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "comm/store_backend.h"
#include "support/ranks.h"
#include "tdist/comm/process_group.h"
#include "tdist/error.h"
#include "tdist/store/hash_store.h"
#include "tdist/store/prefix_store.h"

namespace tdist {
namespace {

class NamedBackend : public CollectiveBackend {
 public:
  explicit NamedBackend(std::string n) : CollectiveBackend(0, 1), name_(std::move(n)) {}
  std::string name() const override { return name_; }

 private:
  std::string name_;
};

TEST(ProcessGroup, TranslatesRanks) {
  ProcessGroup pg("7", std::make_shared<HashStore>(), 1, {2, 5, 6}, std::chrono::seconds(1));
  EXPECT_EQ(pg.size(), 3);
  EXPECT_EQ(pg.group_rank(5), 1);
  EXPECT_EQ(pg.global_rank(2), 6);
  EXPECT_THROW(pg.group_rank(3), InvalidArgument);
  EXPECT_THROW(pg.global_rank(3), InvalidArgument);
  EXPECT_THROW(ProcessGroup("x", nullptr, 3, {0, 1}, std::chrono::seconds(1)), InvalidArgument);
}

TEST(ProcessGroup, RoutesByDeviceTypeAndNamesMissingOnes) {
  ProcessGroup pg("0", std::make_shared<HashStore>(), 0, {0}, std::chrono::seconds(1));
  pg.set_backend("cpu", "alpha", std::make_shared<NamedBackend>("alpha"));
  pg.set_backend("privateuseone", "beta", std::make_shared<NamedBackend>("beta"));
  EXPECT_EQ(pg.backend_for(torch::ones({1})).name(), "alpha");
  EXPECT_EQ(pg.backend("privateuseone").name(), "beta");
  EXPECT_EQ(pg.default_backend().name(), "alpha");
  try {
    pg.backend("cuda");
    FAIL();
  } catch (const InvalidArgument& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("no backend for device type 'cuda'"), std::string::npos) << what;
    EXPECT_NE(what.find("cpu:alpha"), std::string::npos) << what;
  }
  pg.release_backends();
  EXPECT_THROW(pg.backend("cpu"), InvalidArgument);
}

TEST(ProcessGroup, NonMemberHasNoBackend) {
  ProcessGroup pg("3", std::make_shared<HashStore>(), -1, {0, 2}, std::chrono::seconds(1));
  EXPECT_FALSE(pg.is_member());
  EXPECT_THROW(pg.default_backend(), InvalidArgument);
}

// The test engine itself must be right for the end-to-end tests to mean anything.
TEST(StoreBackendEngine, AllReduceAndAllToAllAtWorldThree) {
  testing::run_ranks_as_threads(3, [](int rank, int size, StorePtr store) {
    testing::StoreBackend backend(std::make_shared<PrefixStore>("b", store), rank, size,
                                  std::chrono::seconds(10));
    at::Tensor t = torch::full({4}, rank + 1.0);
    AllreduceOptions opts;
    opts.op = ReduceOp::SUM;
    backend.all_reduce(t, opts)->wait();
    if (!t.equal(torch::full({4}, 6.0))) throw std::runtime_error("all_reduce wrong");
    // Rank r sends r+1 rows to every peer.
    at::Tensor in = torch::full({(rank + 1) * size}, static_cast<float>(rank));
    std::vector<int64_t> in_splits(size, rank + 1), out_splits{1, 2, 3};
    at::Tensor out = torch::empty({6});
    backend.all_to_all_single(out, in, out_splits, in_splits, {})->wait();
    at::Tensor expected = torch::tensor({0.f, 1.f, 1.f, 2.f, 2.f, 2.f});
    if (!out.equal(expected)) throw std::runtime_error("all_to_all_single wrong");
  });
}

}  // namespace
}  // namespace tdist
