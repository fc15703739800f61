"""The transformers side of tdist's model-family tests: the oracle, never a copy of its output.

  make CASE DIR            a tiny random model of CASE made by transformers (save_pretrained)
                           into DIR, with inputs.safetensors (input_ids [2, T]) and
                           expected.safetensors (fp32 logits of an eval forward) and
                           generated.safetensors (transformers' greedy generate() of each
                           row's first 4 tokens, 10 new ones, in float32)
  fsdp2_step DIR WORLD     one training step of DIR's model under PyTorch FSDP2 (fully_shard on
                           each decoder layer, then the root) at WORLD ranks over gloo, rank r
                           on input row r: writes DIR/fsdp2_step.safetensors with each rank's
                           loss and every parameter's full gradient
  tp_steps DIR WORLD N [sp]
                           N AdamW steps (lr 1e-3) of DIR's model under PyTorch's tensor
                           parallelism (torchtitan's Llama plan, replicated logits; with "sp"
                           its sequence-parallel plan and loss_parallel) at WORLD ranks over
                           gloo, every rank on input_ids: writes
                           DIR/tp_steps_WORLD[_sp].safetensors with the loss of each step
  check_export DIR REF     loads DIR with AutoModelForCausalLM.from_pretrained; every parameter
                           must equal REF's tensor of the same name bitwise, and its logits on
                           DIR/inputs.safetensors must equal REF's "logits" within 1e-5
  moved BASE DIR BOUND     every parameter of DIR differs from BASE's by at most BOUND, and
                           some by more than 0 (a fine-tune that started from BASE's weights)
Prints "OK <command>" when every check passed.
"""
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file
import transformers

SEQ = 12
PROMPT, GENERATE = 4, 10  # greedy generation: prompt tokens per row, new tokens

# Settings unlike each family's defaults, where the families differ from each other.
CASES = {
    # GQA with one KV head, head_dim != hidden / heads, llama3 rope scaling, biases, untied.
    "llama_gqa_llama3": dict(
        family="llama", seq=SEQ,
        config=dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=1, head_dim=24,
                    max_position_embeddings=64, rms_norm_eps=1e-5, attention_bias=True,
                    mlp_bias=True, tie_word_embeddings=False, pad_token_id=0,
                    rope_parameters=dict(rope_type="llama3", rope_theta=50000.0, factor=4.0,
                                         low_freq_factor=1.0, high_freq_factor=4.0,
                                         original_max_position_embeddings=16))),
    # Tied embeddings, linear rope scaling, two KV heads, another activation.
    "llama_tied_linear": dict(
        family="llama", seq=SEQ,
        config=dict(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=3,
                    num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=32,
                    tie_word_embeddings=True, hidden_act="gelu_pytorch_tanh",
                    rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0))),
    # Dynamic NTK rope over a sequence longer than max_position_embeddings.
    "llama_dynamic_long": dict(
        family="llama", seq=24,
        config=dict(vocab_size=89, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=16,
                    rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0))),
    # Sliding window shorter than the sequence, GQA, head_dim != hidden / heads.
    "mistral_window": dict(
        family="mistral", seq=16,
        config=dict(vocab_size=103, hidden_size=48, intermediate_size=72, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    max_position_embeddings=64, sliding_window=5, tie_word_embeddings=False)),
    # q/k/v biases, sliding attention on layers 1 and up only, tied embeddings.
    "qwen2_window": dict(
        family="qwen2", seq=16,
        config=dict(vocab_size=107, hidden_size=32, intermediate_size=56, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                    use_sliding_window=True, sliding_window=4, max_window_layers=1,
                    tie_word_embeddings=True,
                    rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
    # GPT-2 with per-layer attention scaling and no dropout (so training steps compare).
    "gpt2_small": dict(
        family="gpt2", seq=SEQ,
        config=dict(vocab_size=99, n_embd=48, n_layer=2, n_head=4, n_positions=32,
                    scale_attn_by_inverse_layer_idx=True, resid_pdrop=0.0, embd_pdrop=0.0,
                    attn_pdrop=0.0, layer_norm_epsilon=1e-4)),
    # GPT-2 with its own head, saved in several files with an index.
    "gpt2_untied_sharded": dict(
        family="gpt2", seq=SEQ, max_shard_size="20KB",
        config=dict(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=16,
                    tie_word_embeddings=False, resid_pdrop=0.0, embd_pdrop=0.0,
                    attn_pdrop=0.0)),
    # The trainer's fine-tuning test: the bundled tokenizer's vocabulary (2048), GQA.
    "trainer_llama": dict(
        family="llama", seq=SEQ,
        config=dict(vocab_size=2048, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                    bos_token_id=0, eos_token_id=1)),
    # Tensor parallelism against PyTorch's: heads and KV heads that 4 divides, head_dim !=
    # hidden / heads, attention and MLP biases (the row-parallel ones added once), untied.
    "llama_tp": dict(
        family="llama", seq=SEQ,
        config=dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=8, num_key_value_heads=4, head_dim=16,
                    max_position_embeddings=64, attention_bias=True, mlp_bias=True,
                    tie_word_embeddings=False)),
    # bfloat16 weights in several files with an index.
    "llama_bf16_sharded": dict(
        family="llama", seq=SEQ, dtype=torch.bfloat16, max_shard_size="20KB",
        config=dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)),
}

