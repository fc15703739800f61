// tdist::optim: every implementation of Adam, AdamW and SGD follows LibTorch's torch::optim
// for 100 steps within 1e-6 (relative) for every option combination (maximize: the same trajectory
// as torch::optim on the negated gradient), param groups with their own options, the LibTorch state
// layout (saved, loaded and continued; switched between implementations), LR schedulers, and what
// each implementation refuses, by parameter. The sync-free clip_grad_norm_ equals LibTorch's
// torch::nn::utils::clip_grad_norm_.

#include <cmath>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/expect.h"
#include "tdist/detail/util/optimizer_state.h"
#include "tdist/optim/adam.h"
#include "tdist/optim/clip_grad.h"
#include "tdist/optim/sgd.h"

namespace optim = tdist::optim;
using optim::Implementation;
using tdist::testing::error_of;

namespace {

constexpr int kSteps = 100;
const Implementation kAll[] = {Implementation::kForLoop, Implementation::kForeach,
                               Implementation::kFused};

// Parameters of several shapes and two dtypes (two buckets for the multi-tensor paths).
std::vector<at::Tensor> make_params() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  std::vector<at::Tensor> out;
  for (auto shape : std::vector<std::vector<int64_t>>{{7, 5}, {3}, {}, {2, 3, 4}}) {
    out.push_back(at::randn(shape, gen, at::kFloat));
  }
  out.push_back(at::randn({6}, gen, at::kDouble));
  return out;
}

std::vector<at::Tensor> clones(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params) out.push_back(p.clone());
  return out;
}

// A deterministic gradient: a pull towards zero (so trajectories contract instead of
// amplifying rounding, which a chaotic loss would do for PyTorch's own implementations too)
// plus a drive that changes every step, sometimes tiny (where Adam's normalisation is most
// sensitive).
void set_grads(const std::vector<at::Tensor>& params, int step, double sign) {
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    const double scale = (step % 7 == 3) ? 1e-4 : 1.0;
    const at::Tensor drive =
        at::sin(at::arange(p.numel(), p.options()).reshape(p.sizes()) * 0.7 +
                static_cast<double>(step) * (1.0 + static_cast<double>(i)) * 0.3);
    p.mutable_grad() = sign * scale * (0.1 * p + drive);
  }
}

// The largest difference, relative to the reference's magnitude (at least 1): momentum SGD
// takes parameters to tens, where float32's own spacing is above 1e-6.
double max_diff(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double scale = std::max(1.0, b[i].abs().max().item<double>());
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>() / scale);
  }
  return worst;
}

// Steps `ours` and `reference` (torch::optim, on the gradient times `reference_sign`).
double run_pair(torch::optim::Optimizer& ours, const std::vector<at::Tensor>& p_ours,
                torch::optim::Optimizer& reference, const std::vector<at::Tensor>& p_ref,
                double reference_sign, int steps = kSteps) {
  for (int s = 0; s < steps; ++s) {
    set_grads(p_ours, s, 1.0);
    set_grads(p_ref, s, reference_sign);
    ours.step();
    reference.step();
  }
  return max_diff(p_ours, p_ref);
}

struct AdamCase {
  double weight_decay;
  bool amsgrad, maximize;
};

std::vector<AdamCase> adam_cases() {
  std::vector<AdamCase> out;
  for (double wd : {0.0, 0.1}) {
    for (bool ams : {false, true}) {
      for (bool max : {false, true}) out.push_back({wd, ams, max});
    }
  }
  return out;
}

std::string name_of(Implementation impl, const AdamCase& c) {
  std::ostringstream s;
  s << optim::to_string(impl) << " wd=" << c.weight_decay << " amsgrad=" << c.amsgrad
    << " maximize=" << c.maximize;
  return s.str();
}

}  // namespace

