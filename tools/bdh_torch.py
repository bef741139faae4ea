#!/usr/bin/env python3
"""dragon's PyTorch version of the BDH reference math (pathwaycom/bdh bdh.py).

The model dragon is checked against: the same parameters, names and shapes
(embed.weight [V, D], encoder [H, D, N], encoder_v [H, D, N], decoder
[H*N, D], lm_head [D, V]) and the same forward as bdh.py's training pass:

    x = LN(embed[idx])                                   (B, 1, T, D)
    per layer (one set of weights for every layer):
        xs  = relu(x @ encoder)                          (B, H, T, N)
        qr  = RoPE(xs)       theta = 2^16, interleaved pairs
        att = tril(qr @ qr^T, -1) @ x                    (B, H, T, D)
        ys  = relu(LN(att) @ encoder_v)
        xy  = dropout(xs * ys)
        y   = LN(xy (B, 1, T, H*N) @ decoder)
        x   = LN(x + y)
    loss = cross_entropy(x @ lm_head, targets)

`dump --quant w8a8|bitnet` runs the same math fake-quantized with dragon's
quantizers (straight-through gradients), what a low-bit recipe is held to.

`dump` writes a debug state as safetensors — the weights, a batch, the loss
and every gradient ("grad.<name>") — that dragon's tests load and hold their
own model against:

    python3 tools/bdh_torch.py dump --out state.safetensors [--size tiny|25m]
        [--seed 1] [--batch 2] [--time 16] [--scale 25]

`bench` times forward + backward of the 25M model in bf16 autocast, eager
and torch.compile, as JSON rows (bench/step.c runs it beside dragon's).

`train` trains this model as `dragon train` trains dragon's — its corpus
split and batches, its initial weights, its schedule, its log (bdh_train.py
says what is reproduced and what is not):

    python3 tools/bdh_torch.py train --out DIR [--steps 1500] [--seed S]
        [--impl compile|eager] [--device cuda|cpu] ... (train --help)

--scale multiplies the reference init (normal(0, 0.02)) so that a tiny
model's activations are not all at the ReLU kinks; the dump says what it
used in its metadata.
"""
import argparse
import math
import sys

import torch
import torch.nn.functional as F
from torch import nn

SIZES = {
    "tiny": dict(layers=2, embd=32, heads=2, neurons=64, vocab=256),
    "small": dict(layers=2, embd=64, heads=2, neurons=256, vocab=256),
    "25m": dict(layers=6, embd=256, heads=4, neurons=8192, vocab=256),
}


def rope_freqs(n, theta=2.0**16):
    i = torch.arange(0, n, 1, dtype=torch.float32)
    return 1.0 / (theta ** ((i / 2).floor() * 2 / n)) / (2 * math.pi)


def rope(phases, v):
    v_rot = torch.stack((-v[..., 1::2], v[..., ::2]), dim=-1).view(*v.size())
    phases = (phases % 1) * (2 * math.pi)
    return v * torch.cos(phases) + v_rot * torch.sin(phases)


# ---- fake quantization (straight-through), dragon's quantizers -------------
# A recipe's copies as dragon makes them (runtime/ref/ref_ops.h): int8 weights a scale
# an output channel (max|w|/127, codes rint(w/s)), ternary weights a scale a
# tensor (s = mean|w|, code 0 where |w| < s, else sign(w)); activations int8
# (or uint8pos for the decoder's post-ReLU input) a scale a token (max|x| /
# qmax, codes rint(x/s) clamped). Forward: the dequantized values; backward:
# the gradient passes straight through to the float value.


def ste(x, q):
    return x + (q - x).detach()


def q_act(x, dims, qmax, unsigned=False):
    s = x.detach().abs().amax(dim=dims, keepdim=True) / qmax
    s = torch.where(s == 0, torch.ones_like(s), s)
    c = torch.round(x.detach() / s).clamp(0 if unsigned else -qmax, qmax)
    return ste(x, c * s)


