#!/usr/bin/env python3
"""Two builds of bench_collectives side by side: runs them interleaved (old, new, old, ...),
so drift of the machine hits both alike, and prints per row the median time of each, the
ratio new/old and the old build's run-to-run spread (max/min over its runs). A row is
flagged when the new build's median is above every run of the old one.

  bench/collectives/compare_builds.py --old OLD/bench_collectives --new NEW/bench_collectives \
      --runs 5 -- --world 2 --min-bytes 65536 --max-bytes 16777216 --step 4 --rounds 3 --no-c10d

For --mpi rows, pass --mpi after "--" (each run then starts its own mpirun).
"""
import argparse
import re
import statistics
import subprocess
import sys

ROW = re.compile(r"^(\w+)\s+(\d+) \|\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+(\d+) \|\s+(?:([\d.]+)\s+[\d.]+\s+(\d+)|n/a)")


def run(binary, args):
    out = subprocess.run([binary] + args, capture_output=True, text=True, check=True).stdout
    rows = {}
    for line in out.splitlines():
        m = ROW.match(line)
        if not m:
            continue
        op, size, t, wrong, symm, symm_wrong = m.groups()
        if int(wrong) or (symm_wrong and int(symm_wrong)):
            sys.exit(f"{binary}: {op} {size}: wrong elements")
        rows[(op, int(size), "plain")] = float(t)
        if symm:
            rows[(op, int(size), "symm")] = float(symm)
    if not rows:
        sys.exit(f"{binary}: no result rows in its output:\n{out}")
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--old", required=True)
    parser.add_argument("--new", required=True)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("bench_args", nargs=argparse.REMAINDER)
    a = parser.parse_args()
    args = a.bench_args[1:] if a.bench_args[:1] == ["--"] else a.bench_args
    old, new = [], []
    for _ in range(a.runs):
        old.append(run(a.old, args))
        new.append(run(a.new, args))
    print(f"{'op':24} {'bytes':>9} {'path':5} | {'old_us':>8} {'new_us':>8} {'new/old':>7}"
          f" | {'old spread':>10}")
    flagged = 0
    for key in old[0]:
        o = [r[key] for r in old if key in r]
        n = [r[key] for r in new if key in r]
        if not n:
            continue
        mo, mn = statistics.median(o), statistics.median(n)
        slower = mn > max(o)
        flagged += slower
        print(f"{key[0]:24} {key[1]:>9} {key[2]:5} | {mo:8.1f} {mn:8.1f} {mn / mo:7.2f}"
              f" | {max(o) / min(o):10.2f}{'  <- above every old run' if slower else ''}")
    print(f"# {a.runs} interleaved runs each; {flagged} rows flagged")


if __name__ == "__main__":
    main()
