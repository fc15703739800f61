#!/bin/sh
# The model families side by side with transformers, and loading a ~1B model into shards.
#   sh bench/models/run.sh [build-dir]              forward + backward tokens/s of each family
#                                                   in tdist and in transformers (same folder,
#                                                   threads, batch), alternating, 3 rounds
#   sh bench/models/run.sh [build-dir] --smoke      a tiny model per family, one step a side
#   sh bench/models/run.sh [build-dir] --load DIR   a ~1B Llama (made in DIR once) loaded into
#                                                   FSDP shards at world 2: time and peak memory
#   sh bench/models/run.sh [build-dir] --tokenizer  tokenizer encode / decode on one thread
#                                                   against Python tokenizers (the bundled corpus)
#   sh bench/models/run.sh [build-dir] --generate   greedy generation with the KV cache against
#                                                   transformers' generate(), each family, one
#                                                   thread, batch 1 and 4, alternating, 3 rounds
# Exits 1 when the two sides' losses disagree (what is timed is then not the same model).
set -eu
build=${1:-build}
[ $# -gt 0 ] && shift
mode=${1:-}
here=$(cd "$(dirname "$0")" && pwd)
python=${TDIST_PYTHON:-$here/../../.venv/bin/python}
bin="$build/bench/models"
[ -x "$bin/bench_models" ] || { echo "no $bin/bench_models: build it with ninja -C $build bench_models" >&2; exit 1; }

if [ "$mode" = "--load" ]; then
  dir=${2:?--load needs a folder for the ~1B model}
  [ -f "$dir/model.safetensors.index.json" ] || "$python" "$here/models_bench.py" large "$dir"
  exec "$build/tools/tdistrun/tdistrun" --standalone --nproc-per-node 2 \
    "$bin/bench_model_load" "$dir"
fi

if [ "$mode" = "--tokenizer" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  "$python" "$here/../../tests/models/python/tokenizer_oracle.py" make "$work" "$here/../../data/kjv.txt" >/dev/null
  for kind in gpt2 llama3 qwen2; do
    t=$("$bin/bench_tokenizer" "$work/$kind.json" "$here/../../data/kjv.txt" 5)
    p=$("$python" "$here/tokenizer_bench.py" "$work/$kind.json" "$here/../../data/kjv.txt" 5)
    echo "$kind $t" >> "$work/rows"
    echo "$kind $p" >> "$work/rows"
  done
  exec "$python" - "$work/rows" <<'PY'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    kind, text = line.split(" ", 1)
    r = json.loads(text)
    rows[(kind, r["impl"])] = r
print("%-8s %8s %16s %16s %8s %16s %16s %8s %s" % ("kind", "tokens", "tdist enc tok/s", "tokenizers",
      "ratio", "tdist dec tok/s", "tokenizers", "ratio", "same ids"))
ok = True
for kind in ("gpt2", "llama3", "qwen2"):
    t, p = rows[(kind, "tdist")], rows[(kind, "tokenizers")]
    same = t["checksum"] == p["checksum"] and t["tokens"] == p["tokens"]
    ok = ok and same
    print("%-8s %8d %16.0f %16.0f %8.2f %16.0f %16.0f %8.2f %s" % (kind, t["tokens"],
          t["encode_tokens_per_s"], p["encode_tokens_per_s"], t["encode_tokens_per_s"] / p["encode_tokens_per_s"],
          t["decode_tokens_per_s"], p["decode_tokens_per_s"], t["decode_tokens_per_s"] / p["decode_tokens_per_s"],
          "yes" if same else "NO"))
sys.exit(0 if ok else 1)
PY
fi

if [ "$mode" = "--generate" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  gflags="--threads ${BENCH_THREADS:-1} --prompt 16 --new ${BENCH_NEW:-64} --rounds ${BENCH_ROUNDS:-3}"
  for family in llama mistral qwen2 gpt2; do
    "$python" "$here/models_bench.py" make "$family" "$work/$family" >/dev/null 2>&1 \
      || { echo "transformers could not make the $family model" >&2; exit 1; }
    for batch in 1 4; do
      t=$("$bin/bench_generate" "$work/$family" --batch $batch $gflags)
      p=$("$python" "$here/models_bench.py" generate "$work/$family" --batch $batch $gflags 2>/dev/null | tail -1)
      echo "$family $batch $t" >> "$work/rows"
      echo "$family $batch $p" >> "$work/rows"
    done
  done
  exec "$python" - "$work/rows" <<'PY'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    family, batch, text = line.split(" ", 2)
    r = json.loads(text)
    rows[(family, int(batch), r["impl"])] = r
print("%-8s %5s %10s %14s %16s %8s %s" % ("family", "batch", "new tokens", "tdist tok/s",
      "transformers", "ratio", "same tokens"))
ok = True
for family in ("llama", "mistral", "qwen2", "gpt2"):
    for batch in (1, 4):
        t, p = rows[(family, batch, "tdist")], rows[(family, batch, "transformers")]
        same = t["checksum"] == p["checksum"] and t["generated"] == p["generated"]
        ok = ok and same
        print("%-8s %5d %10d %14.1f %16.1f %8.2f %s" % (family, batch, t["generated"],
              t["tokens_per_s"], p["tokens_per_s"], t["tokens_per_s"] / p["tokens_per_s"],
              "yes" if same else "NO"))
sys.exit(0 if ok else 1)
PY
fi

if [ "$mode" = "--smoke" ]; then
  rounds=1; flags="--steps 1 --warmup 0 --threads 1 --batch 2 --seq 16"; smoke=--smoke
else
  rounds=${BENCH_ROUNDS:-3}; flags="--steps ${BENCH_STEPS:-5} --warmup 1 --threads ${BENCH_THREADS:-2} --batch 4 --seq 256"; smoke=
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for family in llama mistral qwen2 gpt2; do
  "$python" "$here/models_bench.py" make "$family" "$work/$family" $smoke >/dev/null 2>&1 \
    || { echo "transformers could not make the $family model" >&2; exit 1; }
  round=1
  while [ "$round" -le "$rounds" ]; do
    t=$("$bin/bench_models" "$work/$family" $flags)
    p=$("$python" "$here/models_bench.py" time "$work/$family" $flags 2>/dev/null | tail -1)
    echo "$family $round $t" >> "$work/rows"
    echo "$family $round $p" >> "$work/rows"
    round=$((round + 1))
  done
done
"$python" - "$work/rows" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    family, _, text = line.split(" ", 2)
    r = json.loads(text)
    rows.setdefault((family, r["impl"]), []).append(r)
print("%-8s %10s %14s %16s %8s %12s %14s %s" % ("family", "params", "tdist tok/s", "transformers", "ratio",
      "tdist loss", "transformers", "losses agree"))
ok = True
for family in ("llama", "mistral", "qwen2", "gpt2"):
    t, p = rows[(family, "tdist")], rows[(family, "transformers")]
    tt = statistics.median_high([r["tokens_per_s"] for r in t])
    pt = statistics.median_high([r["tokens_per_s"] for r in p])
    tl, pl = t[0]["loss"], p[0]["loss"]
    agree = abs(tl - pl) <= 1e-4 * max(1.0, abs(pl)) and t[0]["params"] == p[0]["params"]
    ok = ok and agree
    print("%-8s %10d %14.0f %16.0f %8.2f %12.6f %14.6f %s" % (family, t[0]["params"], tt, pt, tt / pt,
          tl, pl, "yes" if agree else "NO"))
sys.exit(0 if ok else 1)
PY
