"""PyTorch's side of tdist's 2-D (FSDP over tensor parallelism) DCP checkpoint interchange.

Both sides train the model `make` writes, in float64, on a (WORLD / 2, 2) mesh named
("dp", "tp"): hf_oracle.llama_tp_plan over mesh["tp"], fully_shard on each decoder layer and
then the root over mesh["dp"], AdamW(lr=LR); dp rank r trains on input_ids.chunk(dp)[r]
(every tp rank on the same rows), loss = transformers' causal-LM loss.

  make DIR              CASE's model (hf_oracle's make) into DIR
  save MODEL OUT WORLD  one AdamW step, then dcp.save of get_state_dict's ("model.<fqn>",
                        "optim.state.<fqn>.<key>", "optim.param_groups.<i>.<key>") into
                        OUT/torch_ckpt; rank 0 writes OUT/torch_ref.pt (every parameter and
                        optimizer state, full, named as in the checkpoint, after that step)
                        and OUT/torch_next.pt ("model.<fqn>" after a second step)
  load MODEL OUT WORLD  dcp.load of OUT/tdist_ckpt (tdist saved it) into the same setup built
                        with AdamW(lr=LR / 10): every parameter and optimizer state, full,
                        must equal OUT/tdist_ref.pt's (tdist wrote it) within 1e-6 of its
                        largest value, and the param group must be the saved one
Prints "OK <command>" when every check passed.
"""
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from safetensors.torch import load_file

import hf_oracle  # beside this file (the script's folder is on sys.path)

LR = 1e-2
# Heads and KV heads that 2 divides, head_dim != hidden / heads, and a vocabulary and MLP
# width (90) whose tensor-parallel parts (45) FSDP splits unevenly (23 + 22 rows: PyTorch's
# _StridedShard, tdist's Note [Tensor-parallel slices]). No attention biases: k_proj's bias has a
# zero gradient in exact arithmetic (softmax ignores a shift shared by every key), so Adam
# would turn each side's rounding noise into steps of opposite signs.
CASE = "llama_tp_dcp"
hf_oracle.CASES[CASE] = dict(
    family="llama", seq=hf_oracle.SEQ,
    config=dict(vocab_size=90, hidden_size=48, intermediate_size=90, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=10,
                max_position_embeddings=64, mlp_bias=True, tie_word_embeddings=False))


def build(model_dir, world, lr):
    """The 2-D model and its AdamW, and this rank's rows of the inputs."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
    model = hf_oracle.load_model(model_dir, torch.float64)
    model.train()
    parallelize_module(model, mesh["tp"], hf_oracle.llama_tp_plan(model))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    ids = load_file(os.path.join(model_dir, "inputs.safetensors"))["input_ids"]
    rows = ids.chunk(mesh["dp"].size())[mesh["dp"].get_local_rank()]
    return model, optimizer, rows


def train_step(model, optimizer, rows):
    model(rows, labels=rows).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def full(value):
    from torch.distributed.tensor import DTensor

    value = value.full_tensor() if isinstance(value, DTensor) else torch.as_tensor(value)
    return value.detach().clone()


def full_state(model, optimizer, with_optimizer=True):
    """Every parameter and its optimizer state gathered whole (collective), named as in the
    checkpoint."""
    out = {}
    for name, p in model.named_parameters():
        out["model." + name] = full(p)
        if with_optimizer:
            for key, value in optimizer.state[p].items():
                out[f"optim.state.{name}.{key}"] = full(value)
    return out


def save(model_dir, out, rank, world):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, optimizer, rows = build(model_dir, world, LR)
    train_step(model, optimizer, rows)
    msd, osd = get_state_dict(model, optimizer)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(out, "torch_ckpt"))
    ref = full_state(model, optimizer)
    train_step(model, optimizer, rows)
    after = full_state(model, optimizer, with_optimizer=False)
    if rank == 0:
        torch.save(ref, os.path.join(out, "torch_ref.pt"))
        torch.save(after, os.path.join(out, "torch_next.pt"))


def expect_close(got, want, what):
    got = got.to(want.dtype)
    if got.shape != want.shape:
        raise AssertionError(f"{what}: shape {tuple(got.shape)}, want {tuple(want.shape)}")
    scale = want.abs().max().item() if want.numel() else 0.0
    err = (got - want).abs().max().item() if want.numel() else 0.0
    if err > 1e-6 * scale or (scale == 0.0 and err > 0.0):
        raise AssertionError(f"{what}: differs by {err} (largest value {scale})")


def load(model_dir, out, rank, world):
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    ref = torch.load(os.path.join(out, "tdist_ref.pt"), weights_only=True)
    model, optimizer, _ = build(model_dir, world, LR / 10)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    ckpt = os.path.join(out, "tdist_ckpt")
    msd = get_model_state_dict(model)
    dcp.load({"model": msd}, checkpoint_id=ckpt)
    set_model_state_dict(model, msd)
    osd = get_optimizer_state_dict(model, optimizer)  # zero state to load into
    dcp.load({"optim": osd}, checkpoint_id=ckpt)
    set_optimizer_state_dict(model, optimizer, osd)
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    if len(groups) != 1 or groups[0]["lr"] != LR:
        raise AssertionError(f"rank {rank}: param groups {groups}, want the saved lr {LR}")
    got = full_state(model, optimizer)
    want = {k: v for k, v in ref.items() if k.startswith(("model.", "optim.state."))}
    if sorted(got) != sorted(want):
        raise AssertionError(f"rank {rank}: names differ: {sorted(set(got) ^ set(want))}")
    for name, value in got.items():
        expect_close(value, want[name], f"rank {rank} {name}")
    if rank == 0:
        print(f"compared {len(got)} tensors")


def run_rank(rank, world, init_file, action, model_dir, out):
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                            world_size=world)
    action(model_dir, out, rank, world)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # PyTorch 2.11's gloo threads can abort the interpreter's teardown


def main():
    command = sys.argv[1]
    if command == "make":
        hf_oracle.make(CASE, sys.argv[2])
    elif command in ("save", "load"):
        model_dir, out, world = sys.argv[2], sys.argv[3], int(sys.argv[4])
        if world % 2 != 0:
            raise SystemExit(f"WORLD {world}: the mesh is (WORLD / 2, 2)")
        init_file = os.path.join(tempfile.mkdtemp(), "init")
        action = save if command == "save" else load
        mp.spawn(run_rank, args=(world, init_file, action, model_dir, out), nprocs=world)
    else:
        raise SystemExit("unknown command " + command)
    print("OK", command)


if __name__ == "__main__":
    main()
