#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "store_contract.h"
#include "support/ranks.h"
#include "tdist/store/file_store.h"
#include "tdist/store/hash_store.h"
#include "tdist/store/prefix_store.h"

namespace {

using tdist::FileStore;
using namespace std::chrono_literals;

std::string fresh_path() {
  return tdist::testing::make_temp_dir("tdist-filestore") + "/store";
}

TEST(StoreContract, HashStore) {
  tdist::HashStore store;
  tdist::testing::check_store_contract(store, "");
}

TEST(StoreContract, PrefixStoreOverHashStore) {
  auto base = std::make_shared<tdist::HashStore>();
  tdist::PrefixStore store("grp", base);
  tdist::testing::check_store_contract(store, "");
  EXPECT_TRUE(base->check({"grp/n"}));
}

TEST(StoreContract, FileStore) {
  FileStore store(fresh_path(), 1, 10s);
  tdist::testing::check_store_contract(store, "");
}

TEST(StoreContract, PrefixStoreOverFileStore) {
  auto base = std::make_shared<FileStore>(fresh_path(), -1, 10s);
  tdist::PrefixStore store("p", base);
  tdist::testing::check_store_contract(store, "");
}

TEST(FileStore, RanksAsThreadsEachWithItsOwnFileStore) {
  for (int world : {1, 2, 3, 4}) {
    const std::string path = fresh_path();
    tdist::testing::run_ranks_as_threads(world, [&](int rank, int world_size, tdist::StorePtr) {
      FileStore store(path, world_size, 30s);
      tdist::testing::check_store_across_ranks(store, rank, world_size, "");
    });
    // The last worker to leave removed the file.
    EXPECT_FALSE(std::filesystem::exists(path)) << "world " << world;
  }
}

TDIST_SCENARIO(file_store_ranks) {
  const int rank = tdist::testing::env_int("RANK", -1);
  const int world = tdist::testing::env_int("WORLD_SIZE", -1);
  FileStore store(std::getenv("TDIST_TEST_FILE"), world, 30s);
  tdist::testing::check_store_across_ranks(store, rank, world, "");
}

TEST(FileStore, RanksAsProcesses) {
  for (int world : {2, 4}) {
    tdist::testing::ProcessOptions options;
    const std::string path = fresh_path();
    options.env["TDIST_TEST_FILE"] = path;
    options.timeout = 60s;
    tdist::testing::expect_all_ok(
        tdist::testing::run_ranks_as_processes("file_store_ranks", world, options));
    EXPECT_FALSE(std::filesystem::exists(path));
  }
}

TEST(FileStore, StaleFileIsReportedWithItsPath) {
  const std::string path = fresh_path();
  // An earlier job of 2 that never cleaned up (both still "joined").
  auto a = std::make_unique<FileStore>(path, 2, 5s);
  auto b = std::make_unique<FileStore>(path, 2, 5s);
  a->set("k", std::string("v"));
  try {
    FileStore late(path, 2, 5s);
    FAIL() << "a third worker joined a 2-worker file";
  } catch (const tdist::StoreError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;
    EXPECT_NE(what.find("stale"), std::string::npos) << what;
    EXPECT_NE(what.find("Delete"), std::string::npos) << what;
  }
  // The refused worker wrote nothing: the job's own workers still see a clean store.
  EXPECT_EQ(a->num_keys(), 1);
  b.reset();
  EXPECT_TRUE(std::filesystem::exists(path));
  a.reset();
  EXPECT_FALSE(std::filesystem::exists(path));
  // After cleanup the path can be reused by the next job.
  FileStore next(path, 1, 5s);
  EXPECT_FALSE(next.check({"k"}));
}

TEST(FileStore, FileFromACrashedRunIsStale) {
  const std::string path = fresh_path();
  {
    // Simulate a crashed 1-worker run: a worker joined and never left.
    FileStore crashed(path, -1, 5s);  // -1: no cleanup on exit
    crashed.add(std::string("\x01t/joined"), 1);
  }
  ASSERT_TRUE(std::filesystem::exists(path));
  EXPECT_THROW(FileStore(path, 1, 5s), tdist::StoreError);
}

TEST(FileStore, CorruptFileIsReported) {
  const std::string path = fresh_path();
  std::ofstream(path) << "this is not a store file";
  try {
    FileStore store(path, 1, 5s);
    FAIL() << "opened a corrupt file";
  } catch (const tdist::StoreError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(FileStore, MissingDirectoryIsReported) {
  EXPECT_THROW(FileStore("/nonexistent-tdist-dir/x/store", 1, 1s), tdist::StoreError);
}

TEST(FileStore, LockHeldElsewhereTimesOutInsteadOfHanging) {
  const std::string path = fresh_path();
  FileStore store(path, -1, 200ms);
  int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  ASSERT_EQ(::fcntl(fd, F_OFD_SETLK, &fl), 0);
  EXPECT_THROW(store.set("k", std::string("v")), tdist::TimeoutError);
  fl.l_type = F_UNLCK;
  ::fcntl(fd, F_OFD_SETLK, &fl);
  ::close(fd);
  store.set("k", std::string("v"));
  EXPECT_EQ(store.get_string("k"), "v");
}

TEST(FileStore, AddOnNonIntegerValueIsAnError) {
  FileStore store(fresh_path(), 1, 5s);
  store.set("s", std::string("text"));
  EXPECT_THROW(store.add("s", 1), tdist::StoreError);
}

}  // namespace
