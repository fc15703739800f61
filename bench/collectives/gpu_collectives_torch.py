#!/usr/bin/env python3
"""PyTorch's torch.distributed on the ops and sizes of bench_gpu_collectives, checked then
timed the same way (3 warm-up calls, --iters timed calls between two device
synchronisations), one JSON line per row. Ops c10d's backend does not run on CUDA tensors
(its Gloo lacks some) are reported as such, not timed.

    python3 bench/collectives/gpu_collectives_torch.py --backend nccl --world 1 --json out.jsonl
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist


def ops(world):
    def check_blocks(out):
        blocks = out.cpu().view(world, -1)
        return all(bool(blocks[r].eq(r + 1.0).all()) for r in range(world))

    tri = world * (world + 1) / 2.0
    return [
        ("all_reduce", lambda n: n, lambda i, o: dist.all_reduce(i),
         lambda i, o: bool(i.cpu().eq(tri).all())),
        ("broadcast", lambda n: n, lambda i, o: dist.broadcast(i, 0),
         lambda i, o: bool(i.cpu().eq(1.0).all())),
        ("all_gather_into_tensor", lambda n: n * world, lambda i, o: dist.all_gather_into_tensor(o, i),
         lambda i, o: check_blocks(o)),
        ("reduce_scatter_tensor", lambda n: n // world, lambda i, o: dist.reduce_scatter_tensor(o, i),
         lambda i, o: bool(o.cpu().eq(tri).all())),
        ("all_to_all_single", lambda n: n, lambda i, o: dist.all_to_all_single(o, i),
         lambda i, o: check_blocks(o)),
    ]


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_rank(args):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.device == "cuda":
        # Ranks beyond the GPU count share GPUs (Gloo allows it; NCCL refuses two ranks on one).
        gpus = max(1, torch.cuda.device_count())
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % gpus)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if args.backend == "nccl":
        dist.init_process_group("cpu:gloo,cuda:nccl", rank=rank, world_size=world, device_id=device)
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    if rank == 0:
        print("%-8s %-24s %5s %12s %12s" % ("impl", "op", "world", "bytes", "us"), flush=True)
    failed = False
    for name, out_numel, run, check in ops(world):
        nbytes = args.min_bytes
        while nbytes <= args.max_bytes:
            numel = max(world, nbytes // 4 // world * world)
            inp = torch.full((numel,), rank + 1.0, device=device)
            out = torch.empty(out_numel(numel), device=device)
            row = {"impl": "pytorch", "backend": args.backend, "device": args.device, "op": name,
                   "world": world, "bytes": numel * 4}
            try:
                run(inp, out)
                synchronize(device)
                ok = check(inp, out)
            except (RuntimeError, ValueError) as e:  # an op this backend does not run on CUDA
                ok, row["unsupported"] = None, str(e).splitlines()[0][:120]
            verdict = torch.tensor([0 if ok else 1], dtype=torch.long)
            dist.all_reduce(verdict)  # CPU tensor: gloo in both set-ups
            if ok is None or verdict.item() != 0:
                if ok is not None:
                    failed = True
                    row["wrong"] = True
                if rank == 0:
                    print("%-8s %-24s %5d %12d %12s" % ("pytorch", name, world, numel * 4,
                                                        "unsupported" if ok is None else "WRONG"))
                    write(args, row)
                nbytes *= args.step
                continue
            for _ in range(3):
                run(inp, out)
            synchronize(device)
            dist.barrier()
            start = time.perf_counter()
            for _ in range(args.iters):
                run(inp, out)
            synchronize(device)
            row["us"] = (time.perf_counter() - start) / args.iters * 1e6
            if rank == 0:
                print("%-8s %-24s %5d %12d %12.1f" % ("pytorch", name, world, numel * 4, row["us"]),
                      flush=True)
                write(args, row)
            nbytes *= args.step
    dist.destroy_process_group()
    return 1 if failed else 0


def write(args, row):
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(row) + "\n")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--min-bytes", type=int, default=1 << 16)
    p.add_argument("--max-bytes", type=int, default=1 << 26)
    p.add_argument("--step", type=int, default=16)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--json", default="")
    args = p.parse_args()
    if "RANK" in os.environ:
        code = run_rank(args)
        sys.stdout.flush()
        os._exit(code)  # as bench/train/gpt_torch.py: Gloo threads can abort the teardown
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(args.world))
    procs = [subprocess.Popen([sys.executable] + sys.argv, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
             for r in range(args.world)]
    sys.exit(max(proc.wait() for proc in procs))


if __name__ == "__main__":
    main()
