#include "tdist/checkpoint/checkpoint_manager.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "checkpoint/agreement.h"
#include "tdist/error.h"

namespace tdist::checkpoint {
namespace {

namespace fs = std::filesystem;
constexpr const char* kStepPrefix = "step_";
constexpr const char* kTrashPrefix = ".trash-";

/// "step_00000120" -> 120; -1 if the name is not a step directory.
int64_t parse_step(const std::string& name) {
  if (name.compare(0, 5, kStepPrefix) != 0 || name.size() == 5) return -1;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

}  // namespace

CheckpointManager::CheckpointManager(std::string root, CheckpointManagerOptions options)
    : root_(std::move(root)), options_(std::move(options)) {
  TDIST_CHECK_ARG(options_.keep_last() >= 1, "CheckpointManager: keep_last must be >= 1, got " +
                                                 std::to_string(options_.keep_last()));
}

CoordinatorPtr CheckpointManager::coordinator() {
  // One coordinator for the manager's lifetime: every rank makes the same calls in order.
  if (!coordinator_) {
    coordinator_ = options_.coordinator() ? options_.coordinator() : default_coordinator();
  }
  return coordinator_;
}

std::string CheckpointManager::path_for(int64_t step) const {
  char name[40];
  std::snprintf(name, sizeof(name), "%s%08lld", kStepPrefix, static_cast<long long>(step));
  return (fs::path(root_) / name).string();
}

std::string CheckpointManager::save(int64_t step, const ShardedStateDict& state,
                                    const ExtraState& extra) {
  TDIST_CHECK_ARG(step >= 0, "CheckpointManager::save: step must be >= 0");
  wait();
  SaveOptions options = options_.save_options();
  options.coordinator(coordinator());
  const std::string dir = path_for(step);
  checkpoint::save(state, extra, dir, options);
  if (coordinator()->rank() == 0) apply_retention();
  return dir;
}

SaveFuture CheckpointManager::async_save(int64_t step, const ShardedStateDict& state,
                                         const ExtraState& extra) {
  TDIST_CHECK_ARG(step >= 0, "CheckpointManager::async_save: step must be >= 0");
  if (!async_) async_ = std::make_unique<AsyncCheckpointer>(options_.coordinator());
  const bool rank0 = coordinator()->rank() == 0;
  auto retention = [this, rank0] {
    if (rank0) apply_retention();
  };
  SaveOptions options = options_.save_options();
  options.coordinator(nullptr);  // the checkpointer's own (Note [Async save's agreement])
  return async_->save(state, extra, path_for(step), options, retention);
}

void CheckpointManager::wait() {
  if (async_) async_->wait();
}

std::vector<CheckpointEntry> CheckpointManager::list() const {
  std::vector<CheckpointEntry> out;
  std::error_code ec;
  if (!fs::is_directory(root_, ec)) return out;
  for (const auto& entry : fs::directory_iterator(root_, ec)) {
    const std::string name = entry.path().filename().string();
    if (is_partial_dir_name(name)) {
      // ".step_00000120.partial-<token>"
      const auto end = name.find(".partial-");
      out.push_back({parse_step(name.substr(1, end - 1)), entry.path().string(),
                     CheckpointStatus::kIncomplete, "a save that never committed"});
      continue;
    }
    const int64_t step = parse_step(name);
    if (step < 0) continue;
    const VerifyReport report = verify(entry.path().string(), /*read_data=*/false);
    out.push_back({step, entry.path().string(), report.status, report.detail});
  }
  std::sort(out.begin(), out.end(), [](const CheckpointEntry& a, const CheckpointEntry& b) {
    return a.step != b.step ? a.step < b.step : a.path < b.path;
  });
  return out;
}

void CheckpointManager::apply_retention() {
  // Delete by renaming out of sight first: a crash mid-delete never leaves a step directory
  // with some of its files gone.
  const auto entries = list();
  std::vector<const CheckpointEntry*> complete;
  for (const auto& e : entries) {
    if (e.status == CheckpointStatus::kComplete) complete.push_back(&e);
  }
  if (complete.empty()) return;
  const int64_t newest = complete.back()->step;
  const size_t keep = static_cast<size_t>(options_.keep_last());
  std::vector<std::string> doomed;
  // First a deletion a crash interrupted (already out of sight): its name may be needed.
  std::error_code list_ec;
  for (const auto& entry : fs::directory_iterator(root_, list_ec)) {
    if (entry.path().filename().string().rfind(kTrashPrefix, 0) == 0) {
      doomed.push_back(entry.path().string());
    }
  }
  for (size_t i = 0; i + keep < complete.size(); ++i) doomed.push_back(complete[i]->path);
  for (const auto& e : entries) {
    if (e.status != CheckpointStatus::kComplete && e.step < newest) doomed.push_back(e.path);
  }
  for (const auto& path : doomed) {
    std::error_code ec;
    const fs::path p(path);
    const bool in_trash = p.filename().string().rfind(kTrashPrefix, 0) == 0;
    const fs::path trash = in_trash ? p : p.parent_path() / (kTrashPrefix + p.filename().string());
    if (!in_trash) fs::rename(p, trash, ec);
    fs::remove_all(ec ? p : trash, ec);
    if (ec) {
      std::cerr << "tdist checkpoint: warning: could not delete old checkpoint '" << path
                << "': " << ec.message() << "\n";
    }
  }
}

std::optional<LoadResult> CheckpointManager::load_latest(ShardedStateDict& state,
                                                         const LoadOptions& options) {
  return load_latest([&state](const std::string& dir,
                              const LoadOptions& o) { return checkpoint::load(state, dir, o); },
                     options);
}

std::optional<LoadResult> CheckpointManager::load_latest(const Loader& loader,
                                                         const LoadOptions& options) {
  wait();
  auto coord = coordinator();
  // Rank 0 picks the candidates (newest first) so every rank walks the same list.
  detail::Report mine;
  if (coord->rank() == 0) {
    nlohmann::json candidates = nlohmann::json::array();
    const auto entries = list();
    for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
      if (it->status != CheckpointStatus::kComplete) {
        std::cerr << "tdist checkpoint: warning: skipping " << to_string(it->status)
                  << " checkpoint '" << it->path << "': " << it->detail << "\n";
        continue;
      }
      if (options_.verify_before_load()) {
        const VerifyReport report = verify(it->path, /*read_data=*/true);
        if (report.status != CheckpointStatus::kComplete) {
          std::cerr << "tdist checkpoint: warning: skipping corrupt checkpoint '" << it->path
                    << "': " << report.detail << "\n";
          continue;
        }
      }
      candidates.push_back(it->path);
    }
    mine.payload["candidates"] = candidates;
  }
  const auto reports = detail::exchange(*coord, mine, "listing of '" + root_ + "'");
  LoadOptions load_options = options;
  load_options.coordinator(coord);
  for (const auto& path : reports[0].payload.at("candidates")) {
    try {
      return loader(path.get<std::string>(), load_options);
    } catch (const CheckpointError& e) {
      // load() agreed: every rank failed this candidate, so every rank moves on together.
      if (coord->rank() == 0) {
        std::cerr << "tdist checkpoint: warning: skipping checkpoint '" << path.get<std::string>()
                  << "' that failed to load: " << e.what() << "\n";
      }
    }
  }
  return std::nullopt;
}

}  // namespace tdist::checkpoint