TEST(Optim, AdamWEqualsLibTorchForEveryImplementationAndOption) {
  for (auto impl : kAll) {
    for (const auto& c : adam_cases()) {
      SCOPED_TRACE(name_of(impl, c));
      auto a = make_params(), b = clones(a);
      optim::AdamW ours(a, optim::AdamWOptions(1e-2)
                               .weight_decay(c.weight_decay)
                               .amsgrad(c.amsgrad)
                               .maximize(c.maximize)
                               .implementation(impl));
      EXPECT_EQ(ours.implementation(), impl);
      torch::optim::AdamW ref(
          b, torch::optim::AdamWOptions(1e-2).weight_decay(c.weight_decay).amsgrad(c.amsgrad));
      EXPECT_LE(run_pair(ours, a, ref, b, c.maximize ? -1.0 : 1.0), 1e-6);
    }
  }
}

TEST(Optim, AdamEqualsLibTorchForEveryImplementationAndOption) {
  for (auto impl : kAll) {
    for (const auto& c : adam_cases()) {
      SCOPED_TRACE(name_of(impl, c));
      auto a = make_params(), b = clones(a);
      optim::Adam ours(a, optim::AdamOptions(1e-2)
                              .betas({0.8, 0.99})
                              .eps(1e-6)
                              .weight_decay(c.weight_decay)
                              .amsgrad(c.amsgrad)
                              .maximize(c.maximize)
                              .implementation(impl));
      torch::optim::Adam ref(b, torch::optim::AdamOptions(1e-2)
                                    .betas({0.8, 0.99})
                                    .eps(1e-6)
                                    .weight_decay(c.weight_decay)
                                    .amsgrad(c.amsgrad));
      EXPECT_LE(run_pair(ours, a, ref, b, c.maximize ? -1.0 : 1.0), 1e-6);
    }
  }
}

TEST(Optim, SGDEqualsLibTorchForEveryImplementationAndOption) {
  for (auto impl : kAll) {
    for (double momentum : {0.0, 0.9}) {
      for (double dampening : {0.0, 0.2}) {
        for (bool nesterov : {false, true}) {
          if (nesterov && (momentum == 0 || dampening != 0)) continue;  // PyTorch refuses
          for (double wd : {0.0, 0.01}) {
            for (bool maximize : {false, true}) {
              SCOPED_TRACE(optim::to_string(impl) + " momentum=" + std::to_string(momentum) +
                           " dampening=" + std::to_string(dampening) +
                           " nesterov=" + std::to_string(nesterov) + " wd=" + std::to_string(wd) +
                           " maximize=" + std::to_string(maximize));
              auto a = make_params(), b = clones(a);
              optim::SGD ours(a, optim::SGDOptions(0.05)
                                     .momentum(momentum)
                                     .dampening(dampening)
                                     .nesterov(nesterov)
                                     .weight_decay(wd)
                                     .maximize(maximize)
                                     .implementation(impl));
              EXPECT_EQ(ours.implementation(), impl);
              torch::optim::SGD ref(b, torch::optim::SGDOptions(0.05)
                                           .momentum(momentum)
                                           .dampening(dampening)
                                           .nesterov(nesterov)
                                           .weight_decay(wd));
              EXPECT_LE(run_pair(ours, a, ref, b, maximize ? -1.0 : 1.0), 1e-6);
            }
          }
        }
      }
    }
  }
}

// The comparison above can fail: a wrong learning rate is seen.
TEST(Optim, TheComparisonSeesADifferentTrajectory) {
  auto a = make_params(), b = clones(a);
  optim::AdamW ours(a, optim::AdamWOptions(1e-2).implementation(Implementation::kFused));
  torch::optim::AdamW ref(b, torch::optim::AdamWOptions(1.01e-2));
  EXPECT_GT(run_pair(ours, a, ref, b, 1.0), 1e-4);
}

