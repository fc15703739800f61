#pragma once

// Every knob of the GPT job in one place, sectioned as the --help output is. Values come
// from defaults, then --config FILE (JSON or key=value), then flags; validate() checks
// them all at once and its error names the flag and the fix.

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "gpt/model_spec.h"
#include "gpt/sample_options.h"
#include "gpt/schedule.h"

namespace gpt {

/// How the model is replicated or sharded across ranks.
enum class ParallelMode {
  kAuto,    ///< single with one rank; FSDP with several when built, else DDP
  kSingle,  ///< one process, no communication
  kDDP,     ///< replicated model, gradients all-reduced (tdist::ddp)
  kFSDP,    ///< parameters, gradients and optimizer state sharded (tdist::fsdp)
  kHSDP,    ///< sharded within each of --replicas groups, replicated across them (HSDP)
};
std::string to_string(ParallelMode mode);
/// "auto", "single", "ddp", "fsdp", "hsdp"; throws tdist::InvalidArgument otherwise.
ParallelMode parse_parallel_mode(const std::string& text);

struct TrainConfig {
  // --- model
  ModelSpec model;
  /// tokenizer.json or tokenizer.model; empty: --from's, else the bundled data/tokenizer.json.
  std::string tokenizer_path;

  // --- data
  std::string data_path;             ///< empty: the bundled corpus (see default_data_path)
  std::string data_format = "auto";  ///< auto, text, uint16, uint32 (see dataset.h)
  std::string token_cache;    ///< where tokenized text is cached; empty: <run dir>/../.tokens
  double val_fraction = 0.1;  ///< tail of the token stream held out for validation

  // --- optimisation
  int64_t steps = 300;                                        ///< optimizer steps
  int64_t batch_size = 16;                                    ///< sequences per rank per micro-step
  int64_t grad_accum = 1;                                     ///< micro-steps per optimizer step
  LrSchedule schedule{3e-3, 3e-4, /*warmup_steps=*/-1, 300};  ///< warmup -1: auto; total = steps
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double grad_clip = 1.0;  ///< max global gradient norm; 0 disables clipping
  /// AdamW's implementation (tdist::optim): "fused" (ATen's fused kernel, as torchtitan's
  /// default), "foreach", "for-loop" or "default" (PyTorch's choice).
  std::string optimizer_impl = "fused";
  uint64_t seed = 1337;
  /// "none", or "bf16": parameters and activations in bfloat16, gradients reduced in float32
  /// (FSDP's MixedPrecisionPolicy; autocast for single and DDP).
  std::string mixed_precision = "none";
  bool activation_checkpointing = false;  ///< recompute each layer's activations in backward

  // --- evaluation and logging
  int64_t eval_interval = 75;  ///< validate every N steps (and at the end); 0: only at the end
  int64_t eval_batches = 8;    ///< batches per rank per validation
  int64_t log_interval = 10;   ///< plain-output line every N steps (no TTY)

  // --- parallelism
  ParallelMode mode = ParallelMode::kAuto;
  /// Where each rank computes: "cpu", "cuda" (rank i on cuda:LOCAL_RANK, NCCL between
  /// ranks) or "auto" (cuda when the node has a GPU per rank, else cpu).
  std::string device = "auto";
  /// FSDP's CPUOffloadPolicy: parameters, gradients and AdamW state in host memory, each
  /// block copied to the device for its forward and backward (--mode fsdp, or auto).
  bool cpu_offload = false;
  int64_t replicas = 0;  ///< hsdp: replica groups (0: one per node, or 2 on one node)
  /// fsdp: tensor-parallel degree; the ranks form a (world / tp, tp) mesh (dp, tp), FSDP
  /// sharding over dp and tensor parallelism (torchtitan's plan) over tp.
  int64_t tp = 1;
  int nproc = 2;         ///< ranks to spawn when not started by a launcher
  int threads = 0;       ///< intra-op threads per rank; 0: cores / ranks
  int timeout_s = 300;   ///< collective / rendezvous timeout

  // --- outputs
  std::string name = "gpt";           ///< run name
  std::string run_dir;                ///< empty: runs/<name>
  int64_t checkpoint_interval = 150;  ///< checkpoint every N steps (and at the end); 0: never
  bool resume = false;                ///< continue from the newest checkpoint in the run dir
  bool async_checkpoint = false;      ///< write checkpoints while training goes on
  bool trace = true;                  ///< write trace_rank<r>.json
  bool quiet = false;                 ///< no progress output

  // --- sample at the end
  SampleOptions sample;
  std::string prompt = "And God said";

  std::string resolved_run_dir() const { return run_dir.empty() ? "runs/" + name : run_dir; }
  std::string resolved_token_cache() const;
  /// Fills the derived values: schedule.total_steps = steps, and an automatic warmup
  /// (-1: 10% of the steps, at most 30). Idempotent.
  void finalize();
  /// Checks every field (after finalize); throws tdist::InvalidArgument naming the flag and
  /// the fix.
  void validate() const;
};

/// Every field, as written to <run_dir>/config.json (model shape under "model").
nlohmann::json to_json(const TrainConfig& config);

/// The bundled corpus: $TDIST_GPT_DATA, else data/kjv.txt from the source tree this binary
/// was built from, else ./data/kjv.txt.
std::string default_data_path();
/// The bundled tokenizer (data/tokenizer.json, trained on the corpus by
/// tools/train_tokenizer.py), found as default_data_path finds the corpus.
std::string default_tokenizer_path();

/// `gpt export`: a run's model as a Hugging Face folder (hf), or its weights for Python.
struct ExportConfig {
  std::string run_dir;
  std::string format = "hf";      ///< "hf", "pt", "safetensors" or "dcp"
  std::string out;                ///< hf: the folder; else the weights file (config beside, .json)
  int64_t step = -1;              ///< -1: the newest complete checkpoint
  std::string dtype = "float32";  ///< hf: the saved weights' dtype (float32, bfloat16, float16)
};

struct GenerateConfig {
  std::string run_dir;    ///< a training run dir (its newest checkpoint is used)
  std::string model_dir;  ///< or a Hugging Face model folder
  std::string prompt = "And God said";
  SampleOptions sample;
  int threads = 0;
};

}  // namespace gpt
