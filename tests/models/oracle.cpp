#include "oracle.h"

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "support/expect.h"
#include "support/ranks.h"
#include "tdist/checkpoint/interchange.h"

namespace tdist::testing {

std::string transformers_unavailable() {
  static const std::string why = [] {
    const std::string probe =
        test_python() + " -c 'import transformers, safetensors' >/dev/null 2>&1";
    return std::system(probe.c_str()) == 0
               ? std::string()
               : test_python() + " has no transformers (tools/setup.sh installs it into .venv/)";
  }();
  return why;
}

std::string run_oracle(const std::vector<std::string>& args) {
  return run_oracle_script(HF_ORACLE_PY, args);
}

std::string run_oracle_script(const std::string& script, const std::vector<std::string>& args) {
  const std::string dir = make_temp_dir("hf-oracle");
  std::string cmd = test_python() + " " + script;
  for (const auto& a : args) cmd += " '" + a + "'";
  cmd += " >" + dir + "/out.txt 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream in(dir + "/out.txt");
  const std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(rc, 0) << cmd << "\n" << out;
  EXPECT_NE(out.find("OK " + args[0]), std::string::npos) << cmd << "\n" << out;
  return out;
}

std::string oracle_model(const std::string& case_name) {
  static std::mutex mutex;
  static std::map<std::string, std::string> made;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = made.find(case_name);
  if (it != made.end()) return it->second;
  const std::string dir = make_temp_dir("hf-" + case_name) + "/model";
  run_oracle({"make", case_name, dir});
  made[case_name] = dir;
  return dir;
}

at::Tensor tensor_from(const std::string& file, const std::string& name) {
  const auto tensors = checkpoint::load_safetensors(file);
  auto it = tensors.find(name);
  if (it == tensors.end()) {
    ADD_FAILURE() << file << " has no tensor " << name;
    return at::Tensor();
  }
  return it->second;
}

double relative_error(const at::Tensor& a, const at::Tensor& b) {
  const double scale = std::max(1.0, b.abs().max().item<double>());
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() / scale;
}

}  // namespace tdist::testing
