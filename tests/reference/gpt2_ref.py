#!/usr/bin/python3
"""gpt2_ref: an independent float64 PyTorch reference for fsdpd's GPT-2 model and
its AdamW, run by tests/unit/test_reference.c and tests/unit/test_adamw.c.

The model is written here from the architecture alone (pre-LN, learned
positions, tied embeddings, GELU tanh form, layernorm eps 1e-5, biases
everywhere, causal attention scaled by 1/sqrt(head_size)); it shares no code with
the C side and uses no HF module, so an error in ours cannot hide in both. It
runs in float64, so its own rounding is far below the fp32 errors we measure.
The optimizer is torch.optim.AdamW itself.

Usage (run with Debian's /usr/bin/python3: torch CPU and numpy):

  gpt2_ref.py model WEIGHTS BATCH OUT --lr X --beta1 X --beta2 X --eps X --wd X
  gpt2_ref.py --adamw-only IN OUT

Files (all little-endian):

  WEIGHTS  the model's weights file (daemon/train/gpt.h): int32 header[256] =
           {20261122, 1, layers, channels, heads, vocab, context, 0...} then
           the parameters as fp32 in unit order:
             wte (V,C), wpe (context,C), lnf.w (C), lnf.b (C), then per block l:
             h.l.ln1.w, h.l.ln1.b, h.l.attn.qkv.w (3C,C), h.l.attn.qkv.b (3C),
             h.l.attn.proj.w (C,C), h.l.attn.proj.b, h.l.ln2.w, h.l.ln2.b,
             h.l.mlp.fc.w (4C,C), h.l.mlp.fc.b (4C), h.l.mlp.proj.w (C,4C),
             h.l.mlp.proj.b (C).
  BATCH    int32 B, int32 T, int32 inputs[B*T], int32 targets[B*T].
  records  (OUT of both modes, IN of --adamw-only) a sequence of named float64
           tensors, each: int32 name_len, name bytes (no NUL), int64 numel,
           float64 data[numel]; the last record is named "end" with numel 0, so
           a truncated file is told from a complete one.

Model mode writes, in this order: "logits" (B*T*V), "loss" (1), "grad.<name>"
for every parameter in layout order, "grad32.h.<l>.attn.qkv.b" (the attention
biases' gradients from a float32 run of the same model: the rounding level to
expect in their exactly-zero key part), then after two torch.optim.AdamW steps on
the same batch (two param groups: decay=1 tensors with weight_decay, the rest
with 0; forward, backward, step; the loss is evaluated after each step):
"loss.after1", "loss.after2", "param2.<name>" for every parameter.

--adamw-only reads IN records: "hparams" = {beta1, beta2, eps, weight_decay},
"lr" = one learning rate per step (S steps), then per tensor in order
"param.<name>", "decay.<name>" (one value, 0 or 1), "grad1.<name>" ..
"grad<S>.<name>". It writes, per step s and tensor: "param<s>.<name>",
"exp_avg<s>.<name>", "exp_avg_sq<s>.<name>".

Exit status 0 on success; on any failure a one-line reason on stderr and 1.
"""
import math
import struct
import sys

import numpy as np
import torch

MAGIC = 20261122
VERSION = 1
HEADER_INTS = 256
LN_EPS = 1e-5


def die(msg):
    sys.stderr.write("gpt2_ref: %s\n" % msg)
    sys.exit(1)


# ----- record files


def write_records(path, records):
    """records: list of (name, array-like); written as float64."""
    with open(path, "wb") as f:
        for name, data in records:
            a = np.ascontiguousarray(np.asarray(data, dtype="<f8").reshape(-1))
            nb = name.encode()
            f.write(struct.pack("<i", len(nb)))
            f.write(nb)
            f.write(struct.pack("<q", a.size))
            f.write(a.tobytes())
        f.write(struct.pack("<i", 3) + b"end" + struct.pack("<q", 0))


def read_records(path):
    """Returns an ordered list of (name, float64 array)."""
    with open(path, "rb") as f:
        buf = f.read()
    out, pos = [], 0
    while True:
        if pos + 4 > len(buf):
            die("%s: truncated (no end record)" % path)
        (n,) = struct.unpack_from("<i", buf, pos)
        pos += 4
        name = buf[pos:pos + n].decode()
        pos += n
        (numel,) = struct.unpack_from("<q", buf, pos)
        pos += 8
        if name == "end":
            return out
        if pos + 8 * numel > len(buf):
            die("%s: record %s truncated" % (path, name))
        out.append((name, np.frombuffer(buf, dtype="<f8", count=numel, offset=pos).copy()))
        pos += 8 * numel


# ----- model


