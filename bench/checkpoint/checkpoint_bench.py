"""Python's side of bench_checkpoint: dcp.save then dcp.load of the same tensors (one
process), best of `rounds`; prints "python save_ms load_ms ok"."""

import os
import shutil
import sys
import tempfile
import time
import warnings

import torch
import torch.distributed.checkpoint as dcp

warnings.simplefilter("ignore")  # "no process group: assuming a single process"


def main():
    mib, tensors, rounds, root = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    cols = 1024
    rows = max(1, mib * (1 << 20) // 4 // cols // tensors)
    g = torch.Generator().manual_seed(1)
    state = {f"model.t{i}": torch.randn(rows, cols, generator=g) for i in range(tensors)}
    best_save = best_load = float("inf")
    ok = True
    for r in range(rounds):
        d = tempfile.mkdtemp(dir=root)
        t0 = time.perf_counter()
        dcp.save(state, checkpoint_id=d)
        best_save = min(best_save, time.perf_counter() - t0)
        target = {k: torch.zeros_like(v) for k, v in state.items()}
        t0 = time.perf_counter()
        dcp.load(target, checkpoint_id=d)
        best_load = min(best_load, time.perf_counter() - t0)
        ok = ok and all(torch.equal(target[k], state[k]) for k in state)
        shutil.rmtree(d)
    print(f"python {best_save * 1e3:.1f} {best_load * 1e3:.1f} {int(ok)}")


if __name__ == "__main__":
    main()