def q_weight(w, fmt, dim):
    if fmt == "int8":  # a scale an output channel: reduce over the input dim
        s = w.detach().abs().amax(dim=dim, keepdim=True) / 127
        s = torch.where(s == 0, torch.ones_like(s), s)
        return ste(w, torch.round(w.detach() / s).clamp(-127, 127) * s)
    s = w.detach().abs().mean()  # ternary, a scale a tensor
    c = torch.where(w.detach().abs() < s, torch.zeros_like(w), torch.sign(w.detach()))
    return ste(w, c * s)


RECIPES = {"w8a8": "int8", "bitnet": "ternary"}


class BDH(nn.Module):
    def __init__(self, layers, embd, heads, neurons, vocab, dropout=0.1, thr_x=0.0, thr_y=0.0,
                 quant=None):
        super().__init__()
        self.quant = RECIPES.get(quant) if quant else None
        self.layers, self.D, self.H, self.N, self.V = layers, embd, heads, neurons, vocab
        self.thr_x, self.thr_y = thr_x, thr_y
        self.embed = nn.Embedding(vocab, embd)
        self.encoder = nn.Parameter(torch.zeros(heads, embd, neurons).normal_(std=0.02))
        self.encoder_v = nn.Parameter(torch.zeros(heads, embd, neurons).normal_(std=0.02))
        self.decoder = nn.Parameter(torch.zeros(heads * neurons, embd).normal_(std=0.02))
        self.lm_head = nn.Parameter(torch.zeros(embd, vocab).normal_(std=0.02))
        nn.init.normal_(self.embed.weight, mean=0.0, std=0.02)
        self.drop = nn.Dropout(dropout)
        self.register_buffer("freqs", rope_freqs(neurons).view(1, 1, 1, neurons), persistent=False)

    def ln(self, x):
        return F.layer_norm(x, (x.size(-1),), eps=1e-5)

    def forward(self, idx, targets=None):
        """The mean cross-entropy of targets; without targets, the logits
        (B, T, V)."""
        B, T = idx.size()
        H, N, D = self.H, self.N, self.D
        x = self.ln(self.embed(idx).unsqueeze(1))
        phases = torch.arange(0, T, dtype=torch.float32, device=idx.device).view(1, 1, -1, 1) * self.freqs
        enc, encv, dec = self.encoder, self.encoder_v, self.decoder
        qa = (lambda v, d, q, u=False: q_act(v, d, q, u)) if self.quant else (lambda v, d, q, u=False: v)
        if self.quant:  # encoder [H, D, N]: a channel (h, n) over D; decoder [H·N, D]: d over H·N
            enc, encv = q_weight(enc, self.quant, 1), q_weight(encv, self.quant, 1)
            dec = q_weight(dec, self.quant, 0)
        for _ in range(self.layers):
            xs = F.relu(qa(x, (-1,), 127) @ enc - self.thr_x)
            qr = rope(phases, xs)
            att = (qr @ qr.mT).tril(diagonal=-1) @ x
            ys = F.relu(qa(self.ln(att), (-1,), 127) @ encv - self.thr_y)
            xy = self.drop(xs * ys)
            xyr = qa(xy.transpose(1, 2).reshape(B, 1, T, N * H), (-1,), 255, True)
            y = self.ln(xyr @ dec)
            x = self.ln(x + y)
        logits = x.view(B, T, D) @ self.lm_head
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def dump(args):
    from safetensors.torch import save_file

    torch.manual_seed(args.seed)
    cfg = SIZES[args.size]
    m = BDH(**cfg, dropout=0.0, quant=args.quant)
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(args.scale)
    g = torch.Generator().manual_seed(args.seed + 1)
    idx = torch.randint(0, cfg["vocab"], (args.batch, args.time), generator=g, dtype=torch.int64)
    tgt = torch.randint(0, cfg["vocab"], (args.batch, args.time), generator=g, dtype=torch.int64)
    m.eval()
    # --double: the same f32 weights, the step computed in float64 (the
    # exact math to ~1e-15), its gradients rounded to f32 once
    w32 = {name: p.detach().contiguous() for name, p in m.state_dict().items()}
    if args.double:
        m = m.double()
    loss = m(idx, tgt)
    loss.backward()
    out = dict(w32)
    for name, p in m.named_parameters():
        out["grad." + name] = p.grad.detach().float().contiguous()
    out["idx"] = idx.to(torch.int32)
    out["targets"] = tgt.to(torch.int32)
    out["loss"] = loss.detach().to(torch.float64).reshape(1)
    meta = {k: str(v) for k, v in cfg.items()}
    meta.update(seed=str(args.seed), scale=str(args.scale), torch=torch.__version__,
                quant=args.quant or "none", precision="f64" if args.double else "f32")
    save_file(out, args.out, metadata=meta)
    print(f"bdh_torch: loss {loss.item():.9g}, wrote {args.out}", file=sys.stderr)


