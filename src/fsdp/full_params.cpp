#include "tdist/fsdp/full_params.h"

#include "fsdp/fsdp_state.h"
#include "fsdp/registry.h"
#include "tdist/error.h"

namespace tdist::fsdp {

SummonFullParams::SummonFullParams(const torch::nn::Module& module,
                                   const SummonFullParamsOptions& options)
    : options_(options) {
  std::vector<detail::FSDPState*> states = detail::states_under(module);
  if (states.empty()) {
    TDIST_THROW(InvalidArgument, "summon_full_params: no module under '" + module.name() +
                                     "' was passed to fully_shard");
  }
  for (detail::FSDPState* s : states) {
    if (detail::ParamGroup* g = s->group()) {
      g->summon(options.with_grads());
      modules_.emplace_back(detail::find_state_ptr(*s->module().lock()));
    }
  }
}

SummonFullParams::~SummonFullParams() noexcept(false) {
  // Reverse order; a failure on one module must not leave the others summoned.
  std::exception_ptr first_error;
  for (auto it = modules_.rbegin(); it != modules_.rend(); ++it) {
    try {
      detail::state_of(*it).group()->unsummon(options_.writeback());
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error && std::uncaught_exceptions() == 0) std::rethrow_exception(first_error);
}

}  // namespace tdist::fsdp
