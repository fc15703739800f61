#include "gpt/cli.h"

#include <algorithm>
#include <iostream>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "tdist/error.h"

namespace gpt {
namespace {

// --config FILE reader: JSON when the file starts with '{', key=value (TOML/INI) otherwise.
// Names are normalised to flag spelling (n_layer -> n-layer) so both styles work.
class JsonOrTomlConfig : public CLI::ConfigBase {
 public:
  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override {
    std::string text((std::istreambuf_iterator<char>(input)), std::istreambuf_iterator<char>());
    const auto first = text.find_first_not_of(" \t\r\n");
    std::vector<CLI::ConfigItem> items;
    if (first != std::string::npos && text[first] == '{') {
      auto json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (json.is_discarded() || !json.is_object()) {
        throw CLI::ConversionError(
            "--config: the file is not valid JSON (expected one object "
            "of \"flag\": value pairs)");
      }
      for (const auto& [key, value] : json.items()) {
        CLI::ConfigItem item;
        item.name = key;
        if (value.is_string())
          item.inputs = {value.get<std::string>()};
        else if (value.is_boolean())
          item.inputs = {value.get<bool>() ? "true" : "false"};
        else if (value.is_number())
          item.inputs = {value.dump()};
        else
          throw CLI::ConversionError("--config: value of \"" + key +
                                     "\" must be a string, number or boolean");
        items.push_back(std::move(item));
      }
    } else {
      std::istringstream in(text);
      items = CLI::ConfigBase::from_config(in);
    }
    for (auto& item : items) std::replace(item.name.begin(), item.name.end(), '_', '-');
    return items;
  }
};

void add_train_options(CLI::App& app, TrainConfig& c, std::string& mode) {
  app.set_config("--config", "", "Read flags from FILE: JSON object or key=value lines");
  app.config_formatter(std::make_shared<JsonOrTomlConfig>());
  app.allow_config_extras(CLI::config_extras_mode::error);

  const std::string model = "Model";
  app.add_option("--from", c.model.from,
                 "Fine-tune a Hugging Face model folder (config.json, safetensors, tokenizer)")
      ->group(model);
  app.add_option("--model-config", c.model.config_file,
                 "Pretrain from a config.json of any supported family and size")
      ->group(model);
  app.add_option("--family", c.model.family, "Pretrain from flags: llama, mistral, qwen2, gpt2")
      ->check(CLI::IsMember({"llama", "mistral", "qwen2", "gpt2"}))
      ->capture_default_str()
      ->group(model);
  app.add_option("--n-layer", c.model.n_layer, "Decoder layers")
      ->capture_default_str()
      ->group(model);
  app.add_option("--n-head", c.model.n_head, "Attention heads (must divide --n-embd)")
      ->capture_default_str()
      ->group(model);
  app.add_option("--n-kv-head", c.model.n_kv_head,
                 "Key/value heads of grouped-query attention (0: --n-head)")
      ->capture_default_str()
      ->group(model);
  app.add_option("--n-embd", c.model.n_embd, "Hidden size")->capture_default_str()->group(model);
  app.add_option("--intermediate", c.model.intermediate, "MLP width (0: the family's default)")
      ->capture_default_str()
      ->group(model);
  app.add_option("--block-size", c.model.block_size, "Training sequence length in tokens")
      ->capture_default_str()
      ->group(model);
  app.add_option("--max-positions", c.model.max_positions,
                 "max_position_embeddings (0: --block-size)")
      ->capture_default_str()
      ->group(model);
  app.add_option("--rope-theta", c.model.rope_theta, "Rotary base (llama, mistral, qwen2)")
      ->capture_default_str()
      ->group(model);
  app.add_option("--dropout", c.model.dropout, "Dropout probability")
      ->capture_default_str()
      ->group(model);
  app.add_option("--tie-weights", c.model.tie_weights,
                 "Share token embedding and output head (true/false)")
      ->capture_default_str()
      ->group(model);
  app.add_option("--tokenizer", c.tokenizer_path,
                 "tokenizer.json or tokenizer.model (default: --from's, else the bundled "
                 "data/tokenizer/tokenizer.json)")
      ->group(model);

  const std::string data = "Data";
  app.add_option("--data", c.data_path,
                 "Training data, comma-separated files: text (tokenized once, cached) or token "
                 "ids (.bin/.u16 uint16, .u32 uint32); default: the bundled data/kjv.txt")
      ->group(data);
  app.add_option("--data-format", c.data_format, "auto (by extension), text, uint16 or uint32")
      ->check(CLI::IsMember({"auto", "text", "uint16", "uint32"}))
      ->capture_default_str()
      ->group(data);
  app.add_option("--token-cache", c.token_cache,
                 "Directory of tokenized text (default: .tokens beside the run directory)")
      ->group(data);
  app.add_option("--val-fraction", c.val_fraction, "Tail of the tokens held out for validation")
      ->capture_default_str()
      ->group(data);

  const std::string opt = "Optimisation";
  app.add_option("--steps", c.steps, "Optimizer steps")->capture_default_str()->group(opt);
  app.add_option("--batch-size", c.batch_size, "Sequences per rank per micro-step")
      ->capture_default_str()
      ->group(opt);
  app.add_option("--grad-accum", c.grad_accum, "Micro-steps per optimizer step")
      ->capture_default_str()
      ->group(opt);
  app.add_option("--lr", c.schedule.max_lr, "Peak learning rate (AdamW)")
      ->capture_default_str()
      ->group(opt);
  app.add_option("--min-lr", c.schedule.min_lr, "Learning rate at the end of the cosine decay")
      ->capture_default_str()
      ->group(opt);
  app.add_option("--warmup", c.schedule.warmup_steps,
                 "Linear warmup steps (-1: 10% of --steps, at most 30)")
      ->capture_default_str()
      ->group(opt);
  app.add_option("--weight-decay", c.weight_decay, "AdamW weight decay (matrices only)")
      ->capture_default_str()
      ->group(opt);
  app.add_option("--beta1", c.beta1, "AdamW beta1")->capture_default_str()->group(opt);
  app.add_option("--beta2", c.beta2, "AdamW beta2")->capture_default_str()->group(opt);
  app.add_option("--grad-clip", c.grad_clip, "Max global gradient norm (0: off)")
      ->capture_default_str()
      ->group(opt);
  app.add_option("--optimizer-impl", c.optimizer_impl,
                 "AdamW implementation: fused, foreach, for-loop or default (tdist::optim)")
      ->capture_default_str()
      ->group(opt);
  app.add_option("--mixed-precision", c.mixed_precision,
                 "none or bf16 (bf16 parameters and activations, fp32 gradient reduction)")
      ->check(CLI::IsMember({"none", "bf16"}))
      ->capture_default_str()
      ->group(opt);
  app.add_flag("--activation-checkpointing", c.activation_checkpointing,
               "Recompute each decoder layer's activations in backward (less memory)")
      ->group(opt);
  app.add_option("--seed", c.seed, "Seed of the initialisation and data order")
      ->capture_default_str()
      ->group(opt);

  const std::string eval = "Evaluation and logging";
  app.add_option("--eval-interval", c.eval_interval, "Validate every N steps (0: only at the end)")
      ->capture_default_str()
      ->group(eval);
  app.add_option("--eval-batches", c.eval_batches, "Batches per rank per validation")
      ->capture_default_str()
      ->group(eval);
  app.add_option("--log-interval", c.log_interval,
                 "Print a line every N steps when not on a terminal")
      ->capture_default_str()
      ->group(eval);
  app.add_flag("--quiet,-q", c.quiet, "No progress output")->group(eval);

  const std::string par = "Parallelism";
  app.add_option("--mode", mode,
                 "auto, single, ddp, fsdp or hsdp (auto: fsdp with several ranks when built)")
      ->check(CLI::IsMember({"auto", "single", "ddp", "fsdp", "hsdp"}))
      ->capture_default_str()
      ->group(par);
  app.add_option("--device", c.device,
                 "cpu, cuda or auto (auto: cuda when there is a GPU per rank; NCCL between "
                 "ranks)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str()
      ->group(par);
  app.add_flag("--cpu-offload", c.cpu_offload,
               "fsdp: keep parameters, gradients and AdamW state in host memory")
      ->group(par);
  app.add_option("--replicas", c.replicas,
                 "hsdp: replica groups, each sharding over world / replicas ranks (0: one per "
                 "node, or 2 on one node)")
      ->group(par);
  app.add_option("--tp", c.tp,
                 "fsdp: tensor-parallel degree (must divide the world and the head counts): "
                 "FSDP over world / tp ranks of tensor-parallel model replicas")
      ->capture_default_str()
      ->group(par);
  app.add_option("--nproc", c.nproc, "Ranks to start when not launched by tdistrun")
      ->capture_default_str()
      ->group(par);
  app.add_option("--threads", c.threads, "Intra-op threads per rank (0: cores / ranks)")
      ->capture_default_str()
      ->group(par);
  app.add_option("--timeout", c.timeout_s, "Collective timeout in seconds")
      ->capture_default_str()
      ->group(par);

  const std::string outs = "Outputs";
  app.add_option("--name", c.name, "Run name (outputs go to runs/<name>)")
      ->capture_default_str()
      ->group(outs);
  app.add_option("--run-dir", c.run_dir, "Output directory (overrides runs/<name>)")->group(outs);
  app.add_option("--checkpoint-interval", c.checkpoint_interval,
                 "Checkpoint every N steps (0: never)")
      ->capture_default_str()
      ->group(outs);
  app.add_flag("--resume", c.resume, "Continue from the newest checkpoint in the run dir")
      ->group(outs);
  app.add_flag("--async-checkpoint", c.async_checkpoint,
               "Write checkpoints on a background thread while training goes on (the state is "
               "copied to host memory first)")
      ->group(outs);
  app.add_option("--trace", c.trace, "Write trace_rank<r>.json (true/false)")
      ->capture_default_str()
      ->group(outs);

  const std::string sample = "Sample at the end";
  app.add_option("--prompt", c.prompt, "Text the sample continues")
      ->capture_default_str()
      ->group(sample);
  app.add_option("--max-new-tokens", c.sample.max_new_tokens, "Length of the sample (0: no sample)")
      ->capture_default_str()
      ->group(sample);
  app.add_option("--temperature", c.sample.temperature, "Sampling temperature (0: greedy)")
      ->capture_default_str()
      ->group(sample);
  app.add_option("--top-p", c.sample.top_p, "Sample from the smallest set of probability >= p")
      ->capture_default_str()
      ->group(sample);
  app.add_option("--top-k", c.sample.top_k, "Sample from the k most likely tokens (0: all)")
      ->capture_default_str()
      ->group(sample);
  app.add_option("--sample-seed", c.sample.seed, "Seed of the sampler (same seed, same text)")
      ->capture_default_str()
      ->group(sample);
}

void add_generate_options(CLI::App& app, GenerateConfig& g) {
  app.add_option("--run-dir", g.run_dir, "Training run directory (e.g. runs/gpt)");
  app.add_option("--model", g.model_dir, "Or a Hugging Face model folder");
  app.add_option("--prompt", g.prompt, "Text to continue")->capture_default_str();
  app.add_option("--max-new-tokens", g.sample.max_new_tokens, "Tokens to generate")
      ->capture_default_str();
  app.add_option("--temperature", g.sample.temperature, "Sampling temperature (0: greedy)")
      ->capture_default_str();
  app.add_option("--top-p", g.sample.top_p, "Sample from the smallest set of probability >= p")
      ->capture_default_str();
  app.add_option("--top-k", g.sample.top_k, "Sample from the k most likely tokens (0: all)")
      ->capture_default_str();
  app.add_option("--seed", g.sample.seed, "Sampler seed (same seed, same text)")
      ->capture_default_str();
  app.add_option("--threads", g.threads, "Intra-op threads (0: all cores)")->capture_default_str();
}

void add_export_options(CLI::App& app, ExportConfig& x) {
  app.add_option("--run-dir", x.run_dir, "Training run directory (e.g. runs/gpt)")->required();
  app.add_option("--format", x.format,
                 "hf (a Hugging Face model folder), pt (torch.load), safetensors, or dcp (a "
                 "torch.distributed.checkpoint directory)")
      ->check(CLI::IsMember({"hf", "pt", "safetensors", "dcp"}))
      ->capture_default_str();
  app.add_option("--out", x.out,
                 "Folder (hf, dcp) or file to write; pt/safetensors/dcp: config.json beside it "
                 "(.json)")
      ->required();
  app.add_option("--dtype", x.dtype, "Saved weights' dtype: float32, bfloat16, float16")
      ->check(CLI::IsMember({"float32", "bfloat16", "float16"}))
      ->capture_default_str();
  app.add_option("--step", x.step, "Checkpoint step (default: the newest complete one)");
}

}  // namespace

std::string user_message(const std::exception& e) {
  std::string what = e.what();
  // A bad value is the user's to fix, not a bug report: drop the " [file:line]" stamp.
  if (dynamic_cast<const tdist::InvalidArgument*>(&e) != nullptr) {
    if (auto pos = what.rfind(" ["); pos != std::string::npos && what.back() == ']') {
      what = what.substr(0, pos);
    }
  }
  return what;
}

int parse_command_line(const std::vector<std::string>& args_in, Command& command, std::ostream& out,
                       std::ostream& err) {
  std::vector<std::string> args = args_in;
  command = Command{};
  if (!args.empty() && args[0] == "generate") {
    command.kind = Command::Kind::kGenerate;
    args.erase(args.begin());
  } else if (!args.empty() && args[0] == "export") {
    command.kind = Command::Kind::kExport;
    args.erase(args.begin());
  } else if (!args.empty() && args[0] == "train") {
    args.erase(args.begin());
  }

  const bool train = command.kind == Command::Kind::kTrain;
  const bool exporting = command.kind == Command::Kind::kExport;
  CLI::App app(train
                   ? "Pretrain or fine-tune a Llama, Mistral, Qwen2 or GPT-2 model, on one or "
                     "several ranks.\n"
                     "  gpt [train] [flags]       train (this help)\n"
                     "  gpt generate --help       continue a prompt with a trained run or a model "
                     "folder\n"
                     "  gpt export --help         write a run as a Hugging Face model folder"
               : exporting ? "Write a training run's model as a Hugging Face model folder "
                             "(transformers loads it), or its weights for Python."
                           : "Continue a prompt with a training run's newest checkpoint or a "
                             "Hugging Face model folder (KV cache; greedy at --temperature 0).",
               train       ? "gpt"
               : exporting ? "gpt export"
                           : "gpt generate");
  app.option_defaults()->always_capture_default();
  std::string mode = "auto";
  if (train)
    add_train_options(app, command.train, mode);
  else if (exporting)
    add_export_options(app, command.exported);
  else
    add_generate_options(app, command.generate);

  try {
    std::reverse(args.begin(), args.end());  // CLI11 takes them back to front
    app.parse(args);
    if (train) {
      command.train.mode = parse_parallel_mode(mode);
      command.train.finalize();
      command.train.validate();
    } else if (!exporting) {
      command.generate.sample.validate();
      TDIST_CHECK_ARG(command.generate.run_dir.empty() != command.generate.model_dir.empty(),
                      "pass one of --run-dir (a training run) or --model (a model folder)");
    }
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e, out, err);
  } catch (const CLI::ParseError& e) {
    app.exit(e, out, err);
    err << "Run '" << app.get_name() << " --help' for every flag.\n";
    return 2;
  } catch (const tdist::InvalidArgument& e) {
    err << "error: " << user_message(e) << "\n";
    err << "Run '" << app.get_name() << " --help' for every flag.\n";
    return 2;
  }
  return -1;
}

}  // namespace gpt
