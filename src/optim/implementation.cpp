#include "tdist/optim/implementation.h"

#include "tdist/error.h"

namespace tdist::optim {

std::string to_string(Implementation implementation) {
  switch (implementation) {
    case Implementation::kDefault:
      return "default";
    case Implementation::kForLoop:
      return "for-loop";
    case Implementation::kForeach:
      return "foreach";
    case Implementation::kFused:
      return "fused";
  }
  return "?";
}

Implementation implementation_from_string(const std::string& name) {
  for (auto i : {Implementation::kDefault, Implementation::kForLoop, Implementation::kForeach,
                 Implementation::kFused}) {
    if (to_string(i) == name) return i;
  }
  TDIST_THROW(InvalidArgument, "optimizer implementation '" + name +
                                   "' is not one of default, for-loop, foreach, fused");
}

}  // namespace tdist::optim