def layout(L, C, V, ctx):
    """[(name, shape, decay)] in the flat order of the weights file."""
    t = [("wte", (V, C), 1), ("wpe", (ctx, C), 1), ("lnf.w", (C,), 0), ("lnf.b", (C,), 0)]
    for l in range(L):
        p = "h.%d." % l
        t += [
            (p + "ln1.w", (C,), 0), (p + "ln1.b", (C,), 0),
            (p + "attn.qkv.w", (3 * C, C), 1), (p + "attn.qkv.b", (3 * C,), 0),
            (p + "attn.proj.w", (C, C), 1), (p + "attn.proj.b", (C,), 0),
            (p + "ln2.w", (C,), 0), (p + "ln2.b", (C,), 0),
            (p + "mlp.fc.w", (4 * C, C), 1), (p + "mlp.fc.b", (4 * C,), 0),
            (p + "mlp.proj.w", (C, 4 * C), 1), (p + "mlp.proj.b", (C,), 0),
        ]
    return t


def read_weights(path):
    raw = open(path, "rb").read()
    if len(raw) < 4 * HEADER_INTS:
        die("%s: shorter than the %d-byte header" % (path, 4 * HEADER_INTS))
    hdr = np.frombuffer(raw, dtype="<i4", count=HEADER_INTS)
    if hdr[0] != MAGIC or hdr[1] != VERSION:
        die("%s: magic %d version %d, want %d version %d" % (path, hdr[0], hdr[1], MAGIC, VERSION))
    L, C, NH, V, ctx = (int(x) for x in hdr[2:7])
    lay = layout(L, C, V, ctx)
    n = sum(int(np.prod(s)) for _, s, _ in lay)
    if len(raw) != 4 * HEADER_INTS + 4 * n:
        die("%s: %d bytes, want %d for L=%d C=%d V=%d context=%d"
            % (path, len(raw), 4 * HEADER_INTS + 4 * n, L, C, V, ctx))
    flat = np.frombuffer(raw, dtype="<f4", count=n, offset=4 * HEADER_INTS).astype(np.float64)
    params, off = {}, 0
    for name, shape, _ in lay:
        k = int(np.prod(shape))
        params[name] = torch.tensor(flat[off:off + k].reshape(shape), dtype=torch.float64,
                                    requires_grad=True)
        off += k
    return (L, C, NH, V, ctx), lay, params


def layernorm(x, w, b):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # biased, as GPT-2's
    return (x - mean) / torch.sqrt(var + LN_EPS) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def linear(x, w, b):
    return x @ w.t() + b


def attention(x, w, b, NH):
    B, T, C = x.shape
    hs = C // NH
    qkv = linear(x, w, b)  # (B,T,3C): q | k | v, heads as contiguous blocks of hs
    q, k, v = qkv.split(C, dim=2)
    q = q.view(B, T, NH, hs).transpose(1, 2)  # (B,NH,T,hs)
    k = k.view(B, T, NH, hs).transpose(1, 2)
    v = v.view(B, T, NH, hs).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    att = att.masked_fill(~mask, float("-inf")).softmax(-1)
    y = att @ v  # (B,NH,T,hs)
    return y.transpose(1, 2).contiguous().view(B, T, C)


def forward(cfg, P, inputs, targets):
    L, C, NH, V, ctx = cfg
    B, T = inputs.shape
    x = P["wte"][inputs] + P["wpe"][:T]
    for l in range(L):
        p = "h.%d." % l
        h = layernorm(x, P[p + "ln1.w"], P[p + "ln1.b"])
        x = x + linear(attention(h, P[p + "attn.qkv.w"], P[p + "attn.qkv.b"], NH),
                       P[p + "attn.proj.w"], P[p + "attn.proj.b"])
        h = layernorm(x, P[p + "ln2.w"], P[p + "ln2.b"])
        h = gelu_tanh(linear(h, P[p + "mlp.fc.w"], P[p + "mlp.fc.b"]))
        x = x + linear(h, P[p + "mlp.proj.w"], P[p + "mlp.proj.b"])
    x = layernorm(x, P["lnf.w"], P["lnf.b"])
    logits = x @ P["wte"].t()  # tied embeddings
    loss = None
    if targets is not None:
        loss = torch.nn.functional.cross_entropy(logits.view(-1, V), targets.view(-1))
    return logits, loss


def read_batch(path, cfg):
    raw = open(path, "rb").read()
    if len(raw) < 8:
        die("%s: no B, T header" % path)
    B, T = struct.unpack_from("<ii", raw, 0)
    if B <= 0 or T <= 0 or T > cfg[4] or len(raw) != 8 + 8 * B * T:
        die("%s: B=%d T=%d and %d bytes do not fit (context %d)" % (path, B, T, len(raw), cfg[4]))
    a = np.frombuffer(raw, dtype="<i4", count=2 * B * T, offset=8).astype(np.int64)
    inputs = torch.tensor(a[:B * T].reshape(B, T))
    targets = torch.tensor(a[B * T:].reshape(B, T))
    if inputs.min() < 0 or inputs.max() >= cfg[3] or targets.min() < 0 or targets.max() >= cfg[3]:
        die("%s: token id outside 0..%d" % (path, cfg[3] - 1))
    return inputs, targets


