// Note [FSDP streams] on a machine without a GPU: the stream and event bookkeeping of FSDP's
// accelerator path, recorded.
//  - FSDPStreams.TrainingStepOrdersCopiesAndCollectivesAsFsdp2: a CPU training step with a
//    recording DeviceStreams installed makes exactly the waits and scopes the note describes
//    (all-gather copy-in after the compute stream, copy-out after the copy-in stream, the
//    reduce-scatter issued and finished on its stream, joined at the end of backward), and
//    trains bitwise like the run without streams.
//  - FSDPStreams.C10StreamsDriveTheDeviceGuard: the real DeviceStreams over c10's device
//    guard interface, on a fake device (PrivateUse1) whose guard records every call.
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "fsdp/device_streams.h"
#include "fsdp/tiny_transformer.h"
#include "tdist/comm/distributed.h"
#include "tdist/fsdp/forward.h"
#include "tdist/fsdp/fully_shard.h"
#include "tdist/store/hash_store.h"

namespace tdist::fsdp::detail {
namespace {

class RecordingStreams final : public DeviceStreams {
 public:
  void wait(StreamRole waiter, StreamRole producer) override {
    log(std::string("wait ") + to_string(waiter) + "<-" + to_string(producer));
  }
  void wait_event(StreamRole waiter, const c10::Event&) override {
    log(std::string("wait ") + to_string(waiter) + "<-event");
  }
  void enter(StreamRole role) override {
    entered_.push_back(role);
    log(std::string("enter ") + to_string(role));
  }
  void leave() override {
    ASSERT_FALSE(entered_.empty()) << "leave() without enter()";
    log(std::string("leave ") + to_string(entered_.back()));
    entered_.pop_back();
  }
  void record_use(const at::Tensor&, StreamRole user) override {
    log(std::string("record_use ") + to_string(user));
  }
  void mark_host_fence() override { log("fence"); }
  void host_wait() override { log("host_wait"); }

  std::vector<std::string> take() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::string> out;
    out.swap(log_);
    return out;
  }
  size_t depth() const { return entered_.size(); }

