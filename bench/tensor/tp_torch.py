"""PyTorch's side of bench/tensor: the same folder, plan (MODE plain: torchtitan's with
replicated logits; sp: with sequence parallelism and loss_parallel), batch and optimizer under
torch.distributed.tensor.parallel at WORLD ranks over gloo; rank 0 prints one JSON line.

  python tp_torch.py DIR BATCH SEQ STEPS WARMUP WORLD MODE
"""
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import transformers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                                "models", "python"))
from hf_oracle import llama_sp_plan, llama_tp_plan, tp_loss  # noqa: E402  (the parity test's)


def rank_main(rank, world, init_file, args):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module
    path, batch, seq, steps, warmup, sp = args
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                            world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="sdpa")
    model.train()
    parallelize_module(model, mesh, llama_sp_plan(model) if sp else llama_tp_plan(model))
    # The for-loop AdamW, as LibTorch's torch::optim::AdamW on the other side.
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    torch.manual_seed(7)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq))
    times = []
    loss = None
    for _ in range(warmup + steps):
        dist.barrier()
        start = time.perf_counter()
        loss = tp_loss(model, ids, sp)
        if not sp:
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append((time.perf_counter() - start) * 1000)
    timed = sorted(times[warmup:])
    if rank == 0:
        print(json.dumps({"impl": "pytorch", "mode": "sp" if sp else "plain", "world": world,
                          "step_ms_median": statistics.median(timed), "step_ms_min": timed[0],
                          "step_ms_max": timed[-1], "loss": loss.item()}), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # PyTorch 2.11's gloo threads can abort the interpreter's teardown


def main():
    path = sys.argv[1]
    batch, seq, steps, warmup, world = (int(a) for a in sys.argv[2:7])
    sp = sys.argv[7:] == ["sp"]
    init_file = os.path.join(tempfile.mkdtemp(), "init")
    mp.spawn(rank_main, args=(world, init_file, (path, batch, seq, steps, warmup, sp)),
             nprocs=world)


if __name__ == "__main__":
    main()
