#!/usr/bin/env bash
# Runs the whole test suite: sets up (packages, configure, build every target) if needed,
# then ctest.
# Usage: tools/test.sh [build-dir] [extra ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
shift || true
tools/setup.sh "$BUILD_DIR" all
echo "== running the test suite"
# Tests spawn ranks as processes; more ranks than cores is normal here, so run tests one at
# a time (their own ranks already oversubscribe 2 cores).
cd "$BUILD_DIR"
OMP_NUM_THREADS=1 ctest --output-on-failure --timeout 900 "$@"