// Groups keep their own options, LibTorch-typed ones included (maximize and implementation
// then come from the optimizer's defaults); parameters without a gradient are skipped.
TEST(Optim, ParamGroupsKeepTheirOwnOptions) {
  for (auto impl : kAll) {
    SCOPED_TRACE(optim::to_string(impl));
    auto a = make_params(), b = clones(a);
    std::vector<torch::optim::OptimizerParamGroup> ga, gb;
    ga.emplace_back(std::vector<at::Tensor>{a[0], a[1]},
                    std::make_unique<optim::AdamWOptions>(
                        optim::AdamWOptions(3e-2).weight_decay(0).implementation(impl)));
    ga.emplace_back(std::vector<at::Tensor>{a[2], a[3], a[4]},
                    std::make_unique<torch::optim::AdamWOptions>(
                        torch::optim::AdamWOptions(5e-3).weight_decay(0.2)));
    gb.emplace_back(std::vector<at::Tensor>{b[0], b[1]},
                    std::make_unique<torch::optim::AdamWOptions>(
                        torch::optim::AdamWOptions(3e-2).weight_decay(0)));
    gb.emplace_back(std::vector<at::Tensor>{b[2], b[3], b[4]},
                    std::make_unique<torch::optim::AdamWOptions>(
                        torch::optim::AdamWOptions(5e-3).weight_decay(0.2)));
    optim::AdamW ours(ga, optim::AdamWOptions().implementation(impl));
    torch::optim::AdamW ref(gb);
    EXPECT_EQ(ours.implementation(1), impl);
    EXPECT_NE(dynamic_cast<const optim::AdamWOptions*>(&ours.param_groups()[1].options()), nullptr);
    for (int s = 0; s < 30; ++s) {
      set_grads(a, s, 1.0), set_grads(b, s, 1.0);
      if (s % 5 == 0) a[3].mutable_grad() = at::Tensor(), b[3].mutable_grad() = at::Tensor();
      ours.step(), ref.step();
    }
    EXPECT_LE(max_diff(a, b), 1e-6);
    EXPECT_EQ(
        static_cast<torch::optim::AdamWParamState&>(*ours.state().at(a[3].unsafeGetTensorImpl()))
            .step(),
        24);
  }
}

// The state is LibTorch's: saved with torch::save, loaded into a fresh optimizer of another
// implementation, it continues as the original does; tdist's state-dict field access reads it.
TEST(Optim, StateIsLibTorchsAndContinuesAcrossSaveLoadAndImplementations) {
  auto a = make_params(), b = clones(a);
  optim::AdamW first(
      a, optim::AdamWOptions(1e-2).amsgrad(true).implementation(Implementation::kFused));
  optim::AdamW whole(
      b, optim::AdamWOptions(1e-2).amsgrad(true).implementation(Implementation::kForeach));
  run_pair(first, a, whole, b, 1.0, 40);
  const auto fields = tdist::util::optimizer_state_fields(first, a[0], a[0]);
  ASSERT_EQ(fields.size(), 4u);  // step, exp_avg, exp_avg_sq, max_exp_avg_sq
  EXPECT_EQ(fields[0].name, "step");
  EXPECT_EQ(fields[0].tensor.item<int64_t>(), 40);

  std::stringstream archive;
  torch::save(first, archive);
  optim::AdamW resumed(
      a, optim::AdamWOptions(1e-2).amsgrad(true).implementation(Implementation::kForLoop));
  torch::load(resumed, archive);
  run_pair(resumed, a, whole, b, 1.0, 30);
  EXPECT_LE(max_diff(a, b), 1e-6);
  // Back to fused: its step tensors are refilled from the state's step (70, not 40).
  optim::AdamW fused_again(
      a, optim::AdamWOptions(1e-2).amsgrad(true).implementation(Implementation::kFused));
  std::stringstream archive2;
  torch::save(resumed, archive2);
  torch::load(fused_again, archive2);
  run_pair(fused_again, a, whole, b, 1.0, 30);
  EXPECT_LE(max_diff(a, b), 1e-6);
}

TEST(Optim, LibTorchLRSchedulersDriveIt) {
  auto a = make_params(), b = clones(a);
  optim::AdamW ours(a, optim::AdamWOptions(0.1).implementation(Implementation::kFused));
  torch::optim::AdamW ref(b, torch::optim::AdamWOptions(0.1));
  torch::optim::StepLR ours_schedule(ours, /*step_size=*/2, /*gamma=*/0.5);
  torch::optim::StepLR ref_schedule(ref, /*step_size=*/2, /*gamma=*/0.5);
  for (int s = 0; s < 6; ++s) {
    set_grads(a, s, 1.0), set_grads(b, s, 1.0);
    ours.step(), ref.step();
    ours_schedule.step(), ref_schedule.step();
  }
  EXPECT_LT(ours.param_groups()[0].options().get_lr(), 0.1);
  EXPECT_DOUBLE_EQ(ours.param_groups()[0].options().get_lr(),
                   ref.param_groups()[0].options().get_lr());
  EXPECT_LE(max_diff(a, b), 1e-6);
}

