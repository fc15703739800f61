#!/usr/bin/env python3
"""Side by side: the JSON lines of bench_gpu_collectives and gpu_collectives_torch.py (one
file), as a Markdown table per backend and world size: microseconds per call for tdist and
PyTorch, and tdist / PyTorch (below 1: tdist is faster).

    python3 bench/collectives/gpu_collectives_report.py gpu-collectives.jsonl
"""
import json
import sys


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    keys = sorted({(r["backend"], r["world"]) for r in rows})
    for backend, world in keys:
        print(f"\n{backend}, world {world}, float32, {rows[0]['device']}\n")
        print("| op | bytes | tdist us | PyTorch us | tdist / PyTorch |")
        print("| --- | ---: | ---: | ---: | ---: |")
        here = [r for r in rows if r["backend"] == backend and r["world"] == world]
        by = {(r["impl"], r["op"], r["bytes"]): r for r in here}
        for op, nbytes in sorted({(r["op"], r["bytes"]) for r in here}):
            t, p = by.get(("tdist", op, nbytes)), by.get(("pytorch", op, nbytes))
            t_us = "%.1f" % t["us"] if t and "us" in t else "-"
            if p is None:
                p_us = "-"
            elif "us" in p:
                p_us = "%.1f" % p["us"]
            else:
                p_us = "unsupported" if "unsupported" in p else "WRONG"
            ratio = "%.2f" % (t["us"] / p["us"]) if t and p and "us" in t and "us" in p else "-"
            print(f"| {op} | {nbytes} | {t_us} | {p_us} | {ratio} |")


if __name__ == "__main__":
    main(sys.argv[1])
