#include "comm/store_backend.h"

#include <cstring>
#include <mutex>

#include <torch/torch.h>

#include "tdist/comm/backend.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"

namespace tdist::testing {

namespace {

std::vector<uint8_t> bytes_of(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.numel() * c.element_size());
}

at::Tensor tensor_of(const std::vector<uint8_t>& bytes, const at::Tensor& like) {
  at::Tensor t =
      at::empty({static_cast<int64_t>(bytes.size() / like.element_size())}, like.options());
  if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

void write_into(at::Tensor& out, const at::Tensor& flat) {
  out.view({-1}).copy_(flat.view({-1}));
}

}  // namespace

StoreBackend::StoreBackend(StorePtr store, int rank, int size, std::chrono::milliseconds timeout)
    : CollectiveBackend(rank, size), store_(std::move(store)), timeout_(timeout) {}

std::vector<std::vector<uint8_t>> StoreBackend::exchange(const std::vector<uint8_t>& mine) {
  const std::string base = "c/" + std::to_string(++seq_) + "/";
  store_->set(base + std::to_string(rank_), mine);
  std::vector<std::vector<uint8_t>> all(size_);
  std::vector<std::string> keys;
  for (int r = 0; r < size_; ++r) keys.push_back(base + std::to_string(r));
  store_->wait(keys, timeout_);
  for (int r = 0; r < size_; ++r) all[r] = r == rank_ ? mine : store_->get(keys[r]);
  return all;
}

at::Tensor StoreBackend::reduce_all(const std::vector<std::vector<uint8_t>>& all,
                                    const at::Tensor& like, ReduceOp op) {
  bool low = like.scalar_type() == at::kHalf || like.scalar_type() == at::kBFloat16;
  at::Tensor acc;
  for (int r = 0; r < size_; ++r) {
    at::Tensor t = tensor_of(all[r], like);
    if (low) t = t.to(at::kFloat);
    if (!acc.defined()) {
      acc = t.clone();
      continue;
    }
    switch (op) {
      case ReduceOp::SUM:
      case ReduceOp::AVG:
        acc = like.scalar_type() == at::kBool ? acc.logical_or(t) : acc + t;
        break;
      case ReduceOp::PRODUCT:
        acc = like.scalar_type() == at::kBool ? acc.logical_and(t) : acc * t;
        break;
      case ReduceOp::MIN:
        acc = at::minimum(acc, t);
        break;
      case ReduceOp::MAX:
        acc = at::maximum(acc, t);
        break;
      case ReduceOp::BAND:
        acc = acc.bitwise_and(t);
        break;
      case ReduceOp::BOR:
        acc = acc.bitwise_or(t);
        break;
      case ReduceOp::BXOR:
        acc = acc.bitwise_xor(t);
        break;
      case ReduceOp::PREMUL_SUM:
        TDIST_THROW(InvalidArgument, "storetest: PREMUL_SUM reaches backends scaled, as SUM");
    }
  }
  if (op == ReduceOp::AVG) acc = acc / size_;
  return acc.to(like.scalar_type());
}

WorkPtr StoreBackend::broadcast(at::Tensor& tensor, const BroadcastOptions& opts) {
  auto all = exchange(rank_ == opts.root ? bytes_of(tensor) : std::vector<uint8_t>{});
  if (rank_ != opts.root) write_into(tensor, tensor_of(all[opts.root], tensor));
  return completed_work("broadcast", {tensor});
}

WorkPtr StoreBackend::all_reduce(at::Tensor& tensor, const AllreduceOptions& opts) {
  auto all = exchange(bytes_of(tensor));
  write_into(tensor, reduce_all(all, tensor, opts.op));
  return completed_work("all_reduce", {tensor});
}

WorkPtr StoreBackend::all_reduce_coalesced(std::vector<at::Tensor>& tensors,
                                           const AllreduceOptions& opts) {
  for (auto& t : tensors) all_reduce(t, opts);
  return completed_work("all_reduce_coalesced", tensors);
}

WorkPtr StoreBackend::reduce(at::Tensor& tensor, const ReduceOptions& opts) {
  auto all = exchange(bytes_of(tensor));
  if (rank_ == opts.root) write_into(tensor, reduce_all(all, tensor, opts.op));
  return completed_work("reduce", {tensor});
}

WorkPtr StoreBackend::all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                                 const AllgatherOptions&) {
  auto all = exchange(bytes_of(input));
  for (int r = 0; r < size_; ++r) write_into(outputs[r], tensor_of(all[r], input));
  return completed_work("all_gather", outputs);
}

