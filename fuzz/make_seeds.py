"""Seed corpora for the fuzzers (fuzz/run_fuzz.sh): real files made by the libraries that
write them, where this Python has them (PyTorch, transformers), else by Python's own
modules. Usage: make_seeds.py TARGET DIR"""
import io
import json
import os
import pickle
import sys
import tempfile
import zipfile

target, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)


def put(name, data):
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)


def torch_or_none():
    try:
        import torch
        return torch
    except ImportError:
        return None


if target == "pickle":
    value = {"a": [1, 2.5, "x", b"y", None, True], "b": (1, (2, 3)), 3: {"nested": [0] * 5}}
    for protocol in (2, 3, 4, 5):
        put("plain_p%d" % protocol, pickle.dumps(value, protocol=protocol))
    torch = torch_or_none()
    if torch is not None:
        import torch.distributed.checkpoint as dcp
        with tempfile.TemporaryDirectory() as d:
            dcp.save({"w": torch.arange(6.0).reshape(2, 3), "step": 3}, checkpoint_id=d)
            with open(os.path.join(d, ".metadata"), "rb") as f:
                put("dcp_metadata", f.read())
elif target == "zip":
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle.dumps({"x": 1}, protocol=2))
        z.writestr("archive/data/0", b"\x00" * 64)
    put("stored", buffer.getvalue())
    torch = torch_or_none()
    if torch is not None:
        buffer = io.BytesIO()
        torch.save({"w": torch.arange(4.0)}, buffer)
        put("torch_save", buffer.getvalue())
elif target == "safetensors":
    torch = torch_or_none()
    if torch is not None:
        from safetensors.torch import save_file
        save_file({"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(4, dtype=torch.bfloat16),
                   "c": torch.tensor([7]), "d": torch.zeros(2, 2, dtype=torch.float16)},
                  os.path.join(out, "mixed"))
        save_file({"w": torch.randn(3)}, os.path.join(out, "with_metadata"),
                  metadata={"format": "pt"})
    else:
        header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
        put("plain", len(header).to_bytes(8, "little") + header + b"\0" * 8)
elif target == "model_config":
    try:
        from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config
        configs = {
            "llama": LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=1,
                                 rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                               "original_max_position_embeddings": 64}),
            "mistral": MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2,
                                     sliding_window=16),
            "qwen2": Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2),
            "gpt2": GPT2Config(n_embd=64, n_layer=2, n_head=4),
        }
        for name, config in configs.items():
            put(name + ".json", config.to_json_string().encode())
    except ImportError:
        put("llama.json", json.dumps({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 1, "vocab_size": 256}).encode())
        put("gpt2.json", json.dumps({
            "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 64,
            "n_layer": 2, "n_head": 4, "vocab_size": 256}).encode())
elif target == "tokenizer":
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    bundled = os.path.join(root, "data", "tokenizer", "tokenizer.json")
    if os.path.exists(bundled):
        with open(bundled, "rb") as f:
            put("bundled.json", f.read())
    try:
        sys.path.insert(0, os.path.join(root, "tests", "models", "python"))
        import tokenizer_oracle
        corpus = tokenizer_oracle.STRESS * 20
        for kind in ("gpt2", "llama3", "qwen2"):
            put(kind + ".json", tokenizer_oracle.train(kind, corpus, vocab_size=300).to_str().encode())
    except ImportError:
        pass  # no `tokenizers` here: the bundled file alone
elif target == "launch_args":
    for name, args in {
        "standalone": ["--standalone", "--nproc-per-node", "3", "train", "--steps", "5"],
        "multinode": ["--nnodes", "1:4", "--node-rank", "0", "--rdzv-endpoint", "host:29400",
                      "--rdzv-id", "job7", "--max-restarts", "2", "--log-dir", "/tmp/l",
                      "--tee", "0:3,1:1", "python", "x.py"],
        "master": ["--nproc_per_node=auto", "--master-addr", "10.0.0.1", "--master-port",
                   "29500", "--monitor-interval", "0.5", "--no-python", "./a.out"],
        "mpirun": ["--launcher", "mpirun", "--nproc-per-node", "2", "./train"],
    }.items():
        put(name, b"\0".join(a.encode() for a in args))
elif target == "train_config":
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    configs = os.path.join(root, "examples", "gpt", "configs")
    for name in sorted(os.listdir(configs)) if os.path.isdir(configs) else []:
        with open(os.path.join(configs, name), "rb") as f:
            put(name, f.read())
    put("flags.json", json.dumps({"steps": 3, "n_layer": 2, "mode": "fsdp", "lr": 1e-3,
                                  "mixed_precision": "bf16", "async_checkpoint": True}).encode())
    put("flags.toml", b"steps = 3\nmode = \"ddp\"\ngrad-clip = 1.0\n[section]\nx = 1\n")
elif target == "dcp_metadata":
    torch = torch_or_none()
    if torch is not None:
        import torch.distributed.checkpoint as dcp
        states = {
            "flat": {"w": torch.arange(6.0).reshape(2, 3), "step": 3},
            "nested": {"model": {"layers.0.weight": torch.ones(4, 2, dtype=torch.bfloat16),
                                 "layers.0.bias": torch.zeros(4, dtype=torch.int64)},
                       "optim": {"state": {"layers.0.weight": {"exp_avg": torch.ones(4, 2),
                                                               "step": torch.tensor(5.0)}},
                                 "param_groups": [{"lr": 0.1, "params": ["layers.0.weight"]}]}},
            "shapes": {"scalar": torch.tensor(2.5), "empty": torch.empty(0, 3),
                       "flag": torch.tensor([True, False]), "half": torch.ones(3, dtype=torch.float16)},
        }
        for name, state in states.items():
            with tempfile.TemporaryDirectory() as d:
                dcp.save(state, checkpoint_id=d)
                with open(os.path.join(d, ".metadata"), "rb") as f:
                    put(name, f.read())
