#!/usr/bin/python3
"""hf_gpt2: reads a safetensors file with a few lines of Python (json and
numpy, not the safetensors package) into a GPT-2 module laid out as Hugging
Face's GPT2LMHeadModel is (transformer.wte, .wpe, .h.<l>.ln_1, .attn.c_attn,
.attn.c_proj, .ln_2, .mlp.c_fc, .mlp.c_proj, .ln_f; Conv1D projections whose
weight is (in, out); the LM head tied to wte) and prints its loss on a batch,
run by tests/unit/test_safetensors.c. The module is written here from GPT-2's
architecture (pre-LN, learned positions, GELU tanh form, layernorm eps 1e-5,
causal attention scaled by 1/sqrt(head_size)) and shares no code with the C
side; load_state_dict(strict=True) proves the names and shapes.

Usage (Debian's /usr/bin/python3):

  hf_gpt2.py loss FILE BATCH HEADS   prints the mean cross-entropy, float32,
                                     as "loss %.9e"
  hf_gpt2.py hub IN OUT DTYPE        rewrites IN as the Hub's original gpt2
                                     files are: no "transformer." prefix, the
                                     attention-mask buffers h.<l>.attn.bias
                                     (and .masked_bias) present, tensors in
                                     sorted order, DTYPE F32 or F16

BATCH is int32 B, int32 T, int32 inputs[B*T], int32 targets[B*T].
Exit status 0 on success; on any failure a one-line reason on stderr and 1.
"""
import json
import math
import struct
import sys

import numpy as np
import torch
from torch import nn


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        raw = data[b:e]
        if t["dtype"] == "F32":
            a = np.frombuffer(raw, dtype="<f4")
        elif t["dtype"] == "F16":
            a = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        elif t["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(raw, dtype=np.uint8)
        out[name] = (t["dtype"], t["shape"], a.reshape(t["shape"]).copy())
    return header.get("__metadata__", {}), out


def write_safetensors(path, tensors, metadata):
    header, at, blobs = {"__metadata__": metadata}, 0, []
    for name in sorted(tensors):
        dtype, arr = tensors[name]
        raw = arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [at, at + len(raw)]}
        at += len(raw)
        blobs.append(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


class Conv1D(nn.Module):
    """GPT-2's projection: y = x @ weight + bias, weight (in, out)."""

    def __init__(self, nin, nout):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nin, nout))
        self.bias = nn.Parameter(torch.empty(nout))

    def forward(self, x):
        return x @ self.weight + self.bias


class Attention(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.c_attn = Conv1D(c, 3 * c)
        self.c_proj = Conv1D(c, c)

    def forward(self, x):
        b, t, c = x.shape
        hs = c // self.heads
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, hs).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).reshape(b, t, c))


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = Conv1D(c, 4 * c)
        self.c_proj = Conv1D(4 * c, c)

    def forward(self, x):
        h = self.c_fc(x)
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h ** 3)))
        return self.c_proj(h)


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c, eps=1e-5)
        self.attn = Attention(c, heads)
        self.ln_2 = nn.LayerNorm(c, eps=1e-5)
        self.mlp = Mlp(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    def __init__(self, layers, c, heads, vocab, context):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(context, c)
        self.h = nn.ModuleList(Block(c, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c, eps=1e-5)


class GPT2LMHead(nn.Module):
    def __init__(self, layers, c, heads, vocab, context):
        super().__init__()
        self.transformer = Transformer(layers, c, heads, vocab, context)

    def forward(self, idx, targets):
        tr = self.transformer
        x = tr.wte(idx) + tr.wpe(torch.arange(idx.shape[1]))
        for block in tr.h:
            x = block(x)
        logits = tr.ln_f(x) @ tr.wte.weight.t()  # tied head
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def loss(path, batch_path, heads):
    _, tensors = read_safetensors(path)
    state = {name: torch.from_numpy(a) for name, (_, _, a) in tensors.items()}
    vocab, c = state["transformer.wte.weight"].shape
    context = state["transformer.wpe.weight"].shape[0]
    layers = 1 + max(int(n.split(".")[2]) for n in state if n.startswith("transformer.h."))
    model = GPT2LMHead(layers, c, heads, vocab, context)
    model.load_state_dict(state, strict=True)
    with open(batch_path, "rb") as f:
        b, t = struct.unpack("<ii", f.read(8))
        ids = np.frombuffer(f.read(8 * b * t), dtype="<i4").astype(np.int64)
    inputs = torch.from_numpy(ids[:b * t].reshape(b, t).copy())
    targets = torch.from_numpy(ids[b * t:].reshape(b, t).copy())
    with torch.no_grad():
        print("loss %.9e" % model(inputs, targets).item())


def hub(src, dst, dtype):
    meta, tensors = read_safetensors(src)
    out = {}
    for name, (_, shape, a) in tensors.items():
        short = name[len("transformer."):] if name.startswith("transformer.") else name
        out[short] = ("F16", a.astype("<f2")) if dtype == "F16" else ("F32", a.astype("<f4"))
        if short.endswith(".attn.c_attn.weight"):
            layer = short[:-len(".attn.c_attn.weight")]
            n = tensors["transformer.wpe.weight"][1][0]
            out[layer + ".attn.bias"] = ("U8", np.tril(np.ones((1, 1, n, n), dtype=np.uint8)))
            out[layer + ".attn.masked_bias"] = ("F32", np.array([-1e4], dtype="<f4"))
    write_safetensors(dst, out, meta)


def main():
    try:
        torch.set_num_threads(1)
        if len(sys.argv) == 5 and sys.argv[1] == "loss":
            loss(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        elif len(sys.argv) == 5 and sys.argv[1] == "hub":
            hub(sys.argv[2], sys.argv[3], sys.argv[4])
        else:
            raise ValueError("usage: hf_gpt2.py loss FILE BATCH HEADS | hub IN OUT F32|F16")
    except Exception as e:  # one line for the C test's message
        print("hf_gpt2.py: %s: %s" % (type(e).__name__, e), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
