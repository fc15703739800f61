"""The GPT of examples/gpt in Python, to load what `gpt export` writes.

    import sys; sys.path.insert(0, "examples/gpt/python")
    import gpt_export
    model = gpt_export.load("runs/quickstart/export/gpt.safetensors")  # or gpt.pt, gpt.dcp/
    print(gpt_export.generate(model, "And God said", 200))

The module tree and parameter names are the C++ model's (examples/gpt/model.cpp), so
`load_state_dict` takes the exported tensors as they are; the tokenizer is bytes (UTF-8).
Needs only torch (and the `safetensors` package for .safetensors files).
"""

import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_head, self.n_embd = c["n_head"], c["n_embd"]
        self.c_attn = nn.Linear(self.n_embd, 3 * self.n_embd)
        self.c_proj = nn.Linear(self.n_embd, self.n_embd)
        mask = torch.tril(torch.ones(c["block_size"], c["block_size"], dtype=torch.bool))
        self.register_buffer("mask", mask.view(1, 1, *mask.shape), persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.n_head))
        att = att.masked_fill(~self.mask[:, :, :t, :t], float("-inf")).softmax(-1)
        return self.c_proj((att @ v).transpose(1, 2).contiguous().view(b, t, c))


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c["n_embd"], 4 * c["n_embd"])
        self.c_proj = nn.Linear(4 * c["n_embd"], c["n_embd"])

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(c["n_embd"]), CausalSelfAttention(c)
        self.ln_2, self.mlp = nn.LayerNorm(c["n_embd"]), Mlp(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = c
        self.wte = nn.Embedding(c["vocab_size"], c["n_embd"])
        self.wpe = nn.Embedding(c["block_size"], c["n_embd"])
        self.blocks = nn.ModuleList(Block(c) for _ in range(c["n_layer"]))
        self.ln_f = nn.LayerNorm(c["n_embd"])
        self.lm_head = None if c["tie_weights"] else nn.Linear(c["n_embd"], c["vocab_size"], bias=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        return self.lm_head(x) if self.lm_head is not None else x @ self.wte.weight.t()


def load(path):
    """The exported GPT at `path` (.pt, .safetensors or a dcp directory), its config read from
    the .json beside it."""
    path = path.rstrip("/")
    with open(os.path.splitext(path)[0] + ".json") as f:
        model = GPT(json.load(f))
    if os.path.isdir(path):  # torch.distributed.checkpoint: tdist names the model "model.<fqn>"
        import warnings

        import torch.distributed.checkpoint as dcp

        state = model.state_dict()
        with warnings.catch_warnings():  # "no process group: assuming a single process" is right
            warnings.simplefilter("ignore", UserWarning)
            dcp.load({"model": state}, checkpoint_id=path)
    elif path.endswith(".safetensors"):
        from safetensors.torch import load_file
        state = load_file(path)
    else:
        state = torch.load(path, weights_only=True)
    model.load_state_dict(state)
    return model.eval()


@torch.no_grad()
def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=1):
    """Continues `prompt`; top_k=1 (greedy) gives what `gpt generate --top-k 1` gives."""
    ids = list(prompt.encode("utf-8")) or [10]
    out = []
    for _ in range(max_new_tokens):
        window = torch.tensor([ids[-model.config["block_size"]:]])
        logits = model(window)[0, -1] / temperature
        if 0 < top_k < logits.numel():
            logits[logits < torch.topk(logits, top_k).values.min()] = float("-inf")
        nxt = int(logits.argmax()) if top_k == 1 else int(torch.multinomial(logits.softmax(-1), 1))
        ids.append(nxt)
        out.append(nxt)
    return bytes(out).decode("utf-8", errors="replace")
