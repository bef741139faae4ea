#!/usr/bin/env python3
"""The floor of each node kind of bench/step's breakdown, measured on this GPU in this run.

  python3 bench/step_floor.py [--layers 6 --embd 256 --heads 4 --neurons 8192 --vocab 256 --batch 8 --time 512]
                              [--presets f32,bf16,w8a8,bitnet] [--reps 50] [--warmup 3] [--shapes]

Prints one JSON object: {"presets": {PRESET: {KIND: {count, bytes, extra_bytes, gemms, floor_ms, how}}},
"gemms": {KEY: {batch, m, k, n, flops, uses, ms: {candidate: ms}, errors, best, best_ms}}, "copy_GBps", ...}.
KIND is a node kind as dg_model_profile names it (the "what" of bench/step's breakdown), for the tape
runtime/train/bdh_tape.c records on sm_90 (the H200): bf16 activations take the fused decoder grad_input +
gate bwd node, a low-bit recipe its dequantize nodes, bf16 gradient GEMMs and the gate fused with the
decoder input's quantizer (gate_quant).

A node's floor is the larger of
  - its GEMMs: for each, the fastest cuBLAS call of the same shape that ran here: bf16 (torch.matmul / bmm,
    B stored (N,K) or (K,N)), fp8 e4m3 (torch._scaled_mm, A row-major, B column-major, f32 scalar scales, bf16
    out, with and without fast accumulation) and int8 (torch._int_mm, int32 out); a batch of heads as bmm
    (bf16) or a loop of calls (fp8, int8); the attention's five GEMMs as bench/attention_floor.py times them
    (bf16 bmm, the causal scores as the full square);
  - the HBM time of its bytes: each input read once and each output written once, in the formats the tape
    gives them (activations f32 or bf16, codes one byte with a float scale a token, the execution weights in
    the recipe's format with their scales, the (B,1,T,D) and (B,H,T,D) gradients f32), at the copy bandwidth
    measured here (a 1 GiB device-to-device copy, bytes read + written). `bytes` counts them;
    `extra_bytes` is the part not among the node's inputs and outputs on the tape (the attention backward's
    read of the dxs it adds to, and its RoPE table).
A kind's floor_ms is the sum over its nodes; `how` says, for each group of equal nodes, which GEMM candidate
won and whether the GEMMs or the bytes set the floor.

Timing: CUDA events around each call, the median of --reps after --warmup calls, random (not zero) inputs,
the GPU kept busy (torch.cuda._sleep) while a call is queued so that launch latency is not timed.
--shapes: the nodes, GEMM shapes and bytes it would measure, without torch or a GPU.
Failures: {"error": why} and exit status 1 (no torch, no GPU); a GEMM candidate that does not run is listed
under its GEMM's "errors".
"""
import argparse
import json
import sys

PRESETS = {
    # act: bytes of an activation; lowbit: integer codes (a scale a token) for the projections' inputs and
    # weights; weight: the execution copies' format; wscale: the weights' scales (None: no codes)
    "f32": dict(act=4, lowbit=False, weight="f32", wscale=None),
    "bf16": dict(act=2, lowbit=False, weight="bf16", wscale=None),
    "w8a8": dict(act=2, lowbit=True, weight="int8", wscale="channel"),
    "bitnet": dict(act=2, lowbit=True, weight="ternary", wscale="tensor"),
}
WEIGHT_BITS = {"f32": 32, "bf16": 16, "int8": 8, "ternary": 2}
SLEEP_CYCLES = 200000  # ~0.1 ms of GPU time ahead of each timed call


class Gemms:
    """The GEMM shapes the nodes use, keyed "BxMxKxN" (dense) or "attention NAME" (bench/attention_floor.py's)."""

    def __init__(self):
        self.shapes = {}

    def add(self, use, batch, m, k, n, attn=None):
        key = "attention " + attn if attn else "%dx%dx%dx%d" % (batch, m, k, n)
        g = self.shapes.setdefault(key, dict(batch=batch, m=m, k=k, n=n, attn=attn, flops=2.0 * batch * m * k * n,
                                             uses=[]))
        if use not in g["uses"]:
            g["uses"].append(use)
        return key


