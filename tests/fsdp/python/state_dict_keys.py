"""PyTorch's side of tdist's state-dict key parity test (tests/fsdp/state_dict_test.cpp).

  state_dict_keys.py <out file>
      builds the Mlp (fc1.bias frozen, a buffer), shards it with FSDP2 at world 1 (gloo, CPU),
      takes one AdamW step over its trainable parameters and writes the keys
      torch.distributed.checkpoint.state_dict.get_state_dict gives, one per line:
        model <fqn>              (default options)
        model_no_frozen <fqn>    (ignore_frozen_params=True)
        optim <fqn>.<state>      (the optimizer's "state", flattened as tdist keys it)
Prints "OK" on success.
"""

import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, StateDictOptions
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


class Mlp(nn.Module):
    """The same module as the C++ test's KeysMlp."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(5, 7)
        self.norm = nn.LayerNorm(7)
        self.fc2 = nn.Linear(7, 3)
        self.scale = nn.Parameter(torch.tensor([1.5]))
        self.register_buffer("offset", torch.zeros(3))
        self.fc1.bias.requires_grad_(False)

    def forward(self, x):
        return self.fc2(torch.relu(self.norm(self.fc1(x)))) * self.scale + self.offset


def main(out_file):
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group(
            "gloo", init_method=f"file://{os.path.join(tmp, 'store')}", rank=0, world_size=1
        )
        torch.manual_seed(7)
        model = Mlp()
        mesh = init_device_mesh("cpu", (1,))
        fully_shard(model.fc1, mesh=mesh)
        fully_shard(model.fc2, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        model(torch.randn(4, 5)).square().mean().backward()
        opt.step()
        lines = []
        msd, osd = get_state_dict(model, opt)
        lines += [f"model {k}" for k in msd]
        lines += [f"optim {fqn}.{k}" for fqn, st in osd["state"].items() for k in st]
        msd, _ = get_state_dict(model, opt, options=StateDictOptions(ignore_frozen_params=True))
        lines += [f"model_no_frozen {k}" for k in msd]
        dist.destroy_process_group()
    with open(out_file, "w") as f:
        f.write("\n".join(sorted(lines)) + "\n")
    print("OK")


if __name__ == "__main__":
    main(sys.argv[1])