def make_adamw(lay, P, hp):
    dec = [P[n] for n, _, d in lay if d]
    nodec = [P[n] for n, _, d in lay if not d]
    groups = [{"params": dec, "weight_decay": hp["wd"]}, {"params": nodec, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"])


def fp32_qkv_bias_grads(cfg, lay, P, inputs, targets):
    """The attention biases' gradients from this same model run in float32.
    The key part of those is exactly 0 (softmax ignores a per-query constant),
    so what an fp32 implementation returns there is pure rounding, and how big
    that rounding gets depends on the inputs' conditioning; this float32 twin
    tells the test what rounding level to expect on these exact inputs."""
    P32 = {n: t.detach().float().requires_grad_() for n, t in P.items()}
    _, loss = forward(cfg, P32, inputs, targets)
    loss.backward()
    return [("grad32." + n, P32[n].grad.numpy().astype(np.float64))
            for n, _, _ in lay if n.endswith(".attn.qkv.b")]


def run_model(argv):
    hp, pos = {}, []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            if i + 1 >= len(argv) or a[2:] not in ("lr", "beta1", "beta2", "eps", "wd"):
                die("bad option %s" % a)
            hp[a[2:]] = float(argv[i + 1])
            i += 2
        else:
            pos.append(a)
            i += 1
    if len(pos) != 3 or len(hp) != 5:
        die("usage: gpt2_ref.py model WEIGHTS BATCH OUT --lr X --beta1 X --beta2 X --eps X --wd X")
    cfg, lay, P = read_weights(pos[0])
    inputs, targets = read_batch(pos[1], cfg)
    rec = []
    with torch.no_grad():
        logits, _ = forward(cfg, P, inputs, None)
    rec.append(("logits", logits.numpy()))
    opt = make_adamw(lay, P, hp)
    opt.zero_grad(set_to_none=False)
    _, loss = forward(cfg, P, inputs, targets)
    loss.backward()
    rec.append(("loss", [loss.item()]))
    rec += [("grad." + n, P[n].grad.numpy().copy()) for n, _, _ in lay]
    rec += fp32_qkv_bias_grads(cfg, lay, P, inputs, targets)
    for s in (1, 2):
        if s == 2:
            opt.zero_grad(set_to_none=False)
            _, loss = forward(cfg, P, inputs, targets)
            loss.backward()
        opt.step()
        with torch.no_grad():
            _, after = forward(cfg, P, inputs, targets)
        rec.append(("loss.after%d" % s, [after.item()]))
    rec += [("param2." + n, P[n].detach().numpy()) for n, _, _ in lay]
    write_records(pos[2], rec)


def run_adamw(inp, out):
    recs = read_records(inp)
    R = dict(recs)
    if "hparams" not in R or "lr" not in R:
        die("%s: needs hparams and lr records" % inp)
    beta1, beta2, eps, wd = (float(x) for x in R["hparams"])
    lrs = [float(x) for x in R["lr"]]
    names = [n[len("param."):] for n, _ in recs if n.startswith("param.")]
    P, dec, nodec = {}, [], []
    for n in names:
        P[n] = torch.tensor(R["param." + n], dtype=torch.float64, requires_grad=True)
        (dec if R["decay." + n][0] != 0 else nodec).append(P[n])
    opt = torch.optim.AdamW([{"params": dec, "weight_decay": wd},
                             {"params": nodec, "weight_decay": 0.0}],
                            lr=lrs[0], betas=(beta1, beta2), eps=eps)
    res = []
    for s, lr in enumerate(lrs, 1):
        for g in opt.param_groups:
            g["lr"] = lr
        for n in names:
            key = "grad%d.%s" % (s, n)
            if key not in R:
                die("%s: missing record %s" % (inp, key))
            P[n].grad = torch.tensor(R[key], dtype=torch.float64)
        opt.step()
        for n in names:
            st = opt.state[P[n]]
            res += [("param%d.%s" % (s, n), P[n].detach().numpy().copy()),
                    ("exp_avg%d.%s" % (s, n), st["exp_avg"].numpy().copy()),
                    ("exp_avg_sq%d.%s" % (s, n), st["exp_avg_sq"].numpy().copy())]
    write_records(out, res)


def main():
    torch.set_num_threads(1)  # the inputs are tiny; threads only add start-up time
    a = sys.argv[1:]
    if len(a) == 3 and a[0] == "--adamw-only":
        run_adamw(a[1], a[2])
    elif len(a) >= 1 and a[0] == "model":
        run_model(a[1:])
    else:
        die("usage: gpt2_ref.py model WEIGHTS BATCH OUT --lr X ... | gpt2_ref.py --adamw-only IN OUT")


if __name__ == "__main__":
    main()
