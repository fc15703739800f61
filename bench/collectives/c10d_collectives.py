"""PyTorch's side of bench_collectives: the same ops, sizes, iteration counts, rounds and
verification on torch.distributed's Gloo (c10d ProcessGroupGloo), one rank per process.

bench_collectives starts `--world` copies with BENCH_RANK and BENCH_DIR set; rank 0 writes
one line per (op, bytes) to BENCH_DIR/c10d.tsv: op, bytes, best-round time in us (the
slowest rank's mean per iteration), and the number of wrong elements over all ranks, or
"n/a" when this release's Gloo lacks the op.
"""

import argparse
import math
import os
import time

import torch
import torch.distributed as dist


def iterations_for(nbytes):
    return max(3, min(50, (512 << 20) // nbytes))


def run(op, inp, out, n):
    if op == "all_reduce":
        dist.all_reduce(inp)
    elif op == "all_gather_into_tensor":
        dist.all_gather_into_tensor(out, inp)
    elif op == "reduce_scatter_tensor":
        dist.reduce_scatter_tensor(out, inp)
    elif op == "broadcast":
        dist.broadcast(inp, 0)
    else:
        dist.all_to_all_single(out, inp)


def verify(op, inp, out, rank, n):
    tri = n * (n + 1) / 2.0
    if op in ("all_reduce", "broadcast"):
        inp.fill_(rank + 1)
        run(op, inp, out, n)
        return int((inp != (tri if op == "all_reduce" else 1)).sum())
    if op == "all_gather_into_tensor":
        inp.fill_(rank + 1)
        out.zero_()
        run(op, inp, out, n)
        want = torch.arange(1, n + 1, dtype=torch.float).repeat_interleave(inp.numel())
    elif op == "reduce_scatter_tensor":
        inp.copy_(torch.arange(1, n + 1, dtype=torch.float).repeat_interleave(out.numel()) * (rank + 1))
        run(op, inp, out, n)
        want = torch.full_like(out, (rank + 1) * tri)
    else:
        block = inp.numel() // n
        inp.copy_(torch.arange(n, dtype=torch.float).repeat_interleave(block) + 100 * rank)
        out.zero_()
        run(op, inp, out, n)
        want = torch.arange(n, dtype=torch.float).repeat_interleave(block) * 100 + rank
    return int((out != want).sum())


def time_round(iters, body):
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        body()
    t = torch.tensor([(time.perf_counter() - start) * 1e6 / iters], dtype=torch.double)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


WARM_UP_ROUNDS = 3  # as bench_collectives.cpp's warm_up(): untimed, before an op's first size


def measure(op, nbytes, rank, n, rounds):
    numel = nbytes // 4 // n * n
    if op == "all_gather_into_tensor":
        inp, out = torch.empty(numel // n), torch.empty(numel)
    elif op == "reduce_scatter_tensor":
        inp, out = torch.empty(numel), torch.empty(numel // n)
    else:
        inp, out = torch.empty(numel), torch.empty(numel)
    inp.fill_(1)
    try:
        run(op, inp, out, n)  # warm-up, and whether this Gloo has the op at all
        ok = 1
    except RuntimeError:
        ok = 0
    flag = torch.tensor([ok])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    if int(flag) == 0:
        return None
    iters = iterations_for(nbytes)
    best = math.inf
    for _ in range(rounds):
        best = min(best, time_round(iters, lambda: run(op, inp, out, n)))
    wrong = torch.tensor([verify(op, inp, out, rank, n)])
    dist.all_reduce(wrong)
    return best, int(wrong)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--min-bytes", type=int, required=True)
    p.add_argument("--max-bytes", type=int, required=True)
    p.add_argument("--step", type=int, required=True)
    p.add_argument("--ops", required=True)
    p.add_argument("--rounds", type=int, required=True)
    a = p.parse_args()
    rank, directory = int(os.environ["BENCH_RANK"]), os.environ["BENCH_DIR"]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{directory}/c10d_store",
                            rank=rank, world_size=a.world)
    lines = []
    for op in a.ops.split(","):
        measure(op, a.min_bytes, rank, a.world, WARM_UP_ROUNDS)
        nbytes = a.min_bytes
        while nbytes <= a.max_bytes:
            r = measure(op, nbytes, rank, a.world, a.rounds)
            lines.append(f"{op}\t{nbytes}\t" + ("n/a\tn/a" if r is None else f"{r[0]:.3f}\t{r[1]}"))
            nbytes *= a.step
    if rank == 0:
        with open(os.path.join(directory, "c10d.tsv.tmp"), "w") as f:
            f.write("\n".join(lines) + "\n")
        os.rename(os.path.join(directory, "c10d.tsv.tmp"), os.path.join(directory, "c10d.tsv"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