CONFIG_CLASSES = {
    "llama": transformers.LlamaConfig,
    "mistral": transformers.MistralConfig,
    "qwen2": transformers.Qwen2Config,
    "gpt2": transformers.GPT2Config,
}


def load_model(path, dtype=torch.float32):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def make(case_name, out):
    case = CASES[case_name]
    torch.manual_seed(1234)
    config = CONFIG_CLASSES[case["family"]](**case["config"])
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    # Random norms and biases too, so that a weight loaded in the wrong place shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "norm" in name or "ln_" in name else 0.0))
    dtype = case.get("dtype", torch.float32)
    model = model.to(dtype).eval()
    model.save_pretrained(out, max_shard_size=case.get("max_shard_size", "5GB"))
    gen = torch.Generator().manual_seed(99)
    ids = torch.randint(0, config.vocab_size, (2, case["seq"]), generator=gen)
    save_file({"input_ids": ids}, os.path.join(out, "inputs.safetensors"))
    reloaded = load_model(out, dtype)
    with torch.no_grad():
        logits = reloaded(ids).logits
        logits_fp32 = load_model(out, torch.float32)(ids).logits
    save_file({"logits": logits.float().contiguous(), "logits_fp32": logits_fp32.contiguous()},
              os.path.join(out, "expected.safetensors"))
    # Greedy continuation of each row's first PROMPT tokens by transformers' generate (its KV
    # cache, the config's EOS ids, finished rows padded), in float32.
    with torch.no_grad():
        model32 = load_model(out, torch.float32)
        pad = config.pad_token_id if config.pad_token_id is not None else 0
        # An explicit mask: without one, generate() masks prompt tokens equal to the pad id.
        prompt = ids[:, :PROMPT]
        generated = model32.generate(prompt, attention_mask=torch.ones_like(prompt),
                                     max_new_tokens=GENERATE, do_sample=False, pad_token_id=pad)
    save_file({"generated": generated.contiguous()}, os.path.join(out, "generated.safetensors"))


def fsdp2_rank(rank, world, init_file, path):
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                            world_size=world)
    model = load_model(path)
    model.train()
    layers = model.transformer.h if hasattr(model, "transformer") else model.model.layers
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    ids = load_file(os.path.join(path, "inputs.safetensors"))["input_ids"]
    loss = model(ids[rank:rank + 1], labels=ids[rank:rank + 1]).loss
    loss.backward()
    out = {}
    for name, p in model.named_parameters():
        out["grad." + name] = p.grad.full_tensor().contiguous()
    losses = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(losses, loss.detach().reshape(1))
    if rank == 0:
        out["losses"] = torch.cat(losses)
        save_file(out, os.path.join(path, "fsdp2_step.safetensors"))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # PyTorch 2.11's gloo threads can abort the interpreter's teardown


def llama_tp_plan(model):
    """torchtitan's Llama plan with replicated logits, as tdist::models::tensor_parallel_plan
    (also bench/tensor's PyTorch side)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
            "lm_head": ColwiseParallel(output_layouts=Replicate())}
    for i in range(len(model.model.layers)):
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj",
                     "mlp.up_proj"):
            plan["model.layers.%d.%s" % (i, name)] = ColwiseParallel()
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            plan["model.layers.%d.%s" % (i, name)] = RowwiseParallel()
    return plan


def llama_sp_plan(model):
    """torchtitan's Llama plan with sequence parallelism and a vocabulary-sharded head for
    loss_parallel, as tdist::models::tensor_parallel_plan's default (also bench/tensor's). The
    residual stream stays a DTensor (use_local_output=False) so that transformers' model
    code, which adds residuals and reads hidden_states.shape, sees the whole sequence."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel)

    plan = {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate(),
                                                  output_layouts=Shard(1),
                                                  use_local_output=False),
            "model.norm": SequenceParallel(),
            "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1),
                                       use_local_output=False)}
    for i in range(len(model.model.layers)):
        layer = "model.layers.%d." % i
        plan[layer + "input_layernorm"] = SequenceParallel()
        plan[layer + "post_attention_layernorm"] = SequenceParallel()
        plan[layer + "self_attn"] = PrepareModuleInput(
            input_kwarg_layouts={"hidden_states": Shard(1)},
            desired_input_kwarg_layouts={"hidden_states": Replicate()})
        plan[layer + "mlp"] = PrepareModuleInput(input_layouts=(Shard(1),),
                                                 desired_input_layouts=(Replicate(),))
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj",
                     "mlp.up_proj"):
            plan[layer + name] = ColwiseParallel()
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            plan[layer + name] = RowwiseParallel(output_layouts=Shard(1), use_local_output=False)
    return plan


