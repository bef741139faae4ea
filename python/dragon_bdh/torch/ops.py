"""dragon's ops on torch tensors.

Raw ops (no autograd; integer results): quantize_act, quantize_weight,
dequantize, pack, unpack. Differentiable ops (torch.autograd.Function,
straight-through gradients w.r.t. quantized operands, as dragon's step):
  projection(x, w, weight="int8", relu=True, threshold=0.0)
                     x (B,Hin,T,D) f32|bf16, w (H,N,D) f32|bf16 (dragon's
                     layout, nn.Linear's (out, in) per head)
                     -> relu(x . w^T - threshold) (B,H,T,N) (relu=False:
                     x . w^T, no threshold), x's dtype; with a
                     low-bit weight format x is quantized a token at a
                     time and w a channel at a time first, the ReLU's
                     mask recomputed from the saved codes in the backward
  decoder(y, w)      y (B,H,T,N) f32|bf16, w (D,H*N) -> (B,1,T,D) f32,
                     the head sum fused; w low-bit a channel at a time
  attention(xs, v)   xs (B,H,T,N), v (B,1,T,D), one dtype
                     -> tril(RoPE(xs) . RoPE(xs)^T, -1) . v (B,H,T,D)
  fake_quant_act(x), fake_quant_weight(w): the quantizers' round trip,
                     gradient passed straight through.
The backward's GEMMs take bf16 operands with f32 sums on every path
from sm_80 on, f32 weights and activations too (dragon's step does the
same; about 1e-3 of the norm, templates/grad.lua), so gradients are
f32 tensors good to bf16's rounding, not to f32's.
Each differentiable op's forward and backward are torch.library custom
ops (dragon_bdh::projection_fwd, ...) with fake implementations, so
torch.compile traces a model calling them; every tensor they make comes
from torch's allocator on the current stream (torch.cuda.graph captures
them).
"""
import ctypes
import warnings

import torch

import dragon_bdh
from dragon_bdh import _lib
from dragon_bdh.torch import _call
from dragon_bdh.torch._call import call, empty, ffi_tensor, float_fmt, storage_shape

LOWBIT = ("int8", "ternary", "sign1")
PACKED = ("ternary", "sign1")


def _rows(shape):
    n = 1
    for e in shape[:-1]:
        n *= e
    return n


# ---- raw ops --------------------------------------------------------------------


def quantize_act(x, act="int8", ascale="token"):
    """x (any shape, f32|bf16) -> (codes, scale): codes x's shape (int8;
    uint8 for uint8pos), scale float32, one a row of x viewed (rows, last
    dim) with ascale="token", else one."""
    src = float_fmt(x, "x")
    x = x.contiguous()
    rows = _rows(x.shape)
    # dragon's token rows are the (b, t) of a (B, G, T, C) tensor over its G
    # heads: x's rows are the tokens of a (1, 1, rows, C) one
    v = (1, 1, rows, x.shape[-1]) if x.dim() else (1, 1, 1, 1)
    codes = empty(act, v, x)
    scale = torch.empty(rows if ascale == "token" else 1, dtype=torch.float32, device=x.device)
    call("op=quantize_act;src=%s;act=%s;ascale=%s" % (src, act, ascale),
         [ffi_tensor("x", x.view(v), src), ffi_tensor("codes", codes, act, scale)], x)
    return codes.view(x.shape), scale


def quantize_weight(w, weight="int8", wscale="channel"):
    """w (any shape, f32|bf16) -> (codes int8 one a byte, scale): the
    weight format's codes (int8: -127..127, ternary: -1, 0, 1, sign1: -1,
    1) and scales, one a row of w viewed (rows, last dim) with
    wscale="channel", else one."""
    src = float_fmt(w, "w")
    w = w.contiguous()
    codes = torch.empty(w.shape, dtype=torch.int8, device=w.device)
    scale = torch.empty(_rows(w.shape) if wscale == "channel" else 1, dtype=torch.float32, device=w.device)
    call("op=quantize_weight;src=%s;weight=%s;wscale=%s" % (src, weight, wscale),
         [ffi_tensor("w", w, src), ffi_tensor("codes", codes, "int8", scale)], w)
    return codes, scale


