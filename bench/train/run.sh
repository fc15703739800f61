#!/bin/sh
# Training benchmark of the GPT example's model: tokens/s and peak memory per rank for
# tdist single / DDP / FSDP and Python PyTorch DDP, same model, same batch per rank.
#   sh bench/train/run.sh [build-dir] [extra bench flags, e.g. --steps 10 --n-layer 2]
# Results are also appended as JSON lines to bench-train.jsonl in the current directory.
set -u
build=${1:-build}
[ $# -gt 0 ] && shift
bin="$build/bench/train/bench_train"
here=$(cd "$(dirname "$0")" && pwd)
[ -x "$bin" ] || { echo "no $bin: build it with ninja -C $build bench_train" >&2; exit 1; }
out=bench-train.jsonl
"$bin" --header
"$bin" --mode single --nproc 1 --json "$out" "$@" || echo "tdist single failed"
"$bin" --mode ddp --nproc 2 --json "$out" "$@" || echo "tdist ddp failed"
"$bin" --mode fsdp --nproc 2 --json "$out" "$@" 2>/dev/null || echo "tdist fsdp: not available in this build"
/usr/bin/python3 "$here/gpt_ddp.py" --nproc 2 --json "$out" "$@" || echo "pytorch ddp failed"
