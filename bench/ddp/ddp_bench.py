"""PyTorch DDP side of bench_ddp: the same MLP, data and optimizer as ddp_bench.cpp.

Launched by bench_ddp with MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE set (not torchrun, which
fails on Debian's Python 3.11). Writes "step_ms checksum" to $BENCH_RESULT.
"""
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    threads = int(os.environ.get("BENCH_THREADS", "1"))
    torch.set_num_threads(threads)
    width = int(os.environ["BENCH_WIDTH"])
    depth = int(os.environ["BENCH_DEPTH"])
    batch = int(os.environ["BENCH_BATCH"])
    warmup = int(os.environ["BENCH_WARMUP"])
    steps = int(os.environ["BENCH_STEPS"])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = DDP(torch.nn.Sequential(*layers))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.manual_seed(1 + rank)
    x = torch.randn(batch, width)
    y = torch.randn(batch, width)
    elapsed = 0.0
    for step in range(warmup + steps):
        if step == warmup:
            dist.barrier()
            start = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    elapsed = time.perf_counter() - start
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    with open(os.environ["BENCH_RESULT"], "w") as f:
        f.write(f"{elapsed * 1000.0 / steps} {checksum!r}\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