 private:
  void log(std::string line) {
    std::lock_guard<std::mutex> lock(mutex_);
    log_.push_back(std::move(line));
  }
  std::mutex mutex_;
  std::vector<std::string> log_;
  std::vector<StreamRole> entered_;
};

size_t count(const std::vector<std::string>& log, const std::string& line) {
  return static_cast<size_t>(std::count(log.begin(), log.end(), line));
}

// The log, one entry per line, for failure messages.
std::string join_lines(const std::vector<std::string>& log) {
  std::string joined;
  for (const auto& line : log) joined += line + "\n";
  return joined;
}

void init_world_of_one() {
  init_process_group(InitProcessGroupOptions()
                         .backend("gloo")
                         .store(std::make_shared<HashStore>())
                         .rank(0)
                         .world_size(1));
}

// bf16 mixed precision: the general buffers, which carry the streams.
FullyShardOptions bf16_options() {
  FullyShardOptions options;
  options.mp_policy(
      MixedPrecisionPolicy().param_dtype(torch::kBFloat16).reduce_dtype(torch::kFloat));
  return options;
}

// Two steps of the tiny model (bf16 mixed precision: the general buffers, which carry the
// streams) in one rank; returns the parameters at the end.
std::vector<at::Tensor> train_two_steps(const std::shared_ptr<RecordingStreams>& streams,
                                        std::vector<std::string>* step_log,
                                        bool post_optim_event = false,
                                        bool event_on_a_block = false) {
  init_world_of_one();
  std::optional<ScopedDeviceStreamsOverride> override_streams;
  if (streams) override_streams.emplace(streams);
  std::vector<at::Tensor> params;
  {
    testing::TinyConfig c;
    testing::TinyTransformer model = testing::make_tiny(c);
    const FullyShardOptions options = bf16_options();
    std::vector<FSDPModule> blocks;
    for (auto& block : model->blocks) blocks.push_back(fully_shard(block, options));
    FullyShardOptions root = options;
    root.mp_policy(MixedPrecisionPolicy(options.mp_policy()).output_dtype(torch::kFloat));
    FSDPModule root_handle = fully_shard(model, root);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
    for (int step = 0; step < 2; ++step) {
      auto [x, y] = testing::tiny_batch(c, 2, step);
      opt.zero_grad();
      if (streams) streams->take();
      if (post_optim_event && step == 1) {
        FSDPModule& handle = event_on_a_block ? blocks.back() : root_handle;
        handle.set_post_optim_event(std::make_shared<c10::Event>(c10::kCPU));
      }
      testing::lm_loss(forward(model, x), y).backward();
      if (streams && step == 1) *step_log = streams->take();
      opt.step();
    }
    for (const auto& p : model->parameters()) params.push_back(p.detach().clone());
  }  // the groups hold the override's streams: gone before it
  destroy_process_group();
  return params;
}

TEST(FSDPStreams, TrainingStepOrdersCopiesAndCollectivesAsFsdp2) {
  const std::vector<at::Tensor> plain = train_two_steps(nullptr, nullptr);
  auto streams = std::make_shared<RecordingStreams>();
  std::vector<std::string> log;
  const std::vector<at::Tensor> streamed = train_two_steps(streams, &log);
  ASSERT_EQ(plain.size(), streamed.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(plain[i].equal(streamed[i])) << i;
  EXPECT_EQ(streams->depth(), 0u) << "a stream scope was left open";

  // Forward + backward of a step (2 blocks + root = 3 groups): each group all-gathers in
  // forward and in backward except the root, which keeps its parameters after forward.
  ASSERT_FALSE(log.empty());
  const std::string joined = join_lines(log);
  const size_t all_gathers = count(log, "enter all_gather_copy_in");
  const size_t reduce_scatter_scopes = count(log, "enter reduce_scatter");
  EXPECT_EQ(all_gathers, 5u) << joined;  // this log is backward only: forward ran before
  EXPECT_EQ(reduce_scatter_scopes, 2u * 3u) << joined;  // issue + finish per group
  // The root's pre-forward orders the copy-in stream after the optimizer step, once; the
  // all-gathers of the forward and the backward then wait for nothing more.
  EXPECT_EQ(log.front(), "wait all_gather_copy_in<-compute") << joined;
  for (size_t i = 0; i < log.size(); ++i) {
    if (log[i] == "enter all_gather_copy_in") {
      EXPECT_EQ(log.at(i + 1), "leave all_gather_copy_in") << joined;  // copy-in and issue
    }
  }
  // Each copy-out: the compute stream waits for the copy-in stream, then the copy-in stream
  // for the compute stream (the buffers are freed).
  EXPECT_EQ(count(log, "wait compute<-all_gather_copy_in"), all_gathers) << joined;
  EXPECT_EQ(count(log, "wait all_gather_copy_in<-compute"), 1 + all_gathers) << joined;
  // Each reduce-scatter is issued after the compute stream (the gradients' copy-in) ...
  EXPECT_EQ(count(log, "wait reduce_scatter<-compute"), 3u) << joined;
  // At world 1 no collective reads the copied-in gradients: the copy on the reduce-scatter
  // stream does, and marks them in use there (else the compute stream could reuse them first).
  EXPECT_EQ(count(log, "record_use reduce_scatter"), 3u) << joined;
  // ... and the compute stream joins the reduce-scatter stream once per group at the end,
  // after the last reduce-scatter was finished, with the host wait for offloaded copies.
  EXPECT_EQ(count(log, "wait compute<-reduce_scatter"), 3u) << joined;
  EXPECT_EQ(count(log, "host_wait"), 3u) << joined;
  size_t last_leave = 0, first_join = log.size();
  for (size_t i = 0; i < log.size(); ++i) {
    if (log[i] == "leave reduce_scatter") last_leave = i;
    if (log[i] == "wait compute<-reduce_scatter") first_join = std::min(first_join, i);
  }
  EXPECT_LT(last_leave, first_join) << joined;
}

// FSDPModule::set_post_optim_event: the next forward's copy-in stream waits for that event
// instead of the compute stream, once; the event is then dropped.
TEST(FSDPStreams, PostOptimEventReplacesTheComputeStreamWait) {
  auto streams = std::make_shared<RecordingStreams>();
  std::vector<std::string> log;
  train_two_steps(streams, &log, /*post_optim_event=*/true);
  const std::string joined = join_lines(log);
  ASSERT_FALSE(log.empty());
  EXPECT_EQ(log.front(), "wait all_gather_copy_in<-event") << joined;
  EXPECT_EQ(count(log, "wait all_gather_copy_in<-event"), 1u) << joined;
  // Left: the waits after each of the 5 copy-outs.
  EXPECT_EQ(count(log, "wait all_gather_copy_in<-compute"), 5u) << joined;
}

// As FSDP2 (one state context per tree): the event set on a block is the root's.
TEST(FSDPStreams, PostOptimEventSetOnABlockIsTheRoots) {
  auto streams = std::make_shared<RecordingStreams>();
  std::vector<std::string> log;
  train_two_steps(streams, &log, /*post_optim_event=*/true, /*event_on_a_block=*/true);
  const std::string joined = join_lines(log);
  ASSERT_FALSE(log.empty());
  EXPECT_EQ(log.front(), "wait all_gather_copy_in<-event") << joined;
  EXPECT_EQ(count(log, "wait all_gather_copy_in<-event"), 1u) << joined;
}

// A forward with grad and no backward leaves the root's ordering of the copy-ins standing
// (for a backward that never comes); the user may then write the shards (a state-dict load,
// an optimizer step) and unshard a module explicitly: that copy-in waits for the compute
// stream itself, as FSDP2's explicit unshard copies in on the current stream.
TEST(FSDPStreams, AnExplicitUnshardWaitsForTheComputeStream) {
  init_world_of_one();
  auto streams = std::make_shared<RecordingStreams>();
  std::vector<std::string> log;
  {
    ScopedDeviceStreamsOverride override_streams(streams);
    testing::TinyConfig c;
    testing::TinyTransformer model = testing::make_tiny(c);
    const FullyShardOptions options = bf16_options();
    std::vector<FSDPModule> blocks;
    for (auto& block : model->blocks) blocks.push_back(fully_shard(block, options));
    fully_shard(model, options);
    auto [x, y] = testing::tiny_batch(c, 2, 0);
    at::Tensor loss = testing::lm_loss(forward(model, x), y);  // no backward
    streams->take();
    blocks.front().unshard();
    log = streams->take();
    blocks.front().reshard();
  }
  destroy_process_group();
  const std::string joined = join_lines(log);
  const auto enter = std::find(log.begin(), log.end(), "enter all_gather_copy_in");
  ASSERT_NE(enter, log.end()) << joined;
  EXPECT_NE(std::find(log.begin(), enter, "wait all_gather_copy_in<-compute"), enter) << joined;
}

// ---- the real DeviceStreams on a fake device ----------------------------------------------

std::mutex g_guard_mutex;
std::vector<std::string> g_guard_log;
c10::Stream g_current(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, 0), 0);

void guard_log(std::string line) {
  std::lock_guard<std::mutex> lock(g_guard_mutex);
  g_guard_log.push_back(std::move(line));
}

std::string id(const c10::Stream& s) {
  return "s" + std::to_string(s.id());
}

struct RecordingGuard final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }
  c10::Device exchangeDevice(c10::Device d) const override { return d; }
  c10::Device getDevice() const override { return c10::Device(c10::DeviceType::PrivateUse1, 0); }
  void setDevice(c10::Device) const override {}
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device) const override { return g_current; }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high) const override {
    guard_log(std::string("pool ") + (high ? "high" : "low"));
    return c10::Stream(c10::Stream::UNSAFE, d, high ? 2 : 1);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    guard_log("current " + id(s));
    c10::Stream previous = g_current;
    g_current = s;
    return previous;
  }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  void record(void** event, const c10::Stream& s, const c10::DeviceIndex,
              const c10::EventFlag) const override {
    if (*event == nullptr) *event = new int(0);
    guard_log("record on " + id(s));
  }
  void block(void* event, const c10::Stream& s) const override {
    ASSERT_NE(event, nullptr);
    guard_log("block " + id(s));
  }
  void synchronizeEvent(void* event) const override {
    ASSERT_NE(event, nullptr);
    guard_log("host waits");
  }
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream& s) const override {
    guard_log("in use on " + id(s));
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<int*>(event);
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, RecordingGuard);