def describe(g):
    mm = "(%dx%d)@(%dx%d)" % (g["m"], g["k"], g["k"], g["n"])
    return mm if g["batch"] == 1 else "%dx%s" % (g["batch"], mm)


def nodes(p, L, B, T, D, H, N, V, G):
    """The tape's nodes for preset p (runtime/train/bdh_tape.c, on sm_90), in order: dicts of kind, label,
    gemms (keys of G), bytes (what its inputs and outputs on the tape hold), extra (bytes it also moves), moves
    (what the bytes are)."""
    a = p["act"]
    low = p["lowbit"]
    bf16g = low                   # sm_90: a low-bit recipe's gradient GEMMs read bf16 copies (bf16_grads)
    dgate = a == 2                # sm_90, bf16 activations: decoder grad_input + gate bwd as one node
    dfwd = dgate and not low      # the bf16 recipe's decoder forward: a bf16 copy [H*N, D], f32 yd out
    X, A, S, SC, W = B * T * D, B * H * T * D, B * H * T * N, B * H * T * T, H * N * D
    BT, BHT = B * T, B * H * T
    f4 = 4

    def wexec(k):  # execution copy k (0 encoder, 1 encoder_v, 2 decoder) with its scales
        if not low:
            return a * W
        ns = (H * N if k < 2 else D) if p["wscale"] == "channel" else 1
        return W * WEIGHT_BITS[p["weight"]] // 8 + f4 * ns

    xq, aq, xyq = X + f4 * BT, A + f4 * BHT, S + f4 * BT  # codes, a byte each, and their scales
    g_enc = G.add("encoder fwd, decoder grad_input", 1, BT, D, H * N)
    g_encv = G.add("encoder_v fwd", H, BT, D, N)
    g_dec = G.add("decoder fwd, encoder grad_input", 1, BT, H * N, D)
    g_encv_in = G.add("encoder_v grad_input", H, BT, N, D)
    g_w = G.add("encoder grad_weight (a layer)", 1, D, BT, H * N)
    g_wv = G.add("encoder_v grad_weight (a layer)", H, D, BT, N)
    g_dw = G.add("decoder grad_weight", 1, D, L * BT, H * N)
    g_lm = G.add("lm_head logits", 1, BT, D, V)
    g_lm_dx = G.add("lm_head grad_input", 1, BT, V, D)
    g_lm_dw = G.add("lm_head grad_weight", 1, D, BT, V)
    att_f = [G.add("attention", B * H, T, N, T, "scores"), G.add("attention", B * H, T, T, D, "out")]
    att_b = [G.add("attention bwd", B * H, T, D, T, "grad_scores"), G.add("attention bwd", B * H, T, T, D, "grad_v"),
             G.add("attention bwd", B * H, T, T, N, "grad_xs")]
    act = "f32" if a == 4 else "bf16"
    out = []

    def add(kind, label, nbytes, moves, gemms=(), extra=0):
        out.append(dict(kind=kind, label=label, bytes=nbytes + extra, extra=extra, moves=moves, gemms=list(gemms)))

    add("embed", "embed", f4 * V * D + f4 * BT + a * X, "table f32, tokens in; emb %s out" % act)
    add("layernorm", "x0 = LN(emb)", 2 * a * X + f4 * BT, "emb in; x0, rstd out")
    for _ in range(L):
        if low:
            add("quantize_act", "x", a * X + xq, "x in; codes, scales out")
        add("projection", "encoder", (xq if low else a * X) + wexec(0) + a * S,
            "x%s, encoder in; xs out" % (" codes" if low else ""), [g_enc])
        add("attention", "attention", a * S + a * X + f4 * T * N + a * A + a * SC,
            "xs, x, RoPE table in; att, scores out", att_f)
        add("layernorm", "a = LN(att)", 2 * a * A + f4 * BHT, "att in; a, rstd out")
        if low:
            add("quantize_act", "a", a * A + aq, "a in; codes, scales out")
        add("projection", "encoder_v", (aq if low else a * A) + wexec(1) + a * S,
            "a%s, encoder_v in; ys out" % (" codes" if low else ""), [g_encv])
        if low:  # sm_90's low-bit recipes (a scale a token for xy): the gate and its quantizer one node
            add("gate_quant", "gate_quant", 2 * a * S + xyq, "xs, ys in; xy codes, scales out")
        else:
            add("gate", "gate", 3 * a * S, "xs, ys in; xy out")
        yd = f4 if dfwd else a
        add("decoder", "decoder", (xyq if low else a * S) + (2 * W if dfwd else wexec(2)) + yd * X,
            "xy%s, decoder in; yd out" % (" codes" if low else ""), [g_dec])
        add("layernorm", "y = LN(yd)", yd * X + a * X + f4 * BT, "yd in; y, rstd out")
        add("resid_ln", "resid_ln", 3 * a * X + f4 * BT, "x, y in; x', rstd out")
    add("lm_head+ce", "lm_head+ce", a * X + f4 * D * V + f4 * BT + f4, "x, lm_head f32, targets in; loss out",
        [g_lm])
    add("lm_head+ce bwd", "lm_head+ce bwd", a * X + 2 * f4 * D * V + f4 * BT + f4 * X + f4,
        "x, lm_head, targets in; dx f32, d lm_head, loss out", [g_lm, g_lm_dx, g_lm_dw])
    for li in range(L):
        adds = f4 * W if li else 0  # the backward's first layer writes the weight gradients, the others add
        add("layernorm bwd", "d(x + y)", 2 * f4 * X + a * X + f4 * BT, "dx f32, x', rstd in; ds f32 out")
        add("layernorm bwd", "d yd", 2 * f4 * X + a * X + f4 * BT, "ds, y, rstd in; dyd f32 out")
        if dgate:
            add("decoder grad_input + gate bwd", "decoder grad_input + gate bwd", f4 * X + 2 * W + 4 * a * S,
                "dyd f32, decoder bf16, xs, ys in; dxs, dys out", [g_enc])
        else:
            add("decoder grad_input", "decoder grad_input", f4 * X + wexec(2) + a * S,
                "dyd f32, decoder in; dxy out", [g_enc])
            add("gate bwd", "gate bwd", 5 * a * S, "dxy, xs, ys in; dxs, dys out")
        add("projection grad_input", "encoder_v", a * S + (2 * W if bf16g else wexec(1)) + f4 * A,
            "dys, encoder_v in; da f32 out", [g_encv_in])
        if bf16g:
            add("dequantize", "a codes", aq + 2 * A, "a codes, scales in; bf16 out")
        add("projection grad_weight", "encoder_v", a * S + (2 * A if bf16g else aq if low else a * A) + f4 * W,
            "dys, a in; d encoder_v f32 (+=) out", [g_wv], extra=adds)
        add("layernorm bwd", "d att", 2 * f4 * A + a * A + f4 * BHT, "da, a, rstd in; datt f32 out")
        add("attention bwd", "attention bwd", f4 * A + a * SC + a * X + a * S + a * S + f4 * X,
            "datt f32, scores, x, xs in; dxs (+=: read too), dv f32 out; RoPE table", att_b, extra=a * S + f4 * T * N)
        add("projection grad_input", "encoder", a * S + (2 * W if bf16g else wexec(0)) + f4 * X,
            "dxs, encoder in; dxe f32 out", [g_dec])
        if bf16g:
            add("dequantize", "x codes", xq + 2 * X, "x codes, scales in; bf16 out")
        add("projection grad_weight", "encoder", a * S + (2 * X if bf16g else xq if low else a * X) + f4 * W,
            "dxs, x in; d encoder f32 (+=) out", [g_w], extra=adds)
        add("add3", "add3", 4 * f4 * X, "ds, dv, dxe in; dx out (f32)")
    add("layernorm bwd", "d emb", 2 * f4 * X + a * X + f4 * BT, "dx, x0, rstd in; demb f32 out")
    add("embed bwd", "embed bwd", f4 * X + f4 * BT + f4 * V * D, "demb, tokens in; d table f32 out")
    add("to master layout", "encoder_v", 2 * f4 * W, "d encoder_v f32 in and out")
    add("to master layout", "encoder", 2 * f4 * W, "d encoder f32 in and out")
    add("decoder grad_weight", "decoder grad_weight", L * f4 * X + (L * xyq if low else L * a * S) + f4 * W,
        "dyd f32, xy%s (all layers) in; d decoder f32 out" % (" codes" if low else ""), [g_dw])
    add("to master layout", "decoder", 2 * f4 * W, "d decoder f32 in and out")
    return out


