"""PyTorch's powerSGD_hook as the oracle for tdist's (tests/ddp/powersgd_test.cpp).

Each rank feeds the hook the same gradient buckets the C++ test will feed tdist's, iteration
after iteration (buckets of the given shapes; random gradients from per-rank seeds), and saves
the inputs, the hook's outputs and its compression statistics to <out>/rank<R>.safetensors.

usage: powersgd_oracle.py OUT WORLD SPEC ITERS RANK START ERROR_FEEDBACK WARM_START BATCH EPS
                          SEED MIN_RATE
SPEC: buckets separated by ';', tensors by ',', dimensions by 'x' (e.g. "3x16,3;16x12,16").
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import save_file
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd


class Bucket:
    """The part of dist.GradBucket the hook reads."""

    def __init__(self, index, is_last, buffer, shapes):
        self._index, self._is_last, self._buffer = index, is_last, buffer
        self._gradients, offset = [], 0
        for shape in shapes:
            numel = 1
            for d in shape:
                numel *= d
            self._gradients.append(buffer[offset : offset + numel].view(shape))
            offset += numel

    def index(self):
        return self._index

    def is_last(self):
        return self._is_last

    def buffer(self):
        return self._buffer

    def gradients(self):
        return self._gradients


def parse_spec(spec):
    return [[[int(d) for d in t.split("x")] for t in b.split(",")] for b in spec.split(";")]


def bucket_numel(shapes):
    total = 0
    for shape in shapes:
        n = 1
        for d in shape:
            n *= d
        total += n
    return total


def run_rank(rank, world, init_file, args):
    out, _, spec, iters, approx_rank, start, ef, warm, batch, eps, seed, min_rate = args
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                            world_size=world)
    buckets = parse_spec(spec)
    state = powersgd.PowerSGDState(
        process_group=None, matrix_approximation_rank=int(approx_rank),
        start_powerSGD_iter=int(start), min_compression_rate=float(min_rate),
        use_error_feedback=ef == "1", warm_start=warm == "1",
        orthogonalization_epsilon=float(eps), random_seed=int(seed),
        batch_tensors_with_same_shape=batch == "1")
    tensors = {}
    for it in range(int(iters)):
        for b, shapes in enumerate(buckets):
            g = torch.Generator().manual_seed(100_000 * rank + 100 * it + b)
            grad = torch.randn(bucket_numel(shapes), generator=g)
            tensors[f"in.{it}.{b}"] = grad.clone()
            bucket = Bucket(b, b + 1 == len(buckets), grad, shapes)
            tensors[f"out.{it}.{b}"] = powersgd.powerSGD_hook(state, bucket).wait().clone()
    _, before, after = state.compression_stats()
    tensors["stats"] = torch.tensor([before, after, state.iter], dtype=torch.int64)
    save_file(tensors, os.path.join(out, f"rank{rank}.safetensors"))
    # Gloo's teardown can abort a rank that leaves while a peer still talks to it.
    dist.barrier()
    dist.destroy_process_group()


def main():
    args = sys.argv[1:]
    out, world = args[0], int(args[1])
    init_file = os.path.join(out, "init")
    mp.spawn(run_rank, args=(world, init_file, args), nprocs=world)


if __name__ == "__main__":
    main()
