#!/usr/bin/env bash
# Packs what tools/gpu-check.sh runs on the GPU machine into .gpu-carry/ (git-ignored): the
# GPU test and benchmark binaries built here (stripped) and the Debian libraries they load
# that PyTorch's wheel does not bring. That machine has no network and none of tdist's build
# dependencies, but the same PyTorch (2.11.0+cu130) as tools/torch-version.txt, whose
# LibTorch the binaries were linked against. Then, on a task lent a GPU:
#   run(command="bash tools/gpu-check.sh", carry=[".gpu-carry"], timeout_s=480)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
BINARIES=(tests/nccl/test_nccl tests/nccl/test_nccl_cuda tests/nccl/test_gloo_cuda
          tests/train_cuda/test_train_cuda tests/gpt/test_gpt
          bench/collectives/bench_gpu_collectives bench/train/bench_train)
targets=()
for b in "${BINARIES[@]}"; do targets+=("$(basename "$b")"); done
cmake --build "$BUILD_DIR" -j2 --target "${targets[@]}"
rm -rf .gpu-carry
mkdir -p .gpu-carry/bin .gpu-carry/lib
for b in "${BINARIES[@]}"; do
  strip -o ".gpu-carry/bin/$(basename "$b")" "$BUILD_DIR/$b"
done
# Everything the binaries (and the Gloo module they load from memory, on libgloo) resolve
# outside LibTorch, NVIDIA's libraries and the C/C++ runtime.
{
  for b in "${BINARIES[@]}"; do ldd "$BUILD_DIR/$b"; done
  ldd /usr/lib/libgloo.so.0
  echo "libgloo.so.0 => /usr/lib/libgloo.so.0"
} | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  grep -v -E '/(\.venv|cuda)/|/lib(c|m|dl|rt|pthread|util|gcc_s|stdc\+\+)\.so' |
  while read -r lib; do cp -L "$lib" .gpu-carry/lib/; done
cp tools/torch-version.txt .gpu-carry/
git rev-parse --short HEAD > .gpu-carry/commit.txt
du -sh .gpu-carry
ls .gpu-carry/bin .gpu-carry/lib