def dequantize(codes, scale, act="int8", ascale="token", out=torch.float32):
    """codes (R, C) of act, scale a row (ascale="token") or one -> (R, C)
    code x scale in dtype out (float32 | bfloat16)."""
    of = _call.FLOAT_FMT[out]
    res = torch.empty(codes.shape, dtype=out, device=codes.device)
    call("op=dequantize;act=%s;ascale=%s;out=%s" % (act, ascale, of),
         [ffi_tensor("codes", codes.contiguous(), act, scale), ffi_tensor("out", res, of)], codes)
    return res


def pack(codes, fmt="ternary"):
    """codes (R, K) int8 of ternary (-1, 0, 1) or sign1 (-1, 1) -> (R, K/16)
    or (R, K/32) int32 words, the format's storage."""
    r, k = codes.shape
    words = empty(fmt, (r, k), codes)
    call("op=pack_%s;embd=%d" % (fmt, k),
         [ffi_tensor("codes", codes.contiguous(), "int8"), ffi_tensor("packed", words, fmt, logical=(r, k))], codes)
    return words


def unpack(words, fmt="ternary"):
    """The inverse of pack: (R, K/16|32) int32 words -> (R, K) int8 codes."""
    r = words.shape[0]
    k = words.shape[1] * _call.STORAGE[fmt][1]
    codes = torch.empty((r, k), dtype=torch.int8, device=words.device)
    call("op=pack_%s;embd=%d" % (fmt, k),
         [ffi_tensor("codes", codes, "int8"), ffi_tensor("packed", words.contiguous(), fmt, logical=(r, k))],
         words, unpack=1)
    return codes


# ---- the straight-through quantizers --------------------------------------------


class _FakeQuantAct(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, act, ascale):
        shape = x.shape
        codes, scale = quantize_act(x.reshape(-1, shape[-1]), act, ascale)
        return dequantize(codes, scale, act, ascale, x.dtype).reshape(shape)

    @staticmethod
    def backward(ctx, g):
        return g, None, None


class _FakeQuantWeight(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, weight, wscale):
        shape = w.shape
        codes, scale = quantize_weight(w.reshape(-1, shape[-1]), weight, wscale)
        return dequantize(codes, scale, "int8", "token" if wscale == "channel" else "tensor",
                          w.dtype).reshape(shape)

    @staticmethod
    def backward(ctx, g):
        return g, None, None


def fake_quant_act(x, act="int8", ascale="token"):
    """x's codes times their scales (x's dtype), gradient passed straight."""
    return _FakeQuantAct.apply(x, act, ascale)


def fake_quant_weight(w, weight="int8", wscale="channel"):
    """w's codes times their scales (w's dtype), gradient passed straight."""
    return _FakeQuantWeight.apply(w, weight, wscale)


# ---- projection -------------------------------------------------------------------


def _relu_text(threshold, relu):
    """The spec's relu= value: the threshold, or none without a ReLU."""
    return repr(float(threshold)) if relu else "none"


def _exec_weight(w, weight, wscale):
    """w (H,N,D) master -> (storage, scale) the kernels read."""
    H, N, D = w.shape
    if weight not in LOWBIT:
        return w.to(_call.STORAGE[weight][0]).contiguous(), None
    codes, scale = quantize_weight(w.reshape(H * N, D), weight, wscale)
    if weight in PACKED:
        return pack(codes, weight).reshape(H, N, -1), scale
    return codes.reshape(H, N, D), scale


def _proj_spec(op, H, Hin, D, N, extra):
    text = "op=%s;heads=%d;in_heads=%d;embd=%d;latent=%d" % (op, H, Hin, D, N)
    return text + extra


def _proj_fwd_impl(x, w, weight, threshold, relu):
    B, Hin, T, D = x.shape
    H, N, D2 = w.shape
    xf = float_fmt(x, "x")
    lowbit = weight in LOWBIT
    act = "int8" if lowbit else xf
    x = x.contiguous()
    if lowbit:
        # a scale a row of x: with in_heads H the row (b, h, t) of its own head
        # (the tape's a as (B·H, 1, T, D)), the kernel's x_row
        xq, xsc = quantize_act(x, "int8", "token")
        scales = ";wscale=channel;ascale=token"
    else:
        xq, xsc = x, None
        scales = ""
        weight = xf
    wq, wsc = _exec_weight(w, weight, "channel")
    out = torch.empty((B, H, T, N), dtype=x.dtype, device=x.device)
    relu_t = _relu_text(threshold, relu)
    text = _proj_spec("lowrank_fwd", H, Hin, D, N,
                      ";weight=%s;act=%s;out=%s;relu=%s%s" % (weight, act, xf, relu_t, scales))
    call(text, [ffi_tensor("x", xq, act, xsc, logical=(B, Hin, T, D)),
                ffi_tensor("w", wq, weight, wsc, logical=(H, N, D)),
                ffi_tensor("out", out, xf)], x)
    if not lowbit:  # the float path saves its inputs (a custom op's outputs may not alias them)
        none = lambda: torch.empty(0, dtype=torch.float32, device=x.device)  # noqa: E731
        return out, none(), none(), none(), none()
    return out, xq, xsc, wq, wsc