TEST(Optim, DefaultIsPyTorchsChoice) {
  auto a = make_params();
  EXPECT_EQ(optim::AdamW(a).implementation(), Implementation::kForLoop);  // CPU parameters
  EXPECT_EQ(optim::SGD(a, optim::SGDOptions(0.1)).implementation(), Implementation::kForLoop);
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device: the default for CUDA parameters (foreach) is not checked";
  }
  auto c = at::randn({4}, at::kCUDA);
  EXPECT_EQ(optim::AdamW(std::vector<at::Tensor>{c}).implementation(), Implementation::kForeach);
}

TEST(Optim, RefusesWhatAnImplementationCannotTakeByParameter) {
  auto ok = at::randn({3});
  auto complex = at::randn({3}, at::kComplexFloat);
  ok.mutable_grad() = at::ones_like(ok);
  complex.mutable_grad() = at::ones_like(complex);
  optim::AdamW fused({ok, complex}, optim::AdamWOptions().implementation(Implementation::kFused));
  const std::string e = error_of([&] { fused.step(); });
  EXPECT_NE(e.find("parameter 1 of param group 0 is ComplexFloat on cpu"), std::string::npos) << e;
  EXPECT_NE(e.find("kForeach or kForLoop"), std::string::npos) << e;

  auto sparse = at::randn({4});
  sparse.mutable_grad() = at::ones({4}).to_sparse();
  optim::SGD sgd({ok, sparse}, optim::SGDOptions(0.1).implementation(Implementation::kForeach));
  EXPECT_NE(error_of([&] { sgd.step(); }).find("parameter 1 of param group 0 has a sparse"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              optim::implementation_from_string("fast");
            }).find("'fast' is not one of default, for-loop, foreach, fused"),
            std::string::npos);
  EXPECT_EQ(optim::implementation_from_string("foreach"), Implementation::kForeach);
}

