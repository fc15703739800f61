#pragma once

// The transformers oracle (python/hf_oracle.py) from C++: tiny random models it makes, and
// the checks it runs on what tdist writes.

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tdist::testing {

/// Why transformers cannot take part, or "" when it can.
std::string transformers_unavailable();

/// Runs hf_oracle.py with `args`; returns its output, failing the test unless it ends "OK".
std::string run_oracle(const std::vector<std::string>& args);
/// The same for another oracle script.
std::string run_oracle_script(const std::string& script, const std::vector<std::string>& args);

/// The folder of a model the oracle made for `case_name`, made once per test process.
std::string oracle_model(const std::string& case_name);

/// One tensor of a safetensors file.
at::Tensor tensor_from(const std::string& file, const std::string& name);

/// max |a - b| / max(1, max |b|).
double relative_error(const at::Tensor& a, const at::Tensor& b);

}  // namespace tdist::testing