def _proj_bwd_impl(grad, xq, xsc, wq, wsc, x_shape, w_shape, weight, threshold, relu, x_float):
    B, Hin, T, D = x_shape
    H, N, _ = w_shape
    lowbit = weight in LOWBIT
    act = "int8" if lowbit else x_float
    if not lowbit:
        weight = x_float
    scales_w = ";wscale=channel" if lowbit else ""
    scales_a = ";ascale=token" if lowbit else ""
    g = grad.to(torch.float32).contiguous()
    xs = xsc if lowbit else None
    ws = wsc if lowbit else None
    if not lowbit:  # xq, wq are the inputs x and w (the masters)
        xq, wq = xq.contiguous(), wq.to(xq.dtype).contiguous()
    fx = lambda: ffi_tensor("x", xq, act, xs, logical=(B, Hin, T, D))  # noqa: E731
    fw = lambda: ffi_tensor("w", wq, weight, ws, logical=(H, N, D))  # noqa: E731
    if relu:
        gm = torch.empty_like(g)
        call(_proj_spec("relu_mask", H, Hin, D, N, ";weight=%s;act=%s;relu=%s%s%s" % (
            weight, act, _relu_text(threshold, relu), scales_w, scales_a)),
            [fx(), fw(), ffi_tensor("grad", g, "f32"), ffi_tensor("grad_out", gm, "f32")], g)
        g = gm
    gx = torch.empty((B, Hin, T, D), dtype=torch.float32, device=g.device)
    call(_proj_spec("lowrank_grad_input", H, Hin, D, N, ";weight=%s%s" % (weight, scales_w)),
         [ffi_tensor("grad", g, "f32"), fw(), ffi_tensor("grad_x", gx, "f32")], g)
    gw = torch.empty((H, N, D), dtype=torch.float32, device=g.device)
    call(_proj_spec("lowrank_grad_weight", H, Hin, D, N, ";act=%s%s" % (act, scales_a)),
         [ffi_tensor("grad", g, "f32"), fx(), ffi_tensor("grad_w", gw, "f32")], g)
    return gx, gw


# ---- decoder ----------------------------------------------------------------------


def _dec_fwd_impl(y, w, weight):
    B, H, T, N = y.shape
    D, HN = w.shape
    yf = float_fmt(y, "y")
    y = y.contiguous()
    lowbit = weight in LOWBIT
    if lowbit:
        codes, wsc = quantize_weight(w, weight, "channel")
        wq = pack(codes, weight) if weight in PACKED else codes
        extra = ";wscale=channel"
    else:
        weight = yf
        wq, wsc, extra = w.to(y.dtype).contiguous(), None, ""
    out = torch.empty((B, 1, T, D), dtype=torch.float32, device=y.device)
    call("op=decoder_fwd;heads=%d;embd=%d;latent=%d;weight=%s;act=%s;out=f32%s" % (H, D, N, weight, yf, extra),
         [ffi_tensor("y", y, yf), ffi_tensor("w", wq, weight, wsc, logical=(D, HN)),
          ffi_tensor("out", out, "f32")], y)
    if not lowbit:  # the float path saves the master (no alias out of a custom op)
        none = lambda: torch.empty(0, dtype=torch.float32, device=y.device)  # noqa: E731
        return out, none(), none()
    return out, wq, wsc


def _dec_bwd_impl(grad, y, wq, wsc, weight, w_shape):
    B, H, T, N = y.shape
    D, HN = w_shape
    yf = float_fmt(y, "y")
    lowbit = weight in LOWBIT
    if not lowbit:  # wq is the master
        weight = yf
        wq = wq.to(y.dtype).contiguous()
    extra = ";wscale=channel" if lowbit else ""
    g = grad.to(torch.float32).contiguous()
    gy = torch.empty((B, H, T, N), dtype=torch.float32, device=g.device)
    call("op=decoder_grad_input;heads=%d;embd=%d;latent=%d;weight=%s%s" % (H, D, N, weight, extra),
         [ffi_tensor("grad", g, "f32"), ffi_tensor("w", wq, weight, wsc if lowbit else None, logical=(D, HN)),
          ffi_tensor("grad_y", gy, "f32")], g)
    gw = torch.empty((D, HN), dtype=torch.float32, device=g.device)
    call("op=decoder_grad_weight;heads=%d;embd=%d;latent=%d;act=%s" % (H, D, N, yf),
         [ffi_tensor("grad", g, "f32"), ffi_tensor("y", y.contiguous(), yf), ffi_tensor("grad_w", gw, "f32")], g)
    return gy, gw