// Note [Fused kernels and strides]: parameters laid out non-contiguously (a transpose, a
// permutation: what FSDP's slices along another dim are) with contiguous gradients, and a
// state replaced by a contiguous copy midway (as a loaded checkpoint gives), step as
// torch::optim steps them; a parameter that is not dense is refused.
TEST(Optim, FusedTakesParametersOfAnyDenseLayout) {
  auto make = [] {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
    return std::vector<at::Tensor>{at::randn({5, 7}, gen).t(),
                                   at::randn({2, 3, 4}, gen).permute({2, 0, 1})};
  };
  auto contiguous_grads = [](const std::vector<at::Tensor>& params, int step) {
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i];
      p.mutable_grad() = (0.1 * p + at::sin(p * 3.0 + static_cast<double>(step + i))).contiguous();
      ASSERT_NE(p.grad().strides(), p.strides());
    }
  };
  auto run = [&](torch::optim::Optimizer& ours, const std::vector<at::Tensor>& p_ours,
                 torch::optim::Optimizer& ref, const std::vector<at::Tensor>& p_ref,
                 const std::function<void()>& make_state_contiguous) {
    for (int s = 0; s < 20; ++s) {
      contiguous_grads(p_ours, s);
      contiguous_grads(p_ref, s);
      ours.step();
      ref.step();
      if (s == 5) make_state_contiguous();
    }
    return max_diff(p_ours, p_ref);
  };
  {
    auto p = make(), r = make();
    ASSERT_FALSE(p[0].is_contiguous());
    optim::AdamW ours(p, optim::AdamWOptions(1e-2).weight_decay(0.1).amsgrad(true).implementation(
                             Implementation::kFused));
    torch::optim::AdamW ref(r, torch::optim::AdamWOptions(1e-2).weight_decay(0.1).amsgrad(true));
    EXPECT_LE(run(ours, p, ref, r,
                  [&] {
                    for (const auto& t : p) {
                      auto& st = static_cast<torch::optim::AdamWParamState&>(
                          *ours.state().at(t.unsafeGetTensorImpl()));
                      st.exp_avg(st.exp_avg().contiguous());
                      st.exp_avg_sq(st.exp_avg_sq().contiguous());
                      st.max_exp_avg_sq(st.max_exp_avg_sq().contiguous());
                    }
                  }),
              1e-6);
  }
  {
    auto p = make(), r = make();
    optim::Adam ours(p, optim::AdamOptions(1e-2).implementation(Implementation::kFused));
    torch::optim::Adam ref(r, torch::optim::AdamOptions(1e-2));
    EXPECT_LE(run(ours, p, ref, r, [] {}), 1e-6);
  }
  {
    auto p = make(), r = make();
    optim::SGD ours(p, optim::SGDOptions(0.05).momentum(0.9).nesterov(true).implementation(
                           Implementation::kFused));
    torch::optim::SGD ref(r, torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true));
    EXPECT_LE(run(ours, p, ref, r,
                  [&] {
                    for (const auto& t : p) {
                      auto& st = static_cast<torch::optim::SGDParamState&>(
                          *ours.state().at(t.unsafeGetTensorImpl()));
                      st.momentum_buffer(st.momentum_buffer().contiguous());
                    }
                  }),
              1e-6);
  }
  auto overlapping = at::randn({1}).expand({4});
  overlapping.mutable_grad() = at::ones({4});
  optim::AdamW fused({overlapping}, optim::AdamWOptions().implementation(Implementation::kFused));
  const std::string e = error_of([&] { fused.step(); });
  EXPECT_NE(e.find("parameter 0 of param group 0 is not dense"), std::string::npos) << e;
}

// clip_grad_norm_ on multi-tensor ops: the norm and the clipped gradients equal LibTorch's
// torch::nn::utils::clip_grad_norm_ for orders 2, 1 and inf, clipping or not.
TEST(ClipGradNorm, EqualsLibTorchsForEachOrder) {
  for (double order : {2.0, 1.0, std::numeric_limits<double>::infinity()}) {
    for (double max_norm : {0.5, 1e6}) {
      SCOPED_TRACE("order " + std::to_string(order) + " max_norm " + std::to_string(max_norm));
      auto a = make_params(), b = clones(a);
      set_grads(a, 2, 1.0), set_grads(b, 2, 1.0);
      const at::Tensor ours = optim::clip_grad_norm_(a, max_norm, order);
      const double ref = torch::nn::utils::clip_grad_norm_(b, max_norm, order);
      EXPECT_EQ(ours.scalar_type(), at::kFloat);
      EXPECT_NEAR(ours.item<double>(), ref, 1e-6 * ref);
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_LE((a[i].grad() - b[i].grad()).abs().max().item<double>(), 1e-6);
      }
      if (max_norm > 1e5) {  // no clipping: gradients untouched, bit for bit
        auto c = make_params();
        set_grads(c, 2, 1.0);
        for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i].grad(), c[i].grad()));
      }
    }
  }
}

TEST(ClipGradNorm, ChecksFinitenessOnlyWhenAsked) {
  auto a = make_params();
  set_grads(a, 0, 1.0);
  a[1].mutable_grad()[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(error_of([&] {
              optim::clip_grad_norm_(a, 1.0, 2.0, true);
            }).find("non-finite (nan); pass error_if_nonfinite=false"),
            std::string::npos);
  EXPECT_TRUE(std::isnan(optim::clip_grad_norm_(a, 1.0).item<double>()));
  EXPECT_NE(error_of([&] { optim::clip_grad_norm_(a, 1.0, -1.0); }).find("norm_type must be > 0"),
            std::string::npos);
  std::vector<at::Tensor> no_grads{at::ones({2})};
  EXPECT_EQ(optim::clip_grad_norm_(no_grads, 1.0).item<double>(), 0.0);
}
