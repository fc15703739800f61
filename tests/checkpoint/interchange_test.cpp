// Single-file interchange with Python PyTorch (torch.load / torch.save) and safetensors.

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "checkpoint/helpers.h"
#include "support/expect.h"
#include "support/ranks.h"
#include "tdist/checkpoint/interchange.h"
#include "tdist/checkpoint/module_state.h"
#include "tdist/error.h"

namespace tdist::checkpoint {
namespace {

using namespace tdist::checkpoint::testing;
namespace fs = std::filesystem;

using tdist::testing::test_python;

bool python_has_torch() {
  static const bool has =
      std::system((test_python() + " -c 'import torch' >/dev/null 2>&1").c_str()) == 0;
  return has;
}

/// Runs a Python script with argv; returns its exit status, output in *out.
int run_python(const std::string& script, const std::vector<std::string>& args, std::string* out) {
  const std::string dir = tdist::testing::make_temp_dir("py");
  const std::string file = dir + "/script.py", log = dir + "/out.txt";
  std::ofstream(file) << script;
  std::string cmd = test_python() + " " + file;
  for (const auto& a : args) cmd += " '" + a + "'";
  cmd += " >" + log + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream in(log);
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return rc;
}

TensorMap sample() {
  TensorMap m;
  for (auto& [name, t] : reference_tensors(41)) m[name] = t;
  m["view.of.bigger"] = at::arange(20, at::kFloat).narrow(0, 5, 6);  // a view: saved alone
  return m;
}

TEST(Safetensors, RoundTripAllDtypesAndMetadata) {
  const TensorMap tensors = sample();
  const std::string path = tdist::testing::make_temp_dir("st") + "/m.safetensors";
  save_safetensors(tensors, path, {{"format", "pt"}, {"step", "12"}});
  std::map<std::string, std::string> meta;
  const TensorMap back = load_safetensors(path, &meta);
  EXPECT_EQ(meta.at("step"), "12");
  ASSERT_EQ(back.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    EXPECT_TRUE(bitwise_equal(back.at(name), t.contiguous())) << name;
  }
  // Header length is a multiple of 8 (data aligned), as the reference writer does.
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
}

TEST(Safetensors, MalformedFilesAreClearErrors) {
  const std::string dir = tdist::testing::make_temp_dir("st");
  const std::string path = dir + "/m.safetensors";
  save_safetensors({{"w", at::ones({4})}}, path);
  fs::resize_file(path, fs::file_size(path) - 4);  // data cut short
  try {
    load_safetensors(path);
    FAIL() << "expected an error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  std::ofstream(dir + "/junk") << "not a safetensors file at all";
  EXPECT_THROW(load_safetensors(dir + "/junk"), CheckpointError);
}

TEST(TorchFile, LibTorchRoundTrip) {
  const TensorMap tensors = sample();
  const std::string path = tdist::testing::make_temp_dir("pt") + "/m.pt";
  export_torch_file(tensors, path);
  const TensorMap back = import_torch_file(path);
  ASSERT_EQ(back.size(), tensors.size());
  for (const auto& [name, t] : tensors) EXPECT_TRUE(bitwise_equal(back.at(name), t)) << name;
}

// Python reads both of our files and checks them against each other, then writes its own
// torch.save and safetensors files for us to import.
constexpr const char* kPythonCheck = R"PY(
import json, struct, sys, torch
pt, st, out_pt, out_st = sys.argv[1:5]
sd = torch.load(pt, weights_only=True)  # the default since 2.6; refuses type-tagged pickles
assert isinstance(sd, dict), type(sd)
names = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16, "BF16": torch.bfloat16,
         "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
         "U8": torch.uint8, "BOOL": torch.bool}
with open(st, "rb") as f:
    data = f.read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
header.pop("__metadata__", None)
assert set(header) == set(sd), (sorted(header), sorted(sd))
base = 8 + n
for name, h in header.items():
    b, e = h["data_offsets"]
    raw = bytearray(data[base + b: base + e])
    t = torch.frombuffer(raw, dtype=torch.uint8) if e > b else torch.empty(0, dtype=torch.uint8)
    t = t.view(names[h["dtype"]]).reshape(h["shape"])
    assert t.dtype == sd[name].dtype and t.shape == sd[name].shape, name
    assert torch.equal(t.view(torch.uint8) if t.dim() else t, sd[name].view(torch.uint8) if t.dim() else sd[name]), name
print("python read", len(sd), "tensors")
# Python's own files for the import direction: a model's state_dict, as a plain dict.
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 9), torch.nn.BatchNorm1d(9), torch.nn.Linear(9, 3))
torch.save(dict(model.state_dict()), out_pt)
hdr, blobs, off = {}, [], 0
for k, v in model.state_dict().items():
    v = v.contiguous()
    raw = v.view(-1).view(torch.uint8).numpy().tobytes() if v.dim() else v.reshape(1).view(torch.uint8).numpy().tobytes()
    dt = [k2 for k2, d in names.items() if d == v.dtype][0]
    hdr[k] = {"dtype": dt, "shape": list(v.shape), "data_offsets": [off, off + len(raw)]}
    blobs.append(raw); off += len(raw)
