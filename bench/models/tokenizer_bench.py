"""The Python `tokenizers` half of `bench/models/run.sh --tokenizer`: encode and decode of a
whole text file on one thread (RAYON_NUM_THREADS=1; a single encode does not use threads),
printing what bench_tokenizer prints.
  tokenizer_bench.py TOKENIZER_JSON TEXT_FILE [ROUNDS]
"""
import json
import os
import statistics
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import Tokenizer  # noqa: E402

path, text_path = sys.argv[1], sys.argv[2]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
text = open(text_path, encoding="utf-8").read()
enc, dec = [], []
for _ in range(rounds):
    tok = Tokenizer.from_file(path)  # a fresh tokenizer (and cache) each round, as tdist's side
    start = time.perf_counter()
    ids = tok.encode(text, add_special_tokens=False).ids
    enc.append(time.perf_counter() - start)
    start = time.perf_counter()
    back = tok.decode(ids)
    dec.append(time.perf_counter() - start)
    if back != text:
        sys.exit("decode(encode(text)) != text")
checksum = 0
for i in ids:
    checksum = (checksum * 1000003 + i) % (1 << 64)
e, d = statistics.median_high(enc), statistics.median_high(dec)
print(json.dumps({"impl": "tokenizers", "tokens": len(ids), "encode_tokens_per_s": round(len(ids) / e),
                  "encode_mb_per_s": round(len(text.encode()) / e / 1e6, 2),
                  "decode_tokens_per_s": round(len(ids) / d), "checksum": str(checksum)}))