def mb(n):
    return "%.4g MB" % (n / 1e6)


def group(node_list):
    """{kind: [groups]}, a group being equal nodes (same kind and label) with their count; kinds in tape order."""
    kinds = {}
    for nd in node_list:
        gs = kinds.setdefault(nd["kind"], [])
        for g in gs:
            if g["label"] == nd["label"]:
                g["count"] += 1
                break
        else:
            gs.append(dict(nd, count=1))
    return kinds


def gemm_text(G, keys, best):
    parts = []
    for k in keys:
        g = G.shapes[k]
        name = ("%s %s" % (k, describe(g))) if g["attn"] else describe(g)
        if best is None:
            parts.append("%s (%s)" % (name, "bf16" if g["attn"] else "bf16|fp8|int8"))
        elif best.get(k):
            parts.append("%s %s %.3f ms" % (best[k][0], name, best[k][1]))
        else:
            parts.append("%s: no cuBLAS call ran" % name)
    return " + ".join(parts)


def kind_entry(G, groups, bw, best):
    """A kind's JSON: count, bytes, extra_bytes, gemms, and with measurements (bw GB/s, best {key: (label, ms)})
    its floor_ms and how."""
    e = dict(count=sum(g["count"] for g in groups), bytes=sum(g["count"] * g["bytes"] for g in groups),
             extra_bytes=sum(g["count"] * g["extra"] for g in groups),
             gemms=["%d x %s" % (g["count"], k) for g in groups for k in g["gemms"]])
    hows, total = [], 0.0
    for g in groups:
        head = "%d x %s: " % (g["count"], g["label"])
        if bw is None:
            txt = ("GEMM %s; " % gemm_text(G, g["gemms"], None)) if g["gemms"] else ""
            hows.append(head + txt + "HBM %s (%s)" % (mb(g["bytes"]), g["moves"]))
            continue
        hbm = g["bytes"] / (bw * 1e6)
        gem = sum(best[k][1] for k in g["gemms"] if best.get(k))
        total += g["count"] * max(hbm, gem)
        hb = "HBM %s at %.0f GB/s %.3f ms (%s)" % (mb(g["bytes"]), bw, hbm, g["moves"])
        if not g["gemms"]:
            hows.append(head + hb)
        elif gem >= hbm:
            hows.append(head + "GEMM %s, more than %s" % (gemm_text(G, g["gemms"], best), hb))
        else:
            hows.append(head + "%s, more than GEMM %s" % (hb, gemm_text(G, g["gemms"], best)))
    if bw is not None:
        e["floor_ms"] = total
    e["how"] = "; ".join(hows)
    return e


