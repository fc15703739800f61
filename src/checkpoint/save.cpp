// save(): plan -> write -> commit, each phase ending in one agreement round
// (Note [Checkpoint agreement] in coordinator.h).

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <random>
#include <set>

#include <ATen/ATen.h>

#include "checkpoint/agreement.h"
#include "checkpoint/box.h"
#include "checkpoint/dcp_metadata.h"
#include "checkpoint/dcp_writer.h"
#include "checkpoint/dtype.h"
#include "checkpoint/fault.h"
#include "checkpoint/file_io.h"
#include "checkpoint/metadata_codec.h"
#include "checkpoint/paths.h"
#include "checkpoint/save.h"
#include "tdist/checkpoint/checkpoint.h"
#include "tdist/error.h"

namespace tdist::checkpoint {
namespace {

namespace fs = std::filesystem;
using detail::Box;
using detail::Report;
using nlohmann::json;

// Chunks start on 64-byte boundaries so a loader can view them in place (aligned buffers).
constexpr int64_t kChunkAlignment = 64;

std::string random_token() {
  std::random_device rd;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%08x%04x", rd(), static_cast<unsigned>(::getpid()) & 0xffff);
  return buf;
}

/// One box of one tensor and the ranks that hold it.
struct PlannedChunk {
  std::string name;
  Box box;
  std::vector<int> holders;
  int owner = -1;
};

/// This rank's view of its state for the plan round; throws InvalidArgument for a state that
/// can never be saved.
json describe_local_state(const ShardedStateDict& state) {
  json tensors = json::array();
  for (const auto& [name, st] : state) {
    if (!st.local.defined()) {
      TDIST_THROW(InvalidArgument, "checkpoint: '" + name + "' has an undefined local tensor");
    }
    Box box{st.offsets, st.local.sizes().vec()};
    if (!detail::box_within(box, st.global_shape)) {
      TDIST_THROW(InvalidArgument, "checkpoint: '" + name + "': local slice (offsets " +
                                       json(st.offsets).dump() + ", sizes " +
                                       json(box.sizes).dump() + ") does not fit global shape " +
                                       json(st.global_shape).dump() + "; fix the ShardedTensor");
    }
    tensors.push_back({{"name", name},
                       {"dtype", detail::dtype_name(st.local.scalar_type())},
                       {"global_shape", st.global_shape},
                       {"offsets", st.offsets},
                       {"sizes", box.sizes}});
  }
  return tensors;
}

/// Same on every rank (it only reads the gathered plans): checks the ranks agree on every
/// tensor, and gives each distinct box one owner, the holder with the fewest bytes so far.
std::vector<PlannedChunk> make_plan(const std::vector<Report>& plans,
                                    std::map<std::string, TensorInfo>* tensors) {
  std::map<std::pair<std::string, Box>, std::vector<int>> holders;
  for (size_t r = 0; r < plans.size(); ++r) {
    for (const auto& t : plans[r].payload.at("tensors")) {
      const auto name = t.at("name").get<std::string>();
      TensorInfo info{
          t.at("dtype").get<std::string>(), t.at("global_shape").get<std::vector<int64_t>>(), {}};
      auto [it, inserted] = tensors->emplace(name, info);
      if (!inserted &&
          (it->second.dtype != info.dtype || it->second.global_shape != info.global_shape)) {
        TDIST_THROW(InvalidArgument,
                    "checkpoint: ranks disagree on '" + name + "': " + it->second.dtype + " " +
                        json(it->second.global_shape).dump() + " vs rank " + std::to_string(r) +
                        ": " + info.dtype + " " + json(info.global_shape).dump() +
                        "; every rank must describe the same global tensor");
      }
      Box box{t.at("offsets").get<std::vector<int64_t>>(),
              t.at("sizes").get<std::vector<int64_t>>()};
      if (box.numel() == 0) continue;
      holders[{name, box}].push_back(static_cast<int>(r));
    }
  }
  std::vector<PlannedChunk> plan;
  for (auto& [key, ranks] : holders) plan.push_back({key.first, key.second, ranks, -1});

  // Distinct boxes of one tensor must not overlap and must cover it: a partial overlap
  // means two ranks disagree on the sharding, a gap means a missing shard.
  std::map<std::string, std::vector<const PlannedChunk*>> by_name;
  for (const auto& c : plan) by_name[c.name].push_back(&c);
  for (const auto& [name, info] : *tensors) {
    const auto& chunks = by_name[name];
    int64_t covered = 0;
    for (size_t i = 0; i < chunks.size(); ++i) {
      covered += chunks[i]->box.numel();
      for (size_t k = i + 1; k < chunks.size(); ++k) {
        if (detail::intersect(chunks[i]->box, chunks[k]->box).numel() > 0) {
          TDIST_THROW(InvalidArgument,
                      "checkpoint: '" + name + "': slices at offsets " +
                          json(chunks[i]->box.offsets).dump() + " and " +
                          json(chunks[k]->box.offsets).dump() +
                          " overlap without being identical; ranks disagree on the sharding");
        }
      }
    }
    const int64_t total =
        Box{std::vector<int64_t>(info.global_shape.size(), 0), info.global_shape}.numel();
    if (covered != total) {
      TDIST_THROW(InvalidArgument, "checkpoint: '" + name + "': the ranks hold " +
                                       std::to_string(covered) + " of its " +
                                       std::to_string(total) +
                                       " elements; a shard is missing on some rank");
    }
  }

  std::vector<int64_t> load(plans.size(), 0);
  for (auto& c : plan) {
    const int64_t bytes = c.box.numel() * c10::elementSize(detail::dtype_from_name(
                                              tensors->at(c.name).dtype, "plan"));
    int best = c.holders.front();
    for (int r : c.holders) {
      if (load[r] < load[best]) best = r;
    }
    c.owner = best;
    load[best] += bytes;
  }
  return plan;
}

/// Writes this rank's owned chunks into one file; returns the file and chunk records.
json write_shard_file(const ShardedStateDict& state, const std::vector<PlannedChunk>& plan,
                      int rank, const std::string& partial_dir, const SaveOptions& options,
                      const FaultInjection& fault) {
  std::vector<const PlannedChunk*> mine;
  int64_t total = 0;
  for (const auto& c : plan) {
    if (c.owner == rank) {
      mine.push_back(&c);
      total += state.at(c.name).local.nbytes();
    }
  }
  json out = {{"file", nullptr}, {"chunks", json::array()}};
  if (mine.empty()) {
    detail::maybe_inject(fault, rank, SavePhase::kWrite);
    return out;
  }
  char name[32];
  std::snprintf(name, sizeof(name), "shard-%05d.bin", rank);
  detail::OutputFile file((fs::path(partial_dir) / name).string(), options.checksum_block_bytes(),
                          options.fsync());
  static const char kZeros[kChunkAlignment] = {};
  int64_t written = 0;
  bool injected = false;
  for (const auto* c : mine) {
    const at::Tensor data = state.at(c->name).local.detach().to(at::kCPU).contiguous();
    const int64_t pad = (kChunkAlignment - file.size() % kChunkAlignment) % kChunkAlignment;
    file.write(kZeros, static_cast<size_t>(pad));
    const int64_t offset = file.size();
    const auto* bytes = static_cast<const char*>(data.data_ptr());
    const int64_t n = data.nbytes();
    // Inject "write" after half of this rank's bytes, leaving a torn file behind.
    const int64_t half = std::max<int64_t>(0, std::min(n, total / 2 - written));
    file.write(bytes, static_cast<size_t>(half));
    if (!injected && written + half >= total / 2) {
      injected = true;
      detail::maybe_inject(fault, rank, SavePhase::kWrite);
    }
    file.write(bytes + half, static_cast<size_t>(n - half));
    written += n;
    out["chunks"].push_back({{"name", c->name},
                             {"offsets", c->box.offsets},
                             {"sizes", c->box.sizes},
                             {"file", name},
                             {"byte_offset", offset},
                             {"byte_length", n}});
  }
  const int64_t size = file.size();
  const auto crcs = file.close();
  out["file"] = {{"name", name},
                 {"rank", rank},
                 {"size", size},
                 {"block_bytes", options.checksum_block_bytes()},
                 {"block_crc32c", crcs}};
  return out;
}

/// The DCP format's counterpart of write_shard_file; rank 0 also stores every rank's extra
/// state (gathered in the plan round).
json write_dcp_rank_file(const ShardedStateDict& state, const std::vector<PlannedChunk>& plan,
                         const std::vector<Report>& plans, int rank, const std::string& partial_dir,
                         const SaveOptions& options, const FaultInjection& fault) {
  std::vector<detail::SliceToWrite> slices;
  for (const auto& c : plan) {
    if (c.owner == rank) slices.push_back({c.name, c.box.offsets, state.at(c.name).local});
  }
  std::string extras;
  std::vector<std::pair<std::string, c10::IValue>> objects;
  if (rank == 0) {
    json all = json::array();
    for (const auto& p : plans) all.push_back(p.payload.at("extra"));
    extras = all.dump();
    // The param groups as Python's flatten_state_dict names them, for its dcp.load.
    const json& rank0 = plans.at(0).payload.at("extra");
    if (rank0.contains("optimizer_param_groups")) {
      objects = detail::dcp_param_group_values(rank0.at("optimizer_param_groups"));
    }
  }
  return detail::write_dcp_file(slices, rank == 0 ? &extras : nullptr, objects, rank, partial_dir,
                                options.fsync(),
                                [&] { detail::maybe_inject(fault, rank, SavePhase::kWrite); });
}

/// The committed metadata file's name and bytes, in the format asked for.
std::pair<const char*, std::string> encode_for_format(const CheckpointMetadata& metadata,
                                                      const json& rank0_write,
                                                      const std::string& final_dir,
                                                      const std::string& token) {
  if (metadata.format == CheckpointFormat::kTdist) {
    return {kMetadataFile, detail::encode_metadata(metadata)};
  }
  std::optional<detail::DCPByteEntry> extra;
  if (rank0_write.contains("extra_state")) {
    const auto& e = rank0_write.at("extra_state");
    extra = detail::DCPByteEntry{e.at("file").get<std::string>(), e.at("offset").get<int64_t>(),
                                 e.at("length").get<int64_t>()};
  }
  std::vector<detail::DCPObjectEntry> objects;
  if (rank0_write.contains("objects")) {
    for (const auto& o : rank0_write.at("objects")) {
      objects.push_back({o.at("name").get<std::string>(),
                         {o.at("file").get<std::string>(), o.at("offset").get<int64_t>(),
                          o.at("length").get<int64_t>()}});
    }
  }
  return {kDCPMetadataFile,
          detail::encode_dcp_metadata(metadata, extra, objects, final_dir, token)};
}

CheckpointMetadata assemble_metadata(const std::vector<Report>& writes,
                                     std::map<std::string, TensorInfo> tensors) {
  CheckpointMetadata m;
  m.world_size = static_cast<int>(writes.size());
  for (const auto& w : writes) {
    const auto& p = w.payload;
    if (!p.at("file").is_null()) {
      const auto& f = p.at("file");
      m.files[f.at("name").get<std::string>()] = FileInfo{
          f.at("rank").get<int>(), f.at("size").get<int64_t>(), f.at("block_bytes").get<int64_t>(),
          f.at("block_crc32c").get<std::vector<uint32_t>>()};
    }
    for (const auto& c : p.at("chunks")) {
      tensors.at(c.at("name").get<std::string>())
          .chunks.push_back(
              ChunkInfo{c.at("offsets").get<std::vector<int64_t>>(),
                        c.at("sizes").get<std::vector<int64_t>>(), c.at("file").get<std::string>(),
                        c.at("byte_offset").get<int64_t>(), c.at("byte_length").get<int64_t>()});
    }
    m.extra_per_rank.push_back(ExtraState::from_json(p.at("extra")));
  }
  m.tensors = std::move(tensors);
  return m;
}

void remove_quietly(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
}

// Phase 1 on every rank: describe this rank's state; rank 0 also creates the hidden
// directory the files are written into (its token in the payload).
Report plan_report_of(const ShardedStateDict& state, const ExtraState& extra,
                      const detail::CheckpointPaths& paths, const SaveOptions& options, int rank,
                      const FaultInjection& fault, const std::string& local_failure) {
  if (!local_failure.empty()) return Report{false, local_failure};
  Report report;
  try {
    detail::maybe_inject(fault, rank, SavePhase::kPlan);
    report.payload["tensors"] = describe_local_state(state);
    report.payload["extra"] = extra.to_json();
    if (!extra.user.is_object()) {
      TDIST_THROW(InvalidArgument, "checkpoint: ExtraState::user must be a JSON object");
    }
    if (rank == 0) {
      if (fs::exists(paths.final_dir) && !options.overwrite()) {
        TDIST_THROW(CheckpointError, "checkpoint: '" + paths.final_dir +
                                         "' already exists; pass SaveOptions().overwrite(true) "
                                         "or save to a new directory");
      }
      const std::string token = random_token();
      fs::create_directories(paths.parent);
      fs::create_directory(detail::partial_dir(paths, token));
      report.payload["token"] = token;
    }
  } catch (const std::exception& e) {
    report = Report{false, e.what()};
  }
  return report;
}

// Phase 3 on rank 0: the metadata file by rename inside the hidden directory, then the
// directory by rename over the final name (an old checkpoint there moved aside first and
// removed after). *committed turns true at the directory's rename: from then on the new
// checkpoint is the one on disk, whatever fails after.
void commit_on_rank0(const CheckpointMetadata& metadata, const json& rank0_write,
                     const std::string& token, const std::string& partial,
                     const detail::CheckpointPaths& paths, const SaveOptions& options,
                     const FaultInjection& fault, bool* committed) {
  const int rank = 0;
  const auto [meta_name, bytes] = encode_for_format(metadata, rank0_write, paths.final_dir, token);
  const std::string final_meta = (fs::path(partial) / meta_name).string();
  const std::string tmp_meta = final_meta + ".tmp";
  {
    detail::OutputFile out(tmp_meta, 1 << 20, options.fsync());
    out.write(bytes.data(), bytes.size());
    out.close();
  }
  detail::maybe_inject(fault, rank, SavePhase::kMetadata);
  detail::rename_path(tmp_meta, final_meta);
  if (options.fsync()) detail::fsync_dir(partial);
  detail::maybe_inject(fault, rank, SavePhase::kCommit);
  std::string replaced;
  if (fs::exists(paths.final_dir)) {  // overwrite: move the old one aside first
    replaced = detail::partial_dir(paths, "replaced-" + random_token());
    detail::rename_path(paths.final_dir, replaced);
  }
  detail::rename_path(partial, paths.final_dir);
  *committed = true;
  if (options.fsync()) detail::fsync_dir(paths.parent);
  if (!replaced.empty()) remove_quietly(replaced);
  detail::maybe_inject(fault, rank, SavePhase::kAfterCommit);
}

}  // namespace

void save(const ShardedStateDict& state, const ExtraState& extra, const std::string& dir,
          const SaveOptions& options) {
  detail::save_or_report_failure(state, extra, dir, options, "");
}

void detail::save_or_report_failure(const ShardedStateDict& state, const ExtraState& extra,
                                    const std::string& dir, const SaveOptions& options,
                                    const std::string& local_failure) {
  CoordinatorPtr coordinator =
      options.coordinator() ? options.coordinator() : default_coordinator();
  const int rank = coordinator->rank();
  const FaultInjection fault = detail::resolve_fault(options.fault());
  TDIST_CHECK_ARG(
      options.checksum_block_bytes() > 0 && options.checksum_block_bytes() % kChunkAlignment == 0,
      "checkpoint: checksum_block_bytes must be a positive multiple of 64");
  const detail::CheckpointPaths paths = detail::checkpoint_paths(dir);
  const std::string operation = "save of '" + paths.final_dir + "'";

  // ---- Phase 1: plan. Rank 0 prepares the hidden directory; everyone describes its state.
  const Report plan_report =
      plan_report_of(state, extra, paths, options, rank, fault, local_failure);
  std::string my_partial;  // rank 0: the directory it created, removed on any failure
  if (rank == 0 && plan_report.ok) {
    my_partial = detail::partial_dir(paths, plan_report.payload.at("token").get<std::string>());
  }
  // A failed agreement (a rank crashed) must not leave rank 0's directory behind.
  auto agree = [&](const Report& report) {
    try {
      return detail::exchange(*coordinator, report, operation);
    } catch (const CheckpointError&) {
      if (!my_partial.empty()) remove_quietly(my_partial);
      throw;
    }
  };
  const auto plans = agree(plan_report);
  std::string failures = detail::describe_failures(plans);
  std::map<std::string, TensorInfo> tensors;
  std::vector<PlannedChunk> plan;
  if (failures.empty()) {
    try {
      plan = make_plan(plans, &tensors);
    } catch (const std::exception& e) {
      failures = e.what();  // identical on every rank: it only read the gathered plans
    }
  }
  if (!failures.empty()) {
    if (!my_partial.empty()) remove_quietly(my_partial);
    TDIST_THROW(CheckpointError, "checkpoint: " + operation + " failed before writing: " +
                                     failures + ". The previous checkpoint is untouched");
  }
  const std::string partial =
      detail::partial_dir(paths, plans[0].payload.at("token").get<std::string>());

  // ---- Phase 2: every rank writes its own file, in parallel.
  Report write_report;
  try {
    write_report.payload =
        options.format() == CheckpointFormat::kDCP
            ? write_dcp_rank_file(state, plan, plans, rank, partial, options, fault)
            : write_shard_file(state, plan, rank, partial, options, fault);
    write_report.payload["extra"] = extra.to_json();
    detail::maybe_inject(fault, rank, SavePhase::kAfterWrite);
  } catch (const std::exception& e) {
    write_report = Report{false, e.what()};
  }
  const auto writes = agree(write_report);
  failures = detail::describe_failures(writes);
  if (!failures.empty()) {
    if (rank == 0) remove_quietly(partial);
    TDIST_THROW(CheckpointError, "checkpoint: " + operation +
                                     " failed while writing data: " + failures +
                                     ". Nothing was committed; the previous "
                                     "checkpoint is untouched");
  }

  // ---- Phase 3: rank 0 commits: metadata by rename, then the directory by rename.
  Report commit_report;
  if (rank == 0) {
    bool committed = false;
    try {
      CheckpointMetadata metadata = assemble_metadata(writes, std::move(tensors));
      metadata.format = options.format();
      commit_on_rank0(metadata, writes[0].payload, plans[0].payload.at("token").get<std::string>(),
                      partial, paths, options, fault, &committed);
      my_partial.clear();
    } catch (const std::exception& e) {
      commit_report = Report{false, e.what()};
      if (!committed) remove_quietly(partial);
    }
  }
  const auto commits = detail::exchange(*coordinator, commit_report, operation);
  failures = detail::describe_failures(commits);
  if (!failures.empty()) {
    TDIST_THROW(CheckpointError, "checkpoint: " + operation + " failed to commit: " + failures);
  }
}

}  // namespace tdist::checkpoint