def tp_loss(model, ids, sp):
    """The causal LM loss; with sp the logits are vocabulary-sharded: loss_parallel."""
    if not sp:
        return model(ids, labels=ids).loss
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import loss_parallel

    with loss_parallel():
        logits = model(ids).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1),
                                                 ids[:, 1:].flatten())
        loss.backward()
    return loss.full_tensor() if isinstance(loss, DTensor) else loss


def tp_rank(rank, world, init_file, path, steps, sp):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                            world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    model = load_model(path)
    model.train()
    parallelize_module(model, mesh, llama_sp_plan(model) if sp else llama_tp_plan(model))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = load_file(os.path.join(path, "inputs.safetensors"))["input_ids"]
    losses = []
    for _ in range(steps):
        loss = tp_loss(model, ids, sp)
        if not sp:
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach().reshape(1))
    if rank == 0:
        save_file({"losses": torch.cat(losses)},
                  os.path.join(path, "tp_steps_%d%s.safetensors" % (world, "_sp" if sp else "")))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # PyTorch 2.11's gloo threads can abort the interpreter's teardown


def tp_steps(path, world, steps, sp=False):
    init_file = os.path.join(tempfile.mkdtemp(), "init")
    mp.spawn(tp_rank, args=(world, init_file, path, steps, sp), nprocs=world)


def fsdp2_step(path, world):
    init_file = os.path.join(tempfile.mkdtemp(), "init")
    mp.spawn(fsdp2_rank, args=(world, init_file, path), nprocs=world)


def check_export(path, ref_path):
    ref = load_file(ref_path)
    model = load_model(path, dtype="auto")
    state = model.state_dict()
    checked = 0
    for name, want in ref.items():
        if name in ("logits",):
            continue
        got = state[name]
        if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
            raise SystemExit(f"{name}: transformers loaded {got.dtype} {tuple(got.shape)} "
                             f"that differs from tdist's {want.dtype} {tuple(want.shape)}")
        checked += 1
    if checked != len([n for n in state if n in ref]) or checked == 0:
        raise SystemExit("no parameters compared")
    missing = [n for n in state if n not in ref and not n.endswith("lm_head.weight")]
    if missing:
        raise SystemExit(f"tdist's reference lacks {missing}")
    if "logits" in ref:
        ids = load_file(os.path.join(path, "inputs.safetensors"))["input_ids"]
        with torch.no_grad():
            logits = model(ids).logits.float()
        err = (logits - ref["logits"]).abs().max().item()
        scale = max(1.0, ref["logits"].abs().max().item())
        if err > 1e-5 * scale:
            raise SystemExit(f"logits differ by {err} (scale {scale})")
    print(f"compared {checked} parameters bitwise")


def moved(base_path, path, bound):
    base, tuned = load_model(base_path).state_dict(), load_model(path).state_dict()
    if set(base) != set(tuned):
        raise SystemExit(f"parameter names differ: {sorted(set(base) ^ set(tuned))}")
    largest = max((tuned[n] - base[n]).abs().max().item() for n in base)
    if not 0 < largest <= bound:
        raise SystemExit(f"largest change {largest}, expected in (0, {bound}]")
    print(f"largest change {largest}")


def main():
    command = sys.argv[1]
    if command == "make":
        make(sys.argv[2], sys.argv[3])
    elif command == "fsdp2_step":
        fsdp2_step(sys.argv[2], int(sys.argv[3]))
    elif command == "tp_steps":
        tp_steps(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:] == ["sp"])
    elif command == "check_export":
        check_export(sys.argv[2], sys.argv[3])
    elif command == "moved":
        moved(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    elif command == "cases":
        print(" ".join(CASES))
    else:
        raise SystemExit("unknown command " + command)
    print("OK", command)


if __name__ == "__main__":
    main()
