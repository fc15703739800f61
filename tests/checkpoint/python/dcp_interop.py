"""Python's side of tdist's torch.distributed.checkpoint interchange tests.

  dcp_interop.py save <plain|fsdp2|ddp> <dir> <world>
      trains the Mlp one Adam step at `world` ranks (gloo, CPU) and dcp.save()s it into
      <dir>/ckpt; rank 0 writes the full state as tdist names it into <dir>/ref.pt
      ("model.<fqn>", "optim.state.<fqn>.<key>").
  dcp_interop.py load <plain|fsdp2> <dir> <world>
      loads <dir>/ckpt (tdist wrote it) into an Mlp at `world` ranks with dcp.load and
      compares every parameter with <dir>/ref.pt (tdist wrote it too); rank 0 also converts
      the checkpoint with dcp_to_torch_save and compares that. The optimizer's state goes
      through dcp.load + set_optimizer_state_dict into an Adam built with other options;
      its param groups must then hold PARAM_GROUP's values.
Both sides train with Adam(**PARAM_GROUP), the C++ tests' kParamGroup.
Prints "OK <mode>" on success; any mismatch raises.
"""

import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (
    get_optimizer_state_dict,
    get_state_dict,
    set_optimizer_state_dict,
    StateDictOptions,
)

# Adam's options in both sides' saving runs; a loading run builds Adam(lr=0.01) and expects
# these back from the checkpoint.
PARAM_GROUP = dict(lr=0.02, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.05, amsgrad=True)


class Mlp(nn.Module):
    """The same module as the C++ tests' DCPMlp: 7 rows shard unevenly at 2, 3 and 4."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(5, 7)
        self.norm = nn.LayerNorm(7)
        self.fc2 = nn.Linear(7, 3)
        self.scale = nn.Parameter(torch.tensor([1.5]))  # FSDP2 refuses 0-dim parameters

    def forward(self, x):
        return self.fc2(torch.relu(self.norm(self.fc1(x)))) * self.scale


def make_model(kind, world):
    torch.manual_seed(7)
    model = Mlp()
    if kind == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (world,))
        fully_shard(model.fc1, mesh=mesh)
        fully_shard(model.fc2, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif kind == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    return model


def train_one_step(model):
    opt = torch.optim.Adam(model.parameters(), **PARAM_GROUP)
    rank = dist.get_rank() if dist.is_initialized() else 0
    torch.manual_seed(100 + rank)
    model(torch.randn(4, 5)).square().mean().backward()
    opt.step()
    return opt


def full_reference(model, opt, kind):
    msd, osd = get_state_dict(
        model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    ref = {"model." + k: v.detach().clone() for k, v in msd.items()}
    for fqn, state in osd.get("state", {}).items():  # cpu_offload: rank 0 only
        for key, value in state.items():
            ref[f"optim.state.{fqn}.{key}"] = torch.as_tensor(value).clone()
    return ref


def save(kind, out, rank, world):
    model = make_model(kind, world)
    opt = train_one_step(model)
    if kind == "ddp":
        state = {"model": model.state_dict()}  # raw: "module.<fqn>" keys, as users write it
    else:
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
    dcp.save(state, checkpoint_id=os.path.join(out, "ckpt"))
    ref = full_reference(model, opt, kind)  # collective for FSDP2
    if rank == 0:
        torch.save(ref, os.path.join(out, "ref.pt"))


def expect_equal(got, want, what):
    if got.shape != want.shape or not torch.equal(got.to(want.dtype), want):
        raise AssertionError(f"{what}: got {got} want {want}")


def load(kind, out, rank, world):
    from torch.distributed.tensor import DTensor

    ref = torch.load(os.path.join(out, "ref.pt"), weights_only=True)
    model = make_model(kind, world)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    sd = model.state_dict()
    dcp.load({"model": sd}, checkpoint_id=os.path.join(out, "ckpt"))
    model.load_state_dict(sd)
    for name, value in model.state_dict().items():
        full = value.full_tensor() if isinstance(value, DTensor) else value
        expect_equal(full, ref["model." + name], f"rank {rank} {name}")
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    osd = get_optimizer_state_dict(model, opt)
    dcp.load({"optim": osd}, checkpoint_id=os.path.join(out, "ckpt"))
    set_optimizer_state_dict(model, opt, osd)
    if len(opt.param_groups) != 1:
        raise AssertionError(f"rank {rank}: {len(opt.param_groups)} param groups")
    group = opt.param_groups[0]
    for key, want in PARAM_GROUP.items():
        if group[key] != want:
            raise AssertionError(f"rank {rank}: param group {key} = {group[key]}, want {want}")
    for name, param in model.named_parameters():
        for key, value in opt.state[param].items():
            full = value.full_tensor() if isinstance(value, DTensor) else value
            expect_equal(torch.as_tensor(full), ref[f"optim.state.{name}.{key}"],
                         f"rank {rank} optimizer {name}.{key}")
    if rank == 0:
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        converted = os.path.join(tempfile.mkdtemp(), "whole.pt")
        dcp_to_torch_save(os.path.join(out, "ckpt"), converted)
        whole = torch.load(converted, weights_only=False)
        for name, want in ref.items():
            if name.startswith("model."):
                expect_equal(whole["model"][name[len("model."):]], want, "converted " + name)


def run_rank(rank, world, init_file, action, kind, out):
    if world > 1 or kind != "plain":
        dist.init_process_group(
            "gloo", init_method="file://" + init_file, rank=rank, world_size=world
        )
    action(kind, out, rank, world)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def run_spawned_rank(rank, world, init_file, action, kind, out):
    run_rank(rank, world, init_file, action, kind, out)
    # As bench/train/gpt_torch.py: PyTorch 2.11's Gloo threads sometimes abort the
    # interpreter's teardown ("terminate called without an active exception") after the rank
    # has finished and checked everything; a failed check raised above and never gets here.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main():
    command, kind, out, world = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    action = {"save": save, "load": load}[command]
    init_file = os.path.join(tempfile.mkdtemp(), "init")
    if world == 1:
        run_rank(0, 1, init_file, action, kind, out)
    else:
        mp.spawn(run_spawned_rank, args=(world, init_file, action, kind, out), nprocs=world)
    print("OK", command, kind, world)


if __name__ == "__main__":
    main()
