#!/usr/bin/env bash
# README command 1, second half: trains the default GPT (examples/gpt) on 2 local ranks,
# started by tdistrun, then prints a generated sample. Outputs land in runs/quickstart/.
# Extra arguments go to the trainer (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
for exe in "$BUILD_DIR/tools/tdistrun/tdistrun" "$BUILD_DIR/examples/gpt/gpt"; do
  [ -x "$exe" ] || { echo "quickstart: $exe is missing; run tools/setup.sh first" >&2; exit 1; }
done
exec "$BUILD_DIR/tools/tdistrun/tdistrun" --standalone --nproc-per-node 2 \
  "$BUILD_DIR/examples/gpt/gpt" --name quickstart "$@"
