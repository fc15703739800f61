// load(): each rank reads, for every tensor it asks for, exactly the saved chunks that meet
// its box (rounded out to checksum blocks), verifies them and copies them in place.

#include <filesystem>
#include <memory>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "checkpoint/agreement.h"
#include "checkpoint/block_reader.h"
#include "checkpoint/box.h"
#include "checkpoint/dtype.h"
#include "checkpoint/torch_blob.h"
#include "checkpoint/zip_check.h"
#include "tdist/checkpoint/checkpoint.h"
#include "tdist/detail/util/text.h"
#include "tdist/error.h"

namespace tdist::checkpoint {
namespace {

namespace fs = std::filesystem;
using detail::Box;
using nlohmann::json;

std::string shape_string(const std::vector<int64_t>& shape) {
  return json(shape).dump();
}

/// The saved values of `chunk`'s box `common` (within the chunk's box `saved`).
at::Tensor read_raw(const std::string& name, const TensorInfo& info, const ChunkInfo& chunk,
                    const Box& saved, const Box& common, detail::BlockReader& reader,
                    at::Tensor* keep_alive) {
  const auto dtype = detail::dtype_from_name(info.dtype, "'" + name + "'");
  const int64_t element = static_cast<int64_t>(c10::elementSize(dtype));
  if (chunk.byte_length != saved.numel() * element) {
    TDIST_THROW(CheckpointError, "checkpoint: metadata of '" + name +
                                     "' is inconsistent (chunk of " +
                                     std::to_string(chunk.byte_length) + " bytes for " +
                                     std::to_string(saved.numel()) + " elements)");
  }
  const detail::ElementRange range = detail::element_range(saved, common);
  *keep_alive = reader.read(chunk.file, chunk.byte_offset + range.first * element,
                            (range.end - range.first) * element);
  return at::from_blob(keep_alive->data_ptr(), common.sizes, range.strides,
                       at::TensorOptions().dtype(dtype));  // a view of *keep_alive
}

/// A DCP chunk is one torch.save of the chunk: decoded whole, then narrowed to `common`.
at::Tensor read_torch_saved(const std::string& name, const ChunkInfo& chunk, const Box& saved,
                            const Box& common, detail::BlockReader& reader) {
  // Consumed (copied into the target) before the next chunk is read.
  const at::Tensor bytes = reader.read_transient(chunk.file, chunk.byte_offset, chunk.byte_length);
  const std::string where = "the chunk of '" + name + "' at offsets " + json(chunk.offsets).dump() +
                            " in '" + chunk.file + "'";
  if (reader.verifies()) detail::check_zip_crcs(bytes.data_ptr(), bytes.numel(), where);
  const c10::IValue value = detail::torch_load_in_place(bytes, where);
  if (!value.isTensor() || value.toTensor().sizes().vec() != saved.sizes) {
    TDIST_THROW(CheckpointError, "checkpoint: " + where + " does not hold a tensor of sizes " +
                                     json(saved.sizes).dump() + "; the checkpoint is corrupt");
  }
  at::Tensor source = value.toTensor();
  for (size_t d = 0; d < common.sizes.size(); ++d) {
    source = source.narrow(static_cast<int64_t>(d), common.offsets[d] - saved.offsets[d],
                           common.sizes[d]);
  }
  return source;
}

/// Copies the part of `chunk` that meets `target` into `local` (whose box is target).
int64_t copy_overlap(const std::string& name, const TensorInfo& info, const ChunkInfo& chunk,
                     CheckpointFormat format, const Box& target, const at::Tensor& local,
                     detail::BlockReader& reader) {
  const Box saved{chunk.offsets, chunk.sizes};
  const Box common = detail::intersect(saved, target);
  if (common.numel() == 0) return 0;
  at::Tensor keep_alive;
  const at::Tensor source = format == CheckpointFormat::kDCP
                                ? read_torch_saved(name, chunk, saved, common, reader)
                                : read_raw(name, info, chunk, saved, common, reader, &keep_alive);
  at::Tensor dest = local;
  for (size_t d = 0; d < common.sizes.size(); ++d) {
    dest = dest.narrow(static_cast<int64_t>(d), common.offsets[d] - target.offsets[d],
                       common.sizes[d]);
  }
  dest.copy_(source);  // DCP: converts the dtype, as Python's dcp.load does
  return common.numel();
}

void load_one(const std::string& name, ShardedTensor& st, const TensorInfo& info,
              CheckpointFormat format, detail::BlockReader& reader) {
  if (st.global_shape != info.global_shape) {
    TDIST_THROW(CheckpointError, "checkpoint: '" + name + "' was saved with shape " +
                                     shape_string(info.global_shape) + " but is requested as " +
                                     shape_string(st.global_shape) +
                                     "; the model definition differs from the saved one");
  }
  const std::string dtype = detail::dtype_name(st.local.scalar_type());
  if (dtype != info.dtype && format == CheckpointFormat::kTdist) {
    TDIST_THROW(CheckpointError, "checkpoint: '" + name + "' was saved as " + info.dtype +
                                     " but the target is " + dtype +
                                     "; load into a tensor of the saved dtype, then convert");
  }
  const Box target{st.offsets, st.local.sizes().vec()};
  if (!detail::box_within(target, st.global_shape)) {
    TDIST_THROW(InvalidArgument, "checkpoint: '" + name + "': the local slice does not fit " +
                                     shape_string(st.global_shape));
  }
  if (target.numel() == 0) return;
  int64_t covered = 0;
  for (const auto& chunk : info.chunks) {
    covered += copy_overlap(name, info, chunk, format, target, st.local, reader);
  }
  if (covered != target.numel()) {
    TDIST_THROW(CheckpointError, "checkpoint: the saved chunks of '" + name + "' cover " +
                                     std::to_string(covered) + " of the " +
                                     std::to_string(target.numel()) +
                                     " elements requested; the metadata is corrupt");
  }
}

}  // namespace

LoadResult load(ShardedStateDict& state, const std::string& dir, const LoadOptions& options) {
  CoordinatorPtr coordinator =
      options.coordinator() ? options.coordinator() : default_coordinator();
  const int rank = coordinator->rank();
  const std::string operation = "load of '" + dir + "'";
  LoadResult result;
  detail::Report report;
  try {
    const CheckpointMetadata metadata = read_metadata(dir);
    detail::BlockReader reader(dir, metadata.files, options.verify());
    c10::AutoGradMode no_grad(false);  // targets are often leaf parameters
    std::vector<std::string> missing;
    for (auto& [name, st] : state) {
      auto it = metadata.tensors.find(name);
      if (it == metadata.tensors.end()) {
        missing.push_back(name);
        continue;
      }
      load_one(name, st, it->second, metadata.format, reader);
    }
    for (const auto& [name, info] : metadata.tensors) {
      if (state.count(name) == 0) result.unexpected_keys.push_back(name);
    }
    if (!missing.empty() && options.strict()) {
      TDIST_THROW(CheckpointError, "checkpoint: '" + dir + "' has no tensor named " +
                                       util::join(missing) +
                                       " (pass LoadOptions().strict(false) to skip them)");
    }
    result.missing_keys = std::move(missing);
    result.saved_world_size = metadata.world_size;
    const bool same_world = metadata.world_size == coordinator->world_size() &&
                            rank < static_cast<int>(metadata.extra_per_rank.size());
    if (!metadata.extra_per_rank.empty()) {
      result.extra = metadata.extra_per_rank[same_world ? rank : 0];
    }
    result.bytes_read = reader.bytes_read();
  } catch (const std::exception& e) {
    report = detail::Report{false, e.what()};
  }
  const auto reports = detail::exchange(*coordinator, report, operation);
  const std::string failures = detail::describe_failures(reports);
  if (!failures.empty()) {
    TDIST_THROW(CheckpointError, "checkpoint: " + operation + " failed: " + failures);
  }
  return result;
}

std::string to_string(CheckpointStatus status) {
  switch (status) {
    case CheckpointStatus::kComplete:
      return "complete";
    case CheckpointStatus::kIncomplete:
      return "incomplete";
    case CheckpointStatus::kCorrupt:
      return "corrupt";
    case CheckpointStatus::kMissing:
      return "missing";
  }
  return "?";
}

VerifyReport verify(const std::string& dir, bool read_data) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {CheckpointStatus::kMissing, "no directory '" + dir + "'"};
  const std::string base = fs::path(dir).lexically_normal().filename().string();
  if (is_partial_dir_name(base)) {
    return {CheckpointStatus::kIncomplete, "'" + dir + "' is a save that never committed"};
  }
  if (!fs::exists(fs::path(dir) / kMetadataFile) && !fs::exists(fs::path(dir) / kDCPMetadataFile)) {
    return {CheckpointStatus::kIncomplete,
            "'" + dir + "' has no " + kMetadataFile + ": its save never committed"};
  }
  try {
    const CheckpointMetadata metadata = read_metadata(dir);
    detail::BlockReader reader(dir, metadata.files, true);
    for (const auto& [file, info] : metadata.files) {
      reader.check_size(file);
      if (read_data && metadata.format == CheckpointFormat::kTdist) reader.verify_whole(file);
    }
    for (const auto& [name, t] : metadata.tensors) {
      for (const auto& c : t.chunks) {
        auto it = metadata.files.find(c.file);
        if (it == metadata.files.end() || c.byte_offset < 0 ||
            c.byte_offset + c.byte_length > it->second.size) {
          return {CheckpointStatus::kCorrupt, "metadata of '" + dir + "': a chunk of '" + name +
                                                  "' points outside file '" + c.file + "'"};
        }
        if (read_data && metadata.format == CheckpointFormat::kDCP) {
          const Box box{c.offsets, c.sizes};
          read_torch_saved(name, c, box, box, reader);  // checks its records' CRC-32
        }
      }
    }
  } catch (const std::exception& e) {
    return {CheckpointStatus::kCorrupt, e.what()};
  }
  return {CheckpointStatus::kComplete, ""};
}

}  // namespace tdist::checkpoint