# ---- measurement (torch, a CUDA GPU) -------------------------------------------------------------------


def fail(why):
    print(json.dumps({"error": why}))
    sys.exit(1)


class Timer:
    def __init__(self, torch, reps, warmup):
        self.torch, self.reps, self.warmup = torch, reps, warmup
        self.e0 = torch.cuda.Event(enable_timing=True)
        self.e1 = torch.cuda.Event(enable_timing=True)
        self.sleep = getattr(torch.cuda, "_sleep", None)

    def __call__(self, fn):
        """The median ms of fn (CUDA events), after warm-up calls."""
        for _ in range(self.warmup):
            fn()
        self.torch.cuda.synchronize()
        ts = []
        for _ in range(self.reps):
            if self.sleep:
                self.sleep(SLEEP_CYCLES)
            self.e0.record()
            fn()
            self.e1.record()
            self.e1.synchronize()
            ts.append(self.e0.elapsed_time(self.e1))
        ts.sort()
        return ts[len(ts) // 2]


def short(e):
    lines = str(e).strip().splitlines()
    return "%s: %s" % (type(e).__name__, lines[0][:200] if lines else "")


def dense_families(torch, gen, g):
    """The cuBLAS candidates of a dense GEMM: (family, builder) where builder() allocates random operands and
    returns {candidate: fn}. A batch of heads: bmm (bf16) or a loop (fp8, int8, which take 2-D operands)."""
    bt, m, k, n = g["batch"], g["m"], g["k"], g["n"]
    dev = "cuda"

    def shape(*s):
        return s if bt > 1 else s[1:]

    def bf16():
        a = torch.randn(shape(bt, m, k), device=dev, generator=gen, dtype=torch.bfloat16)
        b_nk = torch.randn(shape(bt, n, k), device=dev, generator=gen, dtype=torch.bfloat16)
        b_kn = b_nk.mT.contiguous()
        return {"bf16": lambda: torch.matmul(a, b_nk.mT), "bf16 B(k,n)": lambda: torch.matmul(a, b_kn)}

    def fp8():
        f8 = torch.float8_e4m3fn
        a = torch.randn(bt, m, k, device=dev, generator=gen).to(f8)
        b = torch.randn(bt, n, k, device=dev, generator=gen).to(f8)  # each b[i].t(): column-major (k, n)
        one = torch.ones((), device=dev, dtype=torch.float32)

        def run(fast):
            def fn():
                for i in range(bt):
                    r = torch._scaled_mm(a[i], b[i].t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                         use_fast_accum=fast)
                return r[0] if isinstance(r, tuple) else r  # older torch: (out, amax)
            return fn
        return {"fp8": run(False), "fp8 fast-accum": run(True)}

    def int8():
        a = torch.randint(-127, 128, (bt, m, k), device=dev, generator=gen, dtype=torch.int8)
        b_nk = torch.randint(-127, 128, (bt, n, k), device=dev, generator=gen, dtype=torch.int8)
        b_kn = b_nk.mT.contiguous()

        def run(bs):
            def fn():
                for i in range(bt):
                    r = torch._int_mm(a[i], bs(i))
                return r
            return fn
        return {"int8": run(lambda i: b_nk[i].t()), "int8 B(k,n)": run(lambda i: b_kn[i])}

    return [("bf16", bf16), ("fp8", fp8), ("int8", int8)]


def attention_families(torch, gen, G, keys):
    """bench/attention_floor.py's five GEMMs (bf16 bmm over B*H): {key: fn}, one set of random operands."""
    g = G.shapes[keys[0]]
    BH, T = g["batch"], g["m"]
    N = next(G.shapes[k]["k"] for k in keys if G.shapes[k]["attn"] == "scores")
    D = next(G.shapes[k]["n"] for k in keys if G.shapes[k]["attn"] == "out")
    r = lambda *s: torch.randn(*s, device="cuda", generator=gen, dtype=torch.bfloat16)
    qr, v, do, s = r(BH, T, N), r(BH, T, D), r(BH, T, D), r(BH, T, T)
    fns = dict(scores=lambda: torch.bmm(qr, qr.mT), out=lambda: torch.bmm(s, v),
               grad_scores=lambda: torch.bmm(do, v.mT), grad_v=lambda: torch.bmm(s.mT, do),
               grad_xs=lambda: torch.bmm(s, qr))
    return {k: fns[G.shapes[k]["attn"]] for k in keys}


def try_time(timer, torch, fn, g, label):
    try:
        fn()
        torch.cuda.synchronize()
        g["ms"][label] = timer(fn)
    except Exception as e:  # a candidate cuBLAS or this torch does not take: recorded, not fatal
        g["errors"][label] = short(e)
        torch.cuda.synchronize()


def measure(G, reps, warmup):
    """Times every GEMM of G (its candidates) and the copy bandwidth; returns (GB/s, {key: (label, ms)}, torch)."""
    try:
        import torch
    except Exception as e:
        fail("no torch (%s): python3 -m pip install torch" % short(e))
    if not torch.cuda.is_available():
        fail("torch %s sees no CUDA device" % torch.__version__)
    gen = torch.Generator(device="cuda").manual_seed(0)
    timer = Timer(torch, reps, warmup)
    for g in G.shapes.values():
        g["ms"], g["errors"] = {}, {}
    attn = [k for k, g in G.shapes.items() if g["attn"]]
    if attn:
        try:
            fns = attention_families(torch, gen, G, attn)
            for k in attn:
                try_time(timer, torch, fns[k], G.shapes[k], "bf16")
            del fns
        except Exception as e:
            for k in attn:
                G.shapes[k]["errors"]["bf16"] = short(e)
    for k, g in G.shapes.items():
        if g["attn"]:
            continue
        for fam, build in dense_families(torch, gen, g):
            try:
                fns = build()
            except Exception as e:  # no float8 dtype, out of memory, ...
                g["errors"][fam] = short(e)
                continue
            for label, fn in fns.items():
                try_time(timer, torch, fn, g, label)
            del fns
            torch.cuda.empty_cache()
    big = torch.empty(1 << 29, dtype=torch.int16, device="cuda")
    dst = torch.empty_like(big)
    bw = 2 * big.numel() * 2 / timer(lambda: dst.copy_(big)) / 1e6  # GB/s, bytes read + written
    del big, dst
    best = {}
    for k, g in G.shapes.items():
        if g["ms"]:
            label = min(g["ms"], key=g["ms"].get)
            g["best"], g["best_ms"] = label, g["ms"][label]
            g["tflops"] = g["flops"] / g["best_ms"] / 1e9
            best[k] = (label, g["best_ms"])
    return bw, best, torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for k, v in dict(layers=6, embd=256, heads=4, neurons=8192, vocab=256, batch=8, time=512, reps=50,
                     warmup=3).items():
        ap.add_argument("--" + k, type=int, default=v)
    ap.add_argument("--presets", default=",".join(PRESETS), help="comma-separated: " + ", ".join(PRESETS))
    ap.add_argument("--shapes", action="store_true", help="print the shapes and bytes; measure nothing")
    a = ap.parse_args()
    for k in ("layers", "embd", "heads", "neurons", "vocab", "batch", "time", "reps"):
        if getattr(a, k) < 1:
            ap.error("--%s must be at least 1" % k)
    if a.warmup < 0:
        ap.error("--warmup must be at least 0")
    names = [p for p in a.presets.split(",") if p]
    for p in names:
        if p not in PRESETS:
            ap.error("--presets: unknown preset %s; known: %s" % (p, ", ".join(PRESETS)))
    G = Gemms()
    per = {p: group(nodes(PRESETS[p], a.layers, a.batch, a.time, a.embd, a.heads, a.neurons, a.vocab, G))
           for p in names}
    doc = dict(B=a.batch, T=a.time, layers=a.layers, embd=a.embd, heads=a.heads, neurons=a.neurons, vocab=a.vocab)
    bw, best = None, None
    if not a.shapes:
        bw, best, torch = measure(G, a.reps, a.warmup)
        doc.update(device=torch.cuda.get_device_name(), torch=torch.__version__, reps=a.reps, copy_GBps=bw)
    doc["presets"] = {p: {kind: kind_entry(G, gs, bw, best) for kind, gs in per[p].items()} for p in names}
    doc["gemms"] = {k: {f: v for f, v in g.items() if f != "attn" and v is not None} for k, g in G.shapes.items()}
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
