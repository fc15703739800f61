#!/usr/bin/env bash
# The GPU checks, on the one-H200 machine (see tools/gpu-pack.sh, which builds what this runs
# and says how to send it), in about 8 minutes against that machine's PyTorch:
#  1. the CUDA suites: test_nccl (unit tests, now with a GPU), test_nccl_cuda (every op and
#     dtype at world 1 over NCCL), test_gloo_cuda (worlds 2 and 3 sharing the GPU over Gloo:
#     NCCL refuses two ranks on one GPU), test_train_cuda (FSDP fp32 / bf16 / offload parity,
#     DDP parity, checkpoints CUDA -> CPU -> CUDA), test_gpt's CUDA case, test_models' CUDA
#     cases (a Qwen2 folder loaded onto the GPU computes what the CPU does; the tensor-parallel
#     plan with sequence and loss parallelism on CUDA tensors at world 1, and 2 over Gloo);
#  2. collectives: tdist NCCL (world 1) and Gloo on CUDA tensors (world 2) beside
#     torch.distributed on the same GPU, ops and sizes (bench/collectives/gpu_collectives_*);
#  3. training: a 116M-parameter GPT at world 1: plain LibTorch, tdist FSDP, tdist FSDP with
#     CPU offload, plain PyTorch, PyTorch fully_shard (with and without offload), step time
#     and peak GPU memory (bench/train/gpu_report.py).
# The suites run side by side (they only check results; each has its own port and GPU
# memory is ample), the benchmarks one at a time on a quiet GPU. Each part's log goes to
# $LOG; $OUT gets the two tables and one archive of every log, because the device call
# returns at most 8 files. Exit status: non-zero if any suite failed or skipped, a benchmark
# failed its own checks, or a part did not fit in the budget (GPU_CHECK_BUDGET_S, default
# 480 s).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-check}
LOG=${GPU_CHECK_LOG_DIR:-/tmp/gpu-check-logs}
rm -rf "$LOG"
mkdir -p "$OUT" "$LOG"
# The archive is written however the check ends; the model's initial weights stay behind.
trap 'tar czf "$OUT/gpu-check-logs.tgz" -C "$LOG" --exclude="*.pt" . 2>/dev/null' EXIT
[ -d .gpu-carry/bin ] || { echo "gpu-check: .gpu-carry/ is missing; run tools/gpu-pack.sh here and carry it" >&2; exit 2; }
TORCH_DIR=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')
SITE=$(dirname "$TORCH_DIR")
LIBS=.gpu-carry/lib:$TORCH_DIR/lib
for d in "$SITE"/nvidia/*/lib "$SITE"/nvidia/cu13/lib; do [ -d "$d" ] && LIBS=$LIBS:$d; done
export LD_LIBRARY_PATH=$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OMP_NUM_THREADS=1
export TDIST_GPT_DATA=$PWD/data/kjv.txt
BIN=.gpu-carry/bin
nvidia-smi -L
python3 -c 'import torch; print("torch", torch.__version__, "built for", open(".gpu-carry/torch-version.txt").read().strip(), "|", torch.cuda.get_device_name(0))'
# gpu-pack.sh's commit: the device's copy of .git can be older than the files sent with it.
echo "binaries of commit $(cat .gpu-carry/commit.txt 2>/dev/null || echo '?')"
# Preflight, in a second: every binary finds its libraries and symbol versions here, so a
# machine unlike this one's recipe fails now, naming what is missing, not after minutes.
if command -v ldd > /dev/null; then
  unresolved=$(for b in "$BIN"/*; do ldd "$b" 2>&1 | sed "s|^|$(basename "$b"): |"; done |
               grep 'not found' | sort -u)
  if [ -n "$unresolved" ]; then
    echo "gpu-check: the packed binaries cannot load here (they need" \
         "$(paste -sd' ' .gpu-carry/requires.txt 2>/dev/null); this machine's C library:" \
         "$(ldd --version | head -1)):" >&2
    echo "$unresolved" >&2
    echo "gpu-check: build them here instead, or pack the missing libraries (tools/gpu-pack.sh)" >&2
    exit 3
  fi
fi
status=0
# One budget for the whole check (the device call's own limit is the hard stop): a part that
# hangs until its own limit leaves the rest less time, and what no longer fits is reported as
# not run instead of the call being cut off before the tables are written.
BUDGET_S=${GPU_CHECK_BUDGET_S:-480}
END=$(( $(date +%s) + BUDGET_S ))
run_part() {  # run_part NAME TIMEOUT COMMAND...: runs one part, logs it, records its exit
  local name=$1 limit=$2
  shift 2
  local left=$(( END - $(date +%s) ))
  if (( left < 15 )); then
    echo "== $name: not run: the check's ${BUDGET_S} s budget is spent" | tee "$LOG/$name.log"
    echo 125 > "$LOG/$name.rc"
    return
  fi
  (( limit > left )) && limit=$left
  local start
  start=$(date +%s)
  timeout "$limit" "$@" > "$LOG/$name.log" 2>&1
  local rc=$?
  echo "$rc" > "$LOG/$name.rc"
  echo "== $name: exit $rc in $(( $(date +%s) - start )) s"
  # A failure's last lines, so the call's output alone says what went wrong.
  [ "$rc" -eq 0 ] || tail -4 "$LOG/$name.log" | cut -c1-300 | sed 's/^/   | /'
}
part_rc() { cat "$LOG/$1.rc" 2>/dev/null || echo 126; }
step() {  # step NAME TIMEOUT COMMAND...: one part in the foreground; a failure fails the check
  run_part "$@"
  local rc
  rc=$(part_rc "$1")
  [ "$rc" -eq 0 ] || status=1
  return "$rc"
}
# A suite passes only when none of its tests skipped: on this machine a skip means the GPU
# was not seen (a suite with CPU cases beside its CUDA ones still exits 0 then).
suite_summary() {  # suite_summary NAME LINES
  local log=$LOG/$1.log
  [ "$(part_rc "$1")" -eq 0 ] || status=1
  grep -E '^\[  (FAILED|SKIPPED) |^\[  PASSED|tests ran' "$log" | tail -"$2"
  if grep -q -E '^\[  SKIPPED \] [0-9]+ tests?,' "$log"; then
    echo "== $1: some tests skipped: that is not a pass here"
    status=1
  fi
}
SUITES=(test_nccl test_nccl_cuda test_gloo_cuda test_train_cuda)
# test_nccl's NcclWithoutGpu cases check the errors of a machine with no GPU: they skip here.
run_part test_nccl 120 "$BIN/test_nccl" --gtest_filter='-NcclWithoutGpu.*' &
for suite in "${SUITES[@]:1}"; do
  run_part "$suite" 240 "$BIN/$suite" &
done
run_part test_gpt_cuda 180 "$BIN/test_gpt" --gtest_filter='GptTrain.Cuda*:GptDevice.*' &
# The model families on the GPU, tensor parallelism included (the transformers oracle is not
# installed there).
run_part test_models_cuda 180 "$BIN/test_models" --gtest_filter='ModelsOnCuda.*' &
wait
for suite in "${SUITES[@]}"; do
  suite_summary "$suite" 15
done
suite_summary test_gpt_cuda 5
suite_summary test_models_cuda 5

# Collectives, side by side (one JSON file, one table per backend and world).
coll=$LOG/gpu-collectives.jsonl
: > "$coll"
step coll_tdist_nccl 60 "$BIN/bench_gpu_collectives" --backend nccl --world 1 --json "$coll"
step coll_torch_nccl 90 python3 bench/collectives/gpu_collectives_torch.py --backend nccl --world 1 --json "$coll"
step coll_tdist_gloo 90 "$BIN/bench_gpu_collectives" --backend gloo --world 2 --max-bytes 16777216 --iters 5 --json "$coll"
step coll_torch_gloo 120 python3 bench/collectives/gpu_collectives_torch.py --backend gloo --world 2 --max-bytes 16777216 --iters 5 --json "$coll"
python3 bench/collectives/gpu_collectives_report.py "$coll" | tee "$OUT/gpu-collectives.md"

# Training: one GPT, one batch, fp32, world 1.
train=$LOG/gpu-train.jsonl
: > "$train"
MODEL=(--n-layer 12 --n-embd 896 --n-head 14 --block-size 512 --batch-size 8 --steps 20 --warmup 3)
init=$LOG/gpt-init.pt
"$BIN/bench_train" --header | tee "$LOG/gpu-train.log"
step train_tdist_single 120 "$BIN/bench_train" --device cuda --mode single --init-out "$init" --json "$train" "${MODEL[@]}"
step train_tdist_fsdp 120 "$BIN/bench_train" --device cuda --mode fsdp --json "$train" "${MODEL[@]}"
step train_tdist_offload 150 "$BIN/bench_train" --device cuda --mode fsdp --cpu-offload --json "$train" "${MODEL[@]}"
step train_torch_single 150 python3 bench/train/gpt_torch.py --device cuda --mode single --nproc 1 --init "$init" --json "$train" "${MODEL[@]}"
step train_torch_fsdp2 150 python3 bench/train/gpt_torch.py --device cuda --mode fsdp2 --nproc 1 --init "$init" --json "$train" "${MODEL[@]}"
step train_torch_offload 150 python3 bench/train/gpt_torch.py --device cuda --mode fsdp2 --cpu-offload --nproc 1 --init "$init" --json "$train" "${MODEL[@]}"
for part in train_tdist_single train_tdist_fsdp train_tdist_offload train_torch_single train_torch_fsdp2 \
            train_torch_offload; do
  grep -E '^(tdist|pytorch) ' "$LOG/$part.log" | tee -a "$LOG/gpu-train.log"
done
python3 bench/train/gpu_report.py "$train" | tee "$OUT/gpu-train.md"
exit $status