# ---- attention --------------------------------------------------------------------

_ropes = {}


def rope_table(t, n, device):
    """dragon's RoPE table (T, N) f32 (pairs' cos and sin of
    dg_ref_rope_table's phases, dragon/ref.h), on device (cached)."""
    key = (t, n, str(device))
    r = _ropes.get(key)
    if r is None:
        lib = _lib.lib()
        fn = lib.dg_ref_rope_pairs
        fn.restype, fn.argtypes = None, [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        host = torch.empty((t, n), dtype=torch.float32)
        fn(t, n, host.data_ptr())
        r = _ropes[key] = host.to(device)
    return r


def _att_fwd_impl(xs, v):
    B, H, T, N = xs.shape
    D = v.shape[-1]
    f = float_fmt(xs, "xs")
    xs, v = xs.contiguous(), v.to(xs.dtype).contiguous()
    rope = rope_table(T, N, xs.device)
    scores = torch.empty((B, H, T, T), dtype=xs.dtype, device=xs.device)
    call("op=attention_scores;heads=%d;latent=%d;act=%s" % (H, N, f),
         [ffi_tensor("xs", xs, f), ffi_tensor("rope", rope, "f32"), ffi_tensor("scores", scores, f)], xs)
    out = torch.empty((B, H, T, D), dtype=xs.dtype, device=xs.device)
    call("op=attention_out;heads=%d;embd=%d;act=%s" % (H, D, f),
         [ffi_tensor("scores", scores, f), ffi_tensor("v", v, f), ffi_tensor("out", out, f)], xs)
    return out, scores


def _att_bwd_impl(grad, xs, v, scores):
    B, H, T, N = xs.shape
    D = v.shape[-1]
    f = float_fmt(xs, "xs")
    g = grad.to(torch.float32).contiguous()
    v = v.to(xs.dtype).contiguous()
    rope = rope_table(T, N, xs.device)
    c = torch.empty((B, H, T, T), dtype=xs.dtype, device=xs.device)
    call("op=attention_grad_scores;heads=%d;embd=%d;act=%s" % (H, D, f),
         [ffi_tensor("grad", g, "f32"), ffi_tensor("v", v, f), ffi_tensor("grad_scores", c, f)], g)
    gv = torch.empty((B, 1, T, D), dtype=torch.float32, device=g.device)
    call("op=attention_grad_v;heads=%d;embd=%d;act=%s" % (H, D, f),
         [ffi_tensor("scores", scores, f), ffi_tensor("grad", g, "f32"), ffi_tensor("grad_v", gv, "f32")], g)
    gxs = torch.empty((B, H, T, N), dtype=torch.float32, device=g.device)
    call("op=attention_grad_xs;heads=%d;latent=%d;act=%s;out=f32" % (H, N, f),
         [ffi_tensor("grad_scores", c, f), ffi_tensor("xs", xs.contiguous(), f), ffi_tensor("rope", rope, "f32"),
          ffi_tensor("grad_xs", gxs, "f32")], g)
    return gxs, gv


# ---- the custom ops (what torch.compile sees) ---------------------------------------

@torch.library.custom_op("dragon_bdh::projection_fwd", mutates_args=())
def projection_fwd(x: torch.Tensor, w: torch.Tensor, weight: str, threshold: float, relu: bool) -> tuple[
        torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dragon_bdh::projection_fwd: (out, x codes, x scales, w copy, w scales)
    (the codes empty on the float path, whose backward saves x and w)."""
    return _proj_fwd_impl(x, w, weight, threshold, relu)


@projection_fwd.register_fake
def _(x, w, weight, threshold, relu):
    B, Hin, T, D = x.shape
    H, N, _ = w.shape
    out = x.new_empty((B, H, T, N))
    if weight not in LOWBIT:
        none = lambda: x.new_empty((0,), dtype=torch.float32)  # noqa: E731
        return out, none(), none(), none(), none()
    xq = x.new_empty((B, Hin, T, D), dtype=torch.int8)
    wq = w.new_empty(storage_shape(weight, (H, N, D)), dtype=_call.STORAGE[weight][0])
    return (out, xq, x.new_empty((B * Hin * T,), dtype=torch.float32), wq,
            x.new_empty((H * N,), dtype=torch.float32))


@torch.library.custom_op("dragon_bdh::projection_bwd", mutates_args=())
def projection_bwd(grad: torch.Tensor, xq: torch.Tensor, xsc: torch.Tensor, wq: torch.Tensor, wsc: torch.Tensor,
                   x_shape: list[int], w_shape: list[int], weight: str, threshold: float, relu: bool,
                   x_float: str) -> tuple[torch.Tensor, torch.Tensor]:
    """dragon_bdh::projection_bwd: (grad x, grad w), float32."""
    return _proj_bwd_impl(grad, xq, xsc, wq, wsc, x_shape, w_shape, weight, threshold, relu, x_float)


@projection_bwd.register_fake
def _(grad, xq, xsc, wq, wsc, x_shape, w_shape, weight, threshold, relu, x_float):
    return (grad.new_empty(tuple(x_shape), dtype=torch.float32), grad.new_empty(tuple(w_shape), dtype=torch.float32))


@torch.library.custom_op("dragon_bdh::decoder_fwd", mutates_args=())
def decoder_fwd(y: torch.Tensor, w: torch.Tensor, weight: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dragon_bdh::decoder_fwd: (out, w copy, w scales)."""
    return _dec_fwd_impl(y, w, weight)


@decoder_fwd.register_fake
def _(y, w, weight):
    B, H, T, N = y.shape
    D, HN = w.shape
    out = y.new_empty((B, 1, T, D), dtype=torch.float32)
    if weight not in LOWBIT:
        none = lambda: y.new_empty((0,), dtype=torch.float32)  # noqa: E731
        return out, none(), none()
    wq = w.new_empty(storage_shape(weight, (D, HN)), dtype=_call.STORAGE[weight][0])
    return out, wq, y.new_empty((D,), dtype=torch.float32)


@torch.library.custom_op("dragon_bdh::decoder_bwd", mutates_args=())
def decoder_bwd(grad: torch.Tensor, y: torch.Tensor, wq: torch.Tensor, wsc: torch.Tensor, weight: str,
                w_shape: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """dragon_bdh::decoder_bwd: (grad y, grad w), float32."""
    return _dec_bwd_impl(grad, y, wq, wsc, weight, w_shape)


@decoder_bwd.register_fake
def _(grad, y, wq, wsc, weight, w_shape):
    return (y.new_empty(y.shape, dtype=torch.float32), y.new_empty(tuple(w_shape), dtype=torch.float32))


@torch.library.custom_op("dragon_bdh::attention_fwd", mutates_args=())
def attention_fwd(xs: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """dragon_bdh::attention_fwd: (out, the scores the backward reads)."""
    return _att_fwd_impl(xs, v)


@attention_fwd.register_fake
def _(xs, v):
    B, H, T, N = xs.shape
    return xs.new_empty((B, H, T, v.shape[-1])), xs.new_empty((B, H, T, T))


@torch.library.custom_op("dragon_bdh::attention_bwd", mutates_args=())
def attention_bwd(grad: torch.Tensor, xs: torch.Tensor, v: torch.Tensor, scores: torch.Tensor) -> tuple[
        torch.Tensor, torch.Tensor]:
    """dragon_bdh::attention_bwd: (grad xs, grad v), float32."""
    return _att_bwd_impl(grad, xs, v, scores)


@attention_bwd.register_fake
def _(grad, xs, v, scores):
    return xs.new_empty(xs.shape, dtype=torch.float32), v.new_empty(v.shape, dtype=torch.float32)


# ---- the differentiable ops -----------------------------------------------------------


class Projection(torch.autograd.Function):
    """projection()'s autograd: dragon_bdh::projection_fwd and _bwd."""

    @staticmethod
    def forward(ctx, x, w, weight, threshold, relu):
        """The projection, its codes saved for the backward."""
        out, xq, xsc, wq, wsc = torch.ops.dragon_bdh.projection_fwd(x, w, weight, threshold, relu)
        if weight in LOWBIT:
            ctx.save_for_backward(xq, xsc, wq, wsc)
        else:
            ctx.save_for_backward(x, xsc, w, wsc)
        ctx.cfg = (list(x.shape), list(w.shape), weight, threshold, relu, _call.FLOAT_FMT.get(x.dtype, "f32"),
                   x.dtype, w.dtype)
        return out

    @staticmethod
    def backward(ctx, grad):
        """Gradients of x and w (straight through the quantizers)."""
        xq, xsc, wq, wsc = ctx.saved_tensors
        xs, ws, weight, threshold, relu, xf, xdt, wdt = ctx.cfg
        gx, gw = torch.ops.dragon_bdh.projection_bwd(grad, xq, xsc, wq, wsc, xs, ws, weight, threshold, relu, xf)
        return gx.to(xdt), gw.to(wdt), None, None, None


class Decoder(torch.autograd.Function):
    """decoder()'s autograd: dragon_bdh::decoder_fwd and _bwd."""

    @staticmethod
    def forward(ctx, y, w, weight):
        """The decoder, its weight's codes saved for the backward."""
        out, wq, wsc = torch.ops.dragon_bdh.decoder_fwd(y, w, weight)
        ctx.save_for_backward(y, wq if weight in LOWBIT else w, wsc)
        ctx.cfg = (weight, list(w.shape), y.dtype, w.dtype)
        return out

    @staticmethod
    def backward(ctx, grad):
        """Gradients of y and w."""
        y, wq, wsc = ctx.saved_tensors
        weight, ws, ydt, wdt = ctx.cfg
        gy, gw = torch.ops.dragon_bdh.decoder_bwd(grad, y, wq, wsc, weight, ws)
        return gy.to(ydt), gw.to(wdt), None


class Attention(torch.autograd.Function):
    """attention()'s autograd: dragon_bdh::attention_fwd and _bwd."""

    @staticmethod
    def forward(ctx, xs, v):
        """The attention, its scores saved for the backward."""
        out, scores = torch.ops.dragon_bdh.attention_fwd(xs, v)
        ctx.save_for_backward(xs, v, scores)
        return out

    @staticmethod
    def backward(ctx, grad):
        """Gradients of xs and v."""
        xs, v, scores = ctx.saved_tensors
        gxs, gv = torch.ops.dragon_bdh.attention_bwd(grad, xs, v, scores)
        return gxs.to(xs.dtype), gv.to(v.dtype)


def projection(x, w, weight="int8", relu=True, threshold=0.0):
    """relu(x . w^T - threshold) per head, or x . w^T with relu=False.

    x (B, Hin, T, D) float32|bfloat16, w (H, N, D) -> (B, H, T, N) in x's
    dtype; weight: the format w is computed in ("int8", "ternary",
    "sign1": x then int8 a token at a time; "f32", "bf16": x's own
    format). relu: bool, whether a ReLU follows; threshold: what it
    subtracts first (0.0: a plain ReLU; only with relu=True). Gradients
    are straight-through w.r.t. the quantized operands; see the module's
    doc. (Before 0.2 relu took the threshold itself, None for no ReLU;
    those forms still work and warn.)"""
    if relu is None or (not isinstance(relu, bool) and isinstance(relu, (int, float))):
        warnings.warn("projection(relu=%r): relu is a bool now, the threshold is threshold=; this means "
                      "relu=%s%s" % (relu, relu is not None, "" if relu is None else ", threshold=%r" % float(relu)),
                      DeprecationWarning, stacklevel=2)
        relu, threshold = (False, 0.0) if relu is None else (True, float(relu))
    if not isinstance(relu, bool):
        raise dragon_bdh.InvalidArgument("relu=%r: True or False (the threshold is threshold=)" % (relu,),
                                         "invalid argument")
    if not relu and threshold != 0.0:
        raise dragon_bdh.InvalidArgument("threshold=%r without a ReLU (relu=False): the threshold is the ReLU's"
                                         % threshold, "invalid argument")
    if weight not in LOWBIT + ("f32", "bf16"):
        raise dragon_bdh.InvalidArgument("weight '%s': one of int8, ternary, sign1, f32, bf16" % weight,
                                         "invalid argument")
    return Projection.apply(x, w, weight, float(threshold), relu)


def decoder(y, w, weight="int8"):
    """The decoder tail: sum_h y[:, h] . w[:, h*N:(h+1)*N]^T, (B,1,T,D) f32."""
    return Decoder.apply(y, w, weight)


def attention(xs, v):
    """BDH's linear attention with RoPE (no softmax): tril(qr qr^T, -1) v."""
    return Attention.apply(xs, v)
