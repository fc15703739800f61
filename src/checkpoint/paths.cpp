#include "checkpoint/paths.h"

#include <filesystem>

#include "tdist/checkpoint/checkpoint.h"
#include "tdist/error.h"

namespace tdist::checkpoint {
namespace detail {

CheckpointPaths checkpoint_paths(const std::string& dir) {
  TDIST_CHECK_ARG(!dir.empty(), "checkpoint: the directory is empty");
  auto p = std::filesystem::absolute(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "a/b/" -> "a/b"
  TDIST_CHECK_ARG(!p.filename().empty() && p.has_parent_path(),
                  "checkpoint: '" + dir + "' cannot be a checkpoint directory");
  return CheckpointPaths{p.string(), p.parent_path().string(), p.filename().string()};
}

std::string partial_dir(const CheckpointPaths& paths, const std::string& token) {
  return (std::filesystem::path(paths.parent) / ("." + paths.name + ".partial-" + token)).string();
}

}  // namespace detail

bool is_partial_dir_name(const std::string& name) {
  return !name.empty() && name[0] == '.' && name.find(".partial-") != std::string::npos;
}

}  // namespace tdist::checkpoint
