#!/usr/bin/env python3
"""Two builds of bench_fsdp side by side: runs them interleaved (old, new, old, ...), one
round of the modes each, and prints per mode and column the median of each build, new/old
and the old build's spread (max/min over its runs). Only rows with #wrong 0 count.

  bench/fsdp/compare_builds.py --old OLD/bench_fsdp --new NEW/bench_fsdp --runs 5

The environment passes through (BENCH_*, TDIST_FSDP_PERSISTENT_BUFFERS=0 for the general
path, ...); BENCH_ROUNDS defaults to 1 and BENCH_MODES to ddp and the three FSDP modes.
"""
import argparse
import os
import statistics
import subprocess

MODES = ("ddp", "fsdp_full", "fsdp_zero2", "fsdp_noprefetch")
COLUMNS = (("step_ms", 1), ("med_ms", 3), ("copy_ms/mod", 8), ("fsdp_us/mod", 9))


def run(binary, env):
    out = subprocess.run([binary], capture_output=True, text=True, env=env, check=True).stdout
    rows = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 14 and f[0] in MODES and f[-1] == "0":
            for name, idx in COLUMNS:
                rows[(f[0], name)] = float(f[idx])
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--old", required=True)
    parser.add_argument("--new", required=True)
    parser.add_argument("--runs", type=int, default=5)
    a = parser.parse_args()
    env = dict(os.environ)
    env.setdefault("BENCH_ROUNDS", "1")
    env.setdefault("BENCH_MODES", ",".join(MODES))
    env.setdefault("OMP_NUM_THREADS", "1")
    old, new = [], []
    for _ in range(a.runs):
        old.append(run(a.old, env))
        new.append(run(a.new, env))
    for key in old[0]:
        o = [r[key] for r in old if key in r]
        n = [r[key] for r in new if key in r]
        if not n or any(v != v for v in o + n):  # nan: the column does not apply
            continue
        mo, mn = statistics.median(o), statistics.median(n)
        print(f"{key[0]:16} {key[1]:12} old {mo:8.2f} new {mn:8.2f} new/old {mn / mo:5.2f}"
              f" old spread {max(o) / min(o):5.2f}")
    print(f"# {a.runs} interleaved runs each")


if __name__ == "__main__":
    main()
