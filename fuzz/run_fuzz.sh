#!/usr/bin/env bash
# Builds the store-parser fuzzer with clang++ (libFuzzer + ASan + UBSan) and runs a short,
# bounded session. Used by ctest (fuzz/CMakeLists.txt) and by hand:
#   fuzz/run_fuzz.sh <source dir> <work dir> [libFuzzer flags, e.g. -max_total_time=600]
# Exit status: the fuzzer's (non-zero on a crash or a broken property). Prints SKIPPED and
# exits 0 only when no clang++ is installed.
set -euo pipefail
src=${1:?source dir}
work=${2:?work dir}
shift 2
clangxx=${CLANGXX:-$(command -v clang++ || command -v clang++-14 || true)}
if [[ -z "$clangxx" ]]; then
  echo "SKIPPED: clang++ not found; install clang to run the store fuzzer"
  exit 0
fi
mkdir -p "$work/corpus"
bin="$work/store_protocol_fuzzer"
"$clangxx" -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -I"$src/src" -I"$src/include" \
  "$src/fuzz/store_protocol_fuzzer.cpp" "$src/src/store/tcp_store_protocol.cpp" -o "$bin"
# Seeds: one valid frame of a few ops, so mutations start from the interesting shapes.
printf '\x02\x0e\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00k\x01\x00\x00\x00\x00\x00\x00\x00v' \
  > "$work/corpus/seed_set"
printf '\x08\x00\x00\x00\x00\x00\x00\x00\x00' > "$work/corpus/seed_num_keys"
printf 'GET / HTTP/1.1\r\n\r\n' > "$work/corpus/seed_http"
if [[ $# -eq 0 ]]; then set -- -runs=20000; fi
exec "$bin" -max_len=4096 -timeout=10 -rss_limit_mb=1024 "$@" "$work/corpus"
