#!/bin/sh
# Training benchmark of the GPT example's model, side by side in one run: tokens/s, step time,
# peak memory per rank and the final loss for tdist single / DDP / FSDP and PyTorch's DDP,
# FSDP1 (FullyShardedDataParallel) and FSDP2 (fully_shard), same model, same initial weights,
# same batches, same threads per rank, the same AdamW implementation on both sides (fused by
# default; --optimizer-impl foreach|for-loop|default changes both). The last table gives each
# distributed PyTorch row's throughput as a ratio of tdist's same mode, and whether the final
# losses agree.
#   sh bench/train/run.sh [build-dir] [extra flags for both sides, e.g. --steps 10 --n-layer 2]
# Results are also appended as JSON lines to bench-train.jsonl in the current directory.
set -u
build=${1:-build}
[ $# -gt 0 ] && shift
bin="$build/bench/train/bench_train"
here=$(cd "$(dirname "$0")" && pwd)
python=${TDIST_PYTHON:-$here/../../.venv/bin/python}
[ -x "$bin" ] || { echo "no $bin: build it with ninja -C $build bench_train" >&2; exit 1; }
out=bench-train.jsonl
init=$(mktemp -d)/init.pt
: > "$out"
"$bin" --header
"$bin" --mode single --nproc 1 --json "$out" "$@" || echo "tdist single failed"
"$bin" --mode ddp --nproc 2 --json "$out" --init-out "$init" "$@" || echo "tdist ddp failed"
"$bin" --mode fsdp --nproc 2 --json "$out" "$@" || echo "tdist fsdp failed"
for mode in ddp fsdp1 fsdp2; do
  "$python" "$here/gpt_torch.py" --mode $mode --nproc 2 --init "$init" --json "$out" "$@" \
    || echo "pytorch $mode failed"
done
"$python" - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
tdist = {r["mode"]: r for r in rows if r["impl"] == "tdist"}
print("\n%-14s %-12s %12s %12s %10s %12s %12s %s" % ("pytorch", "vs tdist", "tok/s", "tdist tok/s",
      "tdist/pt", "loss", "tdist loss", "losses agree"))
for r in rows:
    if r["impl"] != "pytorch":
        continue
    mine = tdist.get("ddp" if r["mode"] == "ddp" else "fsdp")
    if mine is None:
        continue
    agree = abs(r["final_loss"] - mine["final_loss"]) <= 1e-3 * max(1.0, abs(mine["final_loss"]))
    print("%-14s %-12s %12.0f %12.0f %10.2f %12.5f %12.5f %s" % (
        r["mode"], mine["mode"], r["tokens_per_s"], mine["tokens_per_s"],
        mine["tokens_per_s"] / r["tokens_per_s"], r["final_loss"], mine["final_loss"],
        "yes" if agree else "NO"))
PY