def bench(args):
    """forward + backward (no optimizer) of the model at B x T on the GPU in
    bf16 autocast, eager and torch.compile: one JSON row each on stdout
    {impl, preset, B, T, fwd_bwd_ms, peak_bytes} (the median of --reps
    timed steps after --warmup; peak: torch.cuda.max_memory_allocated over
    the timed steps, the weights and their gradients included)."""
    import json

    dev = torch.device("cuda")
    torch.manual_seed(args.seed)
    cfg = SIZES[args.size]
    g = torch.Generator().manual_seed(args.seed + 1)
    idx = torch.randint(0, cfg["vocab"], (args.batch, args.time), generator=g).to(dev)
    tgt = torch.randint(0, cfg["vocab"], (args.batch, args.time), generator=g).to(dev)
    for impl in args.impl.split(","):
        m = BDH(**cfg, dropout=0.1).to(dev)
        m.train()
        fn = torch.compile(m) if impl == "torch.compile" else m

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = fn(idx, tgt)
            loss.backward()
            for p in m.parameters():
                p.grad = None

        for _ in range(args.warmup):
            step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(args.reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        times.sort()
        row = dict(impl="pytorch" if impl == "eager" else "torch.compile", preset="bf16",
                   B=args.batch, T=args.time, fwd_bwd_ms=times[len(times) // 2],
                   peak_bytes=torch.cuda.max_memory_allocated())
        print(json.dumps(row), flush=True)
        del m, fn
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump", help="write weights, a batch, the loss and every gradient")
    d.add_argument("--out", required=True)
    d.add_argument("--size", choices=sorted(SIZES), default="tiny")
    d.add_argument("--seed", type=int, default=1)
    d.add_argument("--batch", type=int, default=2)
    d.add_argument("--time", type=int, default=16)
    d.add_argument("--scale", type=float, default=25.0)
    d.add_argument("--double", action="store_true",
                   help="compute the step in float64 (gradients written as f32)")
    d.add_argument("--quant", choices=sorted(RECIPES), default=None,
                   help="fake-quantize as dragon's recipe (straight-through gradients)")
    b = sub.add_parser("bench", help="time forward + backward in bf16: eager and torch.compile")
    b.add_argument("--size", choices=sorted(SIZES), default="25m")
    b.add_argument("--seed", type=int, default=1)
    b.add_argument("--batch", type=int, default=8)
    b.add_argument("--time", type=int, default=512)
    b.add_argument("--warmup", type=int, default=3)
    b.add_argument("--reps", type=int, default=10)
    b.add_argument("--impl", default="eager,torch.compile")
    import bdh_train

    bdh_train.add_parser(sub, SIZES)
    args = ap.parse_args()
    if args.cmd == "train":
        bdh_train.train(args, BDH, SIZES)
    elif args.cmd == "dump":
        dump(args)
    elif args.cmd == "bench":
        bench(args)


if __name__ == "__main__":
    main()