TEST(FSDPStreams, C10StreamsDriveTheDeviceGuard) {
  std::unique_ptr<DeviceStreams> streams =
      make_c10_device_streams(c10::Device(c10::DeviceType::PrivateUse1, 0));
  {
    StreamScope copy_in(streams.get(), StreamRole::kAllGatherCopyIn);
    // Inside the scope "compute" is still the stream current before FSDP entered (s0).
    streams->wait(StreamRole::kAllGatherCopyIn, StreamRole::kCompute);
    streams->wait(StreamRole::kReduceScatter, StreamRole::kAllGatherCopyIn);
    streams->mark_host_fence();  // on the current stream: the copy-in's
    streams->record_use(at::ones({4}), StreamRole::kReduceScatter);
    streams->record_use(at::empty({0}), StreamRole::kReduceScatter);  // no memory: nothing
  }
  streams->host_wait();
  streams->host_wait();  // nothing marked since: no second host wait
  const std::vector<std::string> want = {
      "pool low", "pool high",    "current s1",   "record on s0", "block s1",  "record on s1",
      "block s2", "record on s1", "in use on s2", "current s0",   "host waits"};
  EXPECT_EQ(g_guard_log, want);
  EXPECT_EQ(g_current.id(), 0);
  EXPECT_EQ(device_streams_for(c10::Device(c10::kCPU)), nullptr);
  EXPECT_EQ(device_streams_for(c10::Device(c10::kMeta)), nullptr);
}

}  // namespace
}  // namespace tdist::fsdp::detail
