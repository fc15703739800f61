#pragma once

// Names around a checkpoint directory <parent>/<name>: the hidden partial directory a save
// writes into is <parent>/.<name>.partial-<token>.

#include <string>

namespace tdist::checkpoint::detail {

struct CheckpointPaths {
  std::string final_dir;  // absolute, no trailing slash
  std::string parent;
  std::string name;
};

CheckpointPaths checkpoint_paths(const std::string& dir);
std::string partial_dir(const CheckpointPaths& paths, const std::string& token);

}  // namespace tdist::checkpoint::detail