h = json.dumps(hdr).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(out_st, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
# Fingerprints for C++ to compare against.
print("SUMS " + json.dumps({k: float(v.double().sum()) for k, v in model.state_dict().items()}))
)PY";

struct SeqImpl : torch::nn::Module {
  SeqImpl() {
    // Same names as Python's nn.Sequential: "0.weight", "1.running_mean", ...
    register_module("0", torch::nn::Linear(6, 9));
    register_module("1", torch::nn::BatchNorm1d(9));
    register_module("2", torch::nn::Linear(9, 3));
  }
};

TEST(Interchange, PythonLoadsOurFilesAndWeLoadPythons) {
  if (!python_has_torch()) {
    GTEST_SKIP() << test_python()
                 << " has no torch module; run tools/setup.sh (it installs PyTorch into .venv/) to "
                    "run this test";
  }
  const std::string dir = tdist::testing::make_temp_dir("py");
  TensorMap tensors = sample();
  export_torch_file(tensors, dir + "/ours.pt");
  save_safetensors(tensors, dir + "/ours.safetensors");
  std::string out;
  const int rc = run_python(kPythonCheck,
                            {dir + "/ours.pt", dir + "/ours.safetensors", dir + "/theirs.pt",
                             dir + "/theirs.safetensors"},
                            &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("python read " + std::to_string(tensors.size()) + " tensors"),
            std::string::npos)
      << out;

  // Import Python's files into a C++ model with the same structure (fine-tuning start).
  const TensorMap from_pt = import_torch_file(dir + "/theirs.pt");
  const TensorMap from_st = load_safetensors(dir + "/theirs.safetensors");
  ASSERT_EQ(from_pt.size(), from_st.size());
  auto sums = nlohmann::json::parse(out.substr(out.find("SUMS ") + 5));
  for (const auto& [name, t] : from_pt) {
    EXPECT_TRUE(bitwise_equal(t, from_st.at(name))) << name;
    EXPECT_DOUBLE_EQ(t.to(at::kDouble).sum().item<double>(), sums.at(name).get<double>()) << name;
  }
  SeqImpl model;
  load_module_tensors(model, from_pt);
  const TensorMap loaded = module_tensors(model);
  for (const auto& [name, t] : from_pt) EXPECT_TRUE(bitwise_equal(loaded.at(name), t)) << name;
}

TEST(Interchange, ExportDistributedCheckpointAsOneFile) {
  // A checkpoint written by 3 rank threads, gathered into one torch file and one safetensors.
  const auto full = reference_tensors(42);
  const std::string dir = tdist::testing::make_temp_dir("ckpt") + "/ckpt";
  run_with_coordinators(3, [&](int rank, CoordinatorPtr c) {
    save(shard_all(full, rank, 3, Layout::kUneven, false), {}, dir,
         SaveOptions().coordinator(c).fsync(false));
  });
  const TensorMap gathered = read_full_tensors(dir);
  ASSERT_EQ(gathered.size(), full.size());
  const std::string st = dir + "-export.safetensors";
  save_safetensors(gathered, st);
  for (const auto& [name, t] : load_safetensors(st))
    EXPECT_TRUE(bitwise_equal(t, full.at(name))) << name;
  const TensorMap prefixed = read_full_tensors(dir, "layers.");
  EXPECT_EQ(prefixed.count("0.weight"), 1u);
  EXPECT_EQ(prefixed.size(), 3u);
}

TEST(Interchange, StrictModuleLoadListsEveryOffender) {
  SeqImpl model;
  TensorMap tensors = module_tensors(model);
  tensors.erase("0.bias");
  tensors["extra.weight"] = at::zeros({1});
  tensors["2.weight"] = at::zeros({1, 1});
  try {
    load_module_tensors(model, tensors);
    FAIL() << "expected an error";
  } catch (const CheckpointError& e) {
    const std::string msg = e.what();
    for (const char* n : {"0.bias", "extra.weight", "2.weight"}) {
      EXPECT_NE(msg.find(n), std::string::npos) << msg;
    }
  }
  EXPECT_NO_THROW(load_module_tensors(model, tensors, /*strict=*/false));
}

}  // namespace
}  // namespace tdist::checkpoint
