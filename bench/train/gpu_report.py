#!/usr/bin/env python3
"""The training rows tools/gpu-check.sh collects (bench_train and gpt_torch.py JSON lines,
one GPU, world 1) as one Markdown table: step time over plain LibTorch, over the same
framework's plain model (its FSDP overhead: tdist's rows over tdist single, PyTorch's over
pytorch single), over PyTorch's fully_shard, peak GPU memory against 16 bytes per
parameter / world (fp32 parameters, gradients and AdamW's two moments) plus activations,
and whether each run's loss was finite and matched the others'.

    python3 bench/train/gpu_report.py gpu-train.jsonl
"""
import json
import sys

# Dense peaks of one H200 (TFLOP/s): fp32 without TF32 (PyTorch's default for float32 matmuls
# on CUDA, and LibTorch's), and bf16 on the tensor cores.
PEAK_TFLOPS = {"float32": 67.0, "bfloat16": 989.0}


def name(r):
    return ("tdist " if r["impl"] == "tdist" else "pytorch ") + r["mode"] + (
        "+offload" if r.get("cpu_offload") else "")


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    by = {name(r): r for r in rows}
    plain, torch_fsdp = by.get("tdist single"), by.get("pytorch fsdp2")

    def ratio(r, base):
        return "%.3f" % (r["step_ms"] / base["step_ms"]) if base else "-"

    print("| run | step ms | / plain LibTorch | / own plain | / PyTorch fully_shard "
          "| tokens/s | TFLOP/s | MFU | peak GPU MiB | 16 Psi / N MiB | final loss | ok |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        bound = 16.0 * r.get("parameters", 0) / r["world_size"] / 2**20
        peak = max(r.get("peak_device_bytes", [0])) / 2**20
        own_plain = by.get(r["impl"] + " single")
        tflops = r.get("flops_per_token", 0.0) * r["tokens_per_s"] / 1e12
        peak_tflops = PEAK_TFLOPS.get(r.get("dtype", "float32"), 0.0) * r["world_size"]
        mfu = "%.1f%%" % (100.0 * tflops / peak_tflops) if tflops and peak_tflops else "-"
        print("| %s | %.1f | %s | %s | %s | %.0f | %.1f | %s | %.0f | %.0f | %.4f | %s |" % (
            name(r), r["step_ms"], ratio(r, plain), ratio(r, own_plain), ratio(r, torch_fsdp),
            r["tokens_per_s"], tflops, mfu, peak, bound, r["final_loss"],
            "yes" if r["ok"] else "NO"))
    print("\nTFLOP/s: flops_per_token (6 x the multiplying parameters + 12 x layers x width x "
          "sequence) x tokens/s; MFU against %s TFLOP/s per GPU (H200 dense)." % (
              ", ".join("%s %.0f" % kv for kv in PEAK_TFLOPS.items())))
    losses = [r["final_loss"] for r in rows]
    if losses:
        print("\nfinal losses (same initial weights and batches): spread %.2e"
              % (max(losses) - min(losses)))


if __name__ == "__main__":
    main(sys.argv[1])