WorkPtr StoreBackend::all_gather_into_tensor(at::Tensor& output, const at::Tensor& input,
                                             const AllgatherOptions&) {
  auto all = exchange(bytes_of(input));
  auto flat = output.view({size_, -1});
  for (int r = 0; r < size_; ++r) flat[r].copy_(tensor_of(all[r], input));
  return completed_work("all_gather_into_tensor", {output});
}

WorkPtr StoreBackend::gather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                             const GatherOptions& opts) {
  auto all = exchange(bytes_of(input));
  if (rank_ == opts.root) {
    for (int r = 0; r < size_; ++r) write_into(outputs[r], tensor_of(all[r], input));
  }
  return completed_work("gather", outputs);
}

WorkPtr StoreBackend::scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs,
                              const ScatterOptions& opts) {
  std::vector<uint8_t> mine;
  if (rank_ == opts.root) {
    for (const auto& t : inputs) {
      auto b = bytes_of(t);
      mine.insert(mine.end(), b.begin(), b.end());
    }
  }
  auto all = exchange(mine);
  at::Tensor whole = tensor_of(all[opts.root], output).view({size_, -1});
  write_into(output, whole[rank_]);
  return completed_work("scatter", {output});
}

WorkPtr StoreBackend::reduce_scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs,
                                     const ReduceScatterOptions& opts) {
  at::Tensor cat = at::cat(inputs).view({-1});
  return reduce_scatter_tensor(output, cat, opts);
}

WorkPtr StoreBackend::reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input,
                                            const ReduceScatterOptions& opts) {
  auto all = exchange(bytes_of(input));
  at::Tensor reduced = reduce_all(all, input, opts.op).view({size_, -1});
  write_into(output, reduced[rank_]);
  return completed_work("reduce_scatter_tensor", {output});
}

WorkPtr StoreBackend::all_to_all_single(at::Tensor& output, const at::Tensor& input,
                                        const std::vector<int64_t>& output_split_sizes,
                                        const std::vector<int64_t>& input_split_sizes,
                                        const AllToAllOptions&) {
  // Publish [splits..., data]; each rank takes its slice from every peer.
  const int64_t row = input.dim() == 0 ? 1 : input.numel() / std::max<int64_t>(input.size(0), 1);
  std::vector<int64_t> in_splits = input_split_sizes;
  if (in_splits.empty()) in_splits.assign(size_, input.size(0) / size_);
  at::Tensor splits = torch::tensor(in_splits, torch::kInt64);
  auto header = bytes_of(splits);
  auto data = bytes_of(input);
  header.insert(header.end(), data.begin(), data.end());
  auto all = exchange(header);
  std::vector<at::Tensor> pieces;
  for (int r = 0; r < size_; ++r) {
    std::vector<int64_t> theirs(size_);
    std::memcpy(theirs.data(), all[r].data(), size_ * sizeof(int64_t));
    int64_t offset = 0;
    for (int k = 0; k < rank_; ++k) offset += theirs[k];
    std::vector<uint8_t> body(all[r].begin() + size_ * sizeof(int64_t), all[r].end());
    at::Tensor flat = tensor_of(body, input);
    pieces.push_back(flat.narrow(0, offset * row, theirs[rank_] * row));
  }
  (void)output_split_sizes;
  write_into(output, at::cat(pieces));
  return completed_work("all_to_all_single", {output});
}

WorkPtr StoreBackend::barrier(const BarrierOptions&) {
  exchange({});
  return completed_work("barrier");
}

WorkPtr StoreBackend::send(const at::Tensor& tensor, int dst, const SendRecvOptions& opts) {
  const std::string path =
      std::to_string(rank_) + "/" + std::to_string(dst) + "/" + std::to_string(opts.tag_id);
  store_->set("p2p/" + path + "/" + std::to_string(p2p_counts_[path]++), bytes_of(tensor));
  return completed_work("send");
}

WorkPtr StoreBackend::recv(at::Tensor& tensor, int src, const SendRecvOptions& opts) {
  const std::string path =
      std::to_string(src) + "/" + std::to_string(rank_) + "/" + std::to_string(opts.tag_id);
  const std::string key = "p2p/" + path + "/" + std::to_string(p2p_counts_[path]++);
  store_->wait({key}, timeout_);
  write_into(tensor, tensor_of(store_->get(key), tensor));
  return completed_work("recv", {tensor});
}

void register_store_backend() {
  static std::once_flag once;
  std::call_once(once, [] {
    Backend::register_backend(
        "storetest",
        [](const StorePtr& store, int rank, int size, std::chrono::milliseconds timeout) {
          return std::make_shared<StoreBackend>(store, rank, size, timeout);
        },
        true, {"cpu"});
  });
}

std::string test_backend() {
  if (is_gloo_available()) return "gloo";
  register_store_backend();
  return "storetest";
}

}  // namespace tdist::testing
