#!/usr/bin/env python3
"""torch.optim's step timed as bench_optim times tdist's: the same shapes (shapes.txt), the
same parameters and gradients (the same seeded CPU generator), the same steps and rounds.
Prints one JSON line per implementation (for-loop, foreach, fused).

    .venv/bin/python bench/optim/optim_torch.py bench/optim/shapes.txt --optimizer adamw
"""
import argparse
import json
import time

import torch


def shapes_of(path):
    out = []
    for line in open(path):
        line = line.strip()
        if line and not line.startswith("#"):
            out.append([int(d) for d in line.split()])
    return out


def make(name, params, flags):
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-3, **flags)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-2, momentum=0.9, **flags)
    return torch.optim.AdamW(params, lr=1e-3, **flags)


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def run(args, impl):
    flags = {"for-loop": dict(foreach=False), "foreach": dict(foreach=True),
             "fused": dict(fused=True)}[impl]
    gen = torch.Generator().manual_seed(0)
    params = []
    for shape in shapes_of(args.shapes):
        p = torch.randn(shape, generator=gen).to(args.device)
        p.grad = (torch.randn(shape, generator=gen) * 1e-2).to(args.device)
        params.append(p)
    opt = make(args.optimizer, params, flags)
    opt.step()
    sync(args.device)
    ms = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        for _ in range(args.steps):
            opt.step()
        sync(args.device)
        ms.append((time.perf_counter() - start) * 1e3 / args.steps)
    ms.sort()
    checksum = sum(float((p.double() * p.grad.double()).sum()) for p in params)
    print(json.dumps({"impl": impl, "optimizer": args.optimizer, "ms": ms[len(ms) // 2],
                      "checksum": checksum}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes")
    ap.add_argument("--optimizer", default="adamw", choices=["adamw", "adam", "sgd"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with torch.no_grad():
        for impl in ("for-loop", "foreach", "fused"):
            run(args, impl)


if __name__ == "__main__":
    main()
