"""The transformers half of bench/models/run.sh.

  make FAMILY DIR [--smoke]   a random model of FAMILY (llama, mistral, qwen2, gpt2) saved by
                              transformers into DIR, the size run.sh times
  time DIR --steps N --warmup W --threads T --batch B --seq S
                              forward + backward throughput in transformers (sdpa attention),
                              one JSON line as bench_models prints
  generate DIR --threads T --batch B --prompt P --new N --rounds R
                              greedy generate() with the KV cache in transformers, one JSON
                              line as bench_generate prints
  large DIR                   a ~1B-parameter Llama in bfloat16, several safetensors files and
                              an index, written tensor by tensor (for bench_model_load)
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import transformers

BENCH = dict(hidden=384, layers=4, heads=6, kv_heads=2, inter=1024, vocab=8192, positions=512)
SMOKE = dict(hidden=32, layers=2, heads=4, kv_heads=2, inter=64, vocab=128, positions=64)


def config_of(family, s):
    if family == "gpt2":
        return transformers.GPT2Config(vocab_size=s["vocab"], n_embd=s["hidden"], n_layer=s["layers"],
                                       n_head=s["heads"], n_positions=s["positions"],
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    common = dict(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["inter"],
                  num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                  num_key_value_heads=s["kv_heads"], max_position_embeddings=s["positions"])
    if family == "llama":
        return transformers.LlamaConfig(**common)
    if family == "mistral":
        return transformers.MistralConfig(sliding_window=128, **common)
    return transformers.Qwen2Config(**common)


def batch_ids(vocab, batch, seq):
    # The generator bench_models.cpp uses: the same ids on both sides.
    x, ids = 12345, []
    for _ in range(batch * seq):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        ids.append((x >> 33) % vocab)
    return torch.tensor(ids).view(batch, seq)


def make(family, out, smoke):
    torch.manual_seed(0)
    config = config_of(family, SMOKE if smoke else BENCH)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model.save_pretrained(out)


def time_steps(args):
    torch.set_num_threads(args.threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.dir, dtype=torch.float32, attn_implementation="sdpa")
    model.train()
    ids = batch_ids(model.config.vocab_size, args.batch, args.seq)
    times, losses = [], []
    for step in range(args.warmup + args.steps):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        loss = model(ids, labels=ids).loss
        loss.backward()
        seconds = time.perf_counter() - start
        if step >= args.warmup:
            times.append(seconds)
            losses.append(loss.item())
    median = statistics.median_high(times)
    print(json.dumps({"impl": "transformers", "tokens_per_s": round(args.batch * args.seq / median, 1),
                      "median_step_s": round(median, 5), "min_step_s": round(min(times), 5),
                      "loss": sum(losses) / len(losses),
                      "params": sum(p.numel() for p in model.parameters())}))


def generate(args):
    torch.set_num_threads(args.threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.a, dtype=torch.float32, attn_implementation="sdpa").eval()
    ids = batch_ids(model.config.vocab_size, args.batch, args.prompt)
    model.generation_config.eos_token_id = None
    times, out = [], None
    for r in range(args.rounds + 1):  # the first round warms up
        start = time.perf_counter()
        with torch.no_grad():
            # No EOS: exactly --new tokens per row, as bench_generate generates.
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=args.new, pad_token_id=0, use_cache=True)
        if r > 0:
            times.append(time.perf_counter() - start)
    times.sort()
    median = times[len(times) // 2]
    checksum = 0
    for i in out.reshape(-1).tolist():
        checksum = (checksum * 1000003 + i) % (1 << 64)
    print(json.dumps({"impl": "transformers", "tokens_per_s": round(args.batch * args.new / median, 1),
                      "median_s": round(median, 5), "min_s": round(times[0], 5),
                      "generated": out.shape[1] - args.prompt, "checksum": str(checksum)}))


def large(out):
    """Llama-3.2-1B-like (hidden 2048, 16 layers, GQA 32/8, MLP 8192) with a 32000 vocab."""
    from safetensors.torch import save_file

    config = transformers.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=8192,
                                      num_hidden_layers=16, num_attention_heads=32,
                                      num_key_value_heads=8, max_position_embeddings=2048,
                                      tie_word_embeddings=False, dtype="bfloat16")
    os.makedirs(out, exist_ok=True)
    config.save_pretrained(out)
    h, kv, m = 2048, 8 * 64, 8192
    shapes = {"model.embed_tokens.weight": (32000, h), "model.norm.weight": (h,),
              "lm_head.weight": (32000, h)}
    for i in range(16):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
                       p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, h),
                       p + "mlp.gate_proj.weight": (m, h), p + "mlp.up_proj.weight": (m, h),
                       p + "mlp.down_proj.weight": (h, m), p + "input_layernorm.weight": (h,),
                       p + "post_attention_layernorm.weight": (h,)})
    gen = torch.Generator().manual_seed(0)
    files, current, size, limit = [], {}, 0, 500 * 1000 * 1000
    for name in sorted(shapes):
        t = (torch.randn(shapes[name], generator=gen) * 0.02).to(torch.bfloat16)
        if current and size + t.nbytes > limit:
            files.append(current)
            current, size = {}, 0
        current[name] = t
        size += t.nbytes
    files.append(current)
    weight_map, total = {}, 0
    for i, tensors in enumerate(files):
        fname = f"model-{i + 1:05d}-of-{len(files):05d}.safetensors"
        save_file(tensors, os.path.join(out, fname), metadata={"format": "pt"})
        for name, t in tensors.items():
            weight_map[name] = fname
            total += t.nbytes
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    print(f"{sum(t.numel() for fl in files for t in fl.values())} parameters, {total} bytes "
          f"in {len(files)} files")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("command")
    parser.add_argument("a")
    parser.add_argument("b", nargs="?")
    parser.add_argument("--smoke", action="store_true")
    for flag, default in (("--steps", 5), ("--warmup", 1), ("--threads", 2), ("--batch", 4),
                          ("--seq", 256), ("--prompt", 16), ("--new", 64), ("--rounds", 3)):
        parser.add_argument(flag, type=int, default=default)
    args = parser.parse_args()
    if args.command == "make":
        make(args.a, args.b, args.smoke)
    elif args.command == "time":
        args.dir = args.a
        time_steps(args)
    elif args.command == "generate":
        generate(args)
    elif args.command == "large":
        large(args.a)
    else:
        sys.exit("unknown command " + args.command)


if __name__ == "__main__":
    main()
