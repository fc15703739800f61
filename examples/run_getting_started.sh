#!/usr/bin/env bash
# Test: runs the getting-started program under tdistrun with N ranks; passes when the launcher
# exits 0 and every rank printed the right sum.
set -uo pipefail
tdistrun=$1 program=$2 n=$3
out=$("$tdistrun" --standalone --nproc-per-node "$n" "$program" 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "FAIL: tdistrun exited $rc"; exit 1; }
sum=$(( n * (n + 1) / 2 ))
got=$(grep -cE "^\[rank [0-9]+\]: rank [0-9]+/$n: sum $sum, gathered $((4 * n)) values" <<<"$out")
[ "$got" -eq "$n" ] || { echo "FAIL: $got of $n ranks printed sum $sum"; exit 1; }
echo "PASS: $n ranks"
