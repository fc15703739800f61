#!/usr/bin/env python3
"""GPT-2 (transformers' GPT2LMHeadModel, the trainer's gpt2 family, in plain PyTorch) timed
the same way as bench_train: random tokens (the same generator and seeds, so the same batches), AdamW,
gradient clipping, warmup steps then timed steps. --mode picks the plain model (single: no
wrapper, the baseline for PyTorch's own framework overhead), PyTorch's DDP, FSDP1
(FullyShardedDataParallel, one unit per block) or FSDP2 (fully_shard on each block, then the
root; --cpu-offload adds CPUOffloadPolicy); --init loads the initial parameters bench_train
wrote (--init-out), so the final loss can be compared with tdist's. --device cuda trains on
cuda:LOCAL_RANK over "cpu:gloo,cuda:nccl" (tools/gpu-check.sh). Ranks are started here with
environment variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), not torchrun.

    .venv/bin/python bench/train/gpt_torch.py --mode fsdp2 --nproc 2 --steps 20
"""
import argparse
import json
import math
import os
import resource
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Conv1D(nn.Module):
    """GPT-2's linear layer: weight [in, out] (transformers' layout, which tdist keeps)."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out).normal_(0.0, 0.02))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(
            *x.shape[:-1], -1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_head, self.n_embd = c.n_head, c.n_embd
        self.c_attn = Conv1D(c.n_embd, 3 * c.n_embd)
        self.c_proj = Conv1D(c.n_embd, c.n_embd)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = Conv1D(c.n_embd, 4 * c.n_embd)
        self.c_proj = Conv1D(4 * c.n_embd, c.n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))  # gelu_new


class GPT2Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c.n_embd, eps=1e-5)
        self.attn = Attention(c)
        self.ln_2 = nn.LayerNorm(c.n_embd, eps=1e-5)
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        self.wpe = nn.Embedding(c.block_size, c.n_embd)
        self.h = nn.ModuleList([GPT2Block(c) for _ in range(c.n_layer)])
        self.ln_f = nn.LayerNorm(c.n_embd, eps=1e-5)


class GPT2(nn.Module):
    """transformers' GPT2LMHeadModel in plain PyTorch (the computation tdist's gpt2 family
    implements, parameter for parameter: the same names and layouts), with no dropout and a
    tied head. Plain so that the benchmark times the frameworks (DDP, FSDP), not modeling
    code; run.sh checks both sides end at the same loss from the same weights."""

    def __init__(self, c):
        super().__init__()
        self.transformer = Transformer(c)

    def forward(self, idx):
        t = self.transformer
        x = t.wte(idx) + t.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in t.h:
            x = block(x)
        return t.ln_f(x) @ t.wte.weight.t()


def load_init(model, path):
    """bench_train's parameters (transformers' names and layout)."""
    state = torch.load(path, weights_only=True)
    missing, unexpected = model.load_state_dict(state, strict=False)
    unexpected = [u for u in unexpected if u != "lm_head.weight"]  # tied to the embedding
    if missing or unexpected:
        raise SystemExit(f"--init {path}: missing {missing}, unexpected {unexpected}")


def wrap(model, mode, device, cpu_offload):
    if mode == "single":
        return model
    if mode == "ddp":
        return DDP(model)
    if mode == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        # device_id=cpu explicitly: left unset, FSDP1 looks for an accelerator and refuses.
        return FSDP(model, auto_wrap_policy=ModuleWrapPolicy({GPT2Block}), use_orig_params=True,
                    device_id=device)
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard
    policy = CPUOffloadPolicy(pin_memory=device.type == "cuda") if cpu_offload else OffloadPolicy()
    for block in model.transformer.h:
        fully_shard(block, offload_policy=policy)
    return fully_shard(model, offload_policy=policy)


def clip(model, mode, max_norm):
    if mode == "fsdp1":
        model.clip_grad_norm_(max_norm)
    else:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


def run_rank(args):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    threads = args.threads or max(1, os.cpu_count() // world)
    torch.set_num_threads(threads)
    if args.device == "cuda":
        # Ranks beyond the GPU count share GPUs (Gloo allows it; NCCL refuses two ranks on one).
        gpus = max(1, torch.cuda.device_count())
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % gpus)
        torch.cuda.set_device(device)
        dist.init_process_group("cpu:gloo,cuda:nccl", rank=rank, world_size=world, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(1234)
    plain = GPT2(args)
    if args.init:
        load_init(plain, args.init)
    plain.to(device)
    params = sum(p.numel() for p in plain.parameters())
    # As bench_train counts them (torchtitan's formula; the tied wte once, wpe a lookup).
    flops_per_token = (6.0 * (params - plain.transformer.wpe.weight.numel())
                       + 12.0 * args.n_layer * args.n_embd * args.block_size)
    model = wrap(plain, args.mode, device, args.cpu_offload)
    flags = {"fused": dict(fused=True), "foreach": dict(foreach=True),
             "for-loop": dict(foreach=False), "default": {}}[args.optimizer_impl]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **flags)
    gen = torch.Generator().manual_seed(42 + rank)
    loss_value = 0.0
    start = None
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            dist.barrier()
            start = time.perf_counter()
        tokens = torch.randint(0, args.vocab_size, (args.batch_size, args.block_size + 1), generator=gen)
        x, y = tokens[:, :-1].to(device), tokens[:, 1:].to(device)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        clip(model, args.mode, 1.0)
        opt.step()
        opt.zero_grad()
        loss_value = loss.item()
    dist.barrier()
    seconds = time.perf_counter() - start
    peak = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0], dtype=torch.float64)
    peaks = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(peaks, peak)
    device_peak = torch.tensor([float(torch.cuda.max_memory_allocated(device))
                                if device.type == "cuda" else 0.0], dtype=torch.float64)
    device_peaks = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(device_peaks, device_peak)
    losses = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(losses, torch.tensor([loss_value], dtype=torch.float64))
    ok = all(math.isfinite(l.item()) for l in losses)
    tokens_total = args.batch_size * args.block_size * args.steps * world
    if rank == 0:
        peak_max = max(p.item() for p in peaks)
        device_peak_max = max(p.item() for p in device_peaks)
        name = "pytorch " + args.mode + ("+offload" if args.cpu_offload else "")
        print("%-20s %-6s %5d %9.2fM %11.0f %9.1f %14.0f %14.0f %10.4f %4s" % (
            name, device.type, world, params / 1e6, tokens_total / seconds, seconds / args.steps * 1e3,
            peak_max / 2**20, device_peak_max / 2**20, losses[0].item(), "yes" if ok else "NO"),
            flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps({"impl": "pytorch", "mode": args.mode, "world_size": world,
                                    "cpu_offload": args.cpu_offload, "device": device.type,
                                    "optimizer_impl": args.optimizer_impl,
                                    "flops_per_token": flops_per_token,
                                    "parameters": params,
                                    "peak_device_bytes": [p.item() for p in device_peaks],
                                    "tokens_per_s": tokens_total / seconds,
                                    "step_ms": seconds / args.steps * 1e3,
                                    "peak_rss_bytes": [p.item() for p in peaks],
                                    "final_loss": losses[0].item(), "ok": ok}) + "\n")
    dist.destroy_process_group()
    return 0 if ok else 1


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["single", "ddp", "fsdp1", "fsdp2"], default="ddp")
    p.add_argument("--init", default="", help="initial parameters from bench_train --init-out")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=256)
    p.add_argument("--json", default="")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--cpu-offload", action="store_true", help="fsdp2: CPUOffloadPolicy")
    p.add_argument("--optimizer-impl", choices=["fused", "foreach", "for-loop", "default"],
                   default="fused", help="AdamW implementation (as bench_train's)")
    args = p.parse_args()
    if "RANK" in os.environ:
        code = run_rank(args)
        # os._exit: PyTorch 2.11's Gloo threads sometimes abort the interpreter's teardown
        # ("terminate called without an active exception") after the rank has finished.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(args.nproc))
    procs = [subprocess.Popen([sys.executable] + sys.argv, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
             for r in range(args.nproc)]
    codes = [proc.wait() for proc in procs]
    sys.exit(max(codes))


if __name__ == "__main__":
    main()
