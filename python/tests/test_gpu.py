"""dragon_bdh.torch on the GPU (each test prints "skipped: no CUDA device"
without one): every op against the PyTorch math in float64 (dragon's
float paths are f32/bf16, so the gradients are checked against the
float64 autograd of the same math, not by torch.autograd.gradcheck's
finite differences in float64, which needs a float64 path), the integer
paths exactly (codes, packing, the projection's integer products
recomputed from the codes), the module's loss and gradients against the
project's PyTorch model, a torch.compile'd model calling the ops, and the
ops captured in torch.cuda.graph."""
import math

import pytest
import torch

import dragon_bdh
import dragon_bdh.torch as dt


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def test_quantize_act_codes_and_scales(gpu):
    x = torch.randn(64, 256, device=gpu) * torch.rand(64, 1, device=gpu) * 3
    codes, scale = dt.quantize_act(x, "int8", "token")
    assert codes.dtype == torch.int8 and scale.shape == (64,)
    # a row's scale is its absmax over 127 and its codes round x / scale
    amax = x.abs().amax(1)
    assert torch.allclose(scale, amax / 127, rtol=1e-6, atol=0)
    want = torch.clamp(torch.round(x / scale[:, None]), -127, 127).to(torch.int8)
    assert (codes.int() - want.int()).abs().max().item() <= 1  # ties of the rounding
    assert (codes != want).float().mean().item() < 1e-3
    back = dt.dequantize(codes, scale, "int8", "token")
    assert (back - x).abs().max().item() <= scale.max().item() * 0.5 + 1e-6


@pytest.mark.parametrize("side", [False, True])
def test_ops_are_ordered_on_torchs_stream(gpu, side):
    """torch work before and after an op on the same stream, no sync
    between: on the default stream (handle 0, the legacy stream) and on a
    side stream, dragon's launches wait for the one and the other for them."""
    import contextlib

    w = torch.randn(4096, 2048, device=gpu)
    stream = torch.cuda.Stream() if side else None
    if stream:
        stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream) if stream else contextlib.nullcontext():
        for _ in range(3):
            w2 = torch.sin(w) * 3 + w  # queued just before the op reads it
            codes, scale = dt.quantize_weight(w2, "int8", "channel")
            back = codes.float() * scale[:, None]  # queued just after the op writes them
            err = ((back - w2).abs() / scale[:, None]).amax()
            amax = w2.abs().amax(1)
    torch.cuda.synchronize()
    assert torch.allclose(scale, amax / 127, rtol=1e-6, atol=0)
    assert err.item() <= 0.5 + 1e-3


@pytest.mark.parametrize("cols", [256, 2048, 8192])
def test_quantize_weight_int8_rows(gpu, cols):
    """A scale a row (both entries: a warp a row up to 1024 values, a block
    a row past it), codes round(w / scale) within -127..127."""
    w = torch.randn(96, cols, device=gpu) * torch.rand(96, 1, device=gpu)
    codes, scale = dt.quantize_weight(w, "int8", "channel")
    amax = w.abs().amax(1)
    assert torch.allclose(scale, amax / 127, rtol=1e-6, atol=0)
    want = torch.clamp(torch.round(w / scale[:, None]), -127, 127).to(torch.int8)
    assert (codes.int() - want.int()).abs().max().item() <= 1
    assert (codes != want).float().mean().item() < 1e-3


@pytest.mark.parametrize("fmt", ["ternary", "sign1"])
def test_pack_round_trip_exact(gpu, fmt):
    w = torch.randn(128, 256, device=gpu)
    codes, scale = dt.quantize_weight(w, fmt, "channel")
    vals = set(codes.unique().tolist())
    assert vals == ({-1, 0, 1} if fmt == "ternary" else {-1, 1})
    words = dt.pack(codes, fmt)
    assert words.shape == (128, 256 // (16 if fmt == "ternary" else 32))
    assert torch.equal(dt.unpack(words, fmt), codes)


def proj_ref(x, w, relu, weight):
    """The projection in float64 from what the kernel reads."""
    xd, wd = x.double(), w.double()
    # in_heads 1: one x every head reads; in_heads H: head h reads x's head h
    y = torch.einsum("bite,hle->bhtl" if x.shape[1] == 1 else "bhte,hle->bhtl", xd, wd)
    return torch.relu(y - relu) if relu is not None else y


@pytest.mark.parametrize("weight", ["f32", "bf16"])
def test_projection_float_against_float64(gpu, weight):
    dtype = torch.float32 if weight == "f32" else torch.bfloat16
    x = torch.randn(2, 1, 64, 256, device=gpu, dtype=dtype, requires_grad=True)
    w = (torch.randn(4, 512, 256, device=gpu) * 0.05).to(dtype).requires_grad_()
    y = dt.projection(x, w, weight=weight)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    want = proj_ref(x64, w64, 0.0, weight)
    tol = 1e-5 if weight == "f32" else 1e-2
    assert rel(y, want) < tol
    g = torch.randn_like(want)
    y.backward(g.to(y.dtype))
    want.backward(g)
    # the gradient GEMMs take bf16 operands with f32 sums on every path from
    # sm_80 on (templates/grad.lua: about 1e-3 of the norm), f32 weights too
    assert rel(x.grad, x64.grad) < 5e-3 and rel(w.grad, w64.grad) < 5e-3


@pytest.mark.parametrize("weight,hin", [("int8", 1), ("ternary", 1), ("int8", 4)])
def test_projection_lowbit_is_the_codes_product(gpu, weight, hin):
    x = torch.randn(2, hin, 64, 256, device=gpu, requires_grad=True)
    w = (torch.randn(4, 512, 256, device=gpu) * 0.05).requires_grad_()
    y = dt.projection(x, w, weight=weight)
    # a scale a row of x (b, h, t): with in_heads H, of its own head's row
    xq, xs = dt.quantize_act(x.detach(), "int8", "token")
    xs = xs.double().reshape(2, hin, 64, 1)
    wq, ws = dt.quantize_weight(w.detach().reshape(-1, 256), weight, "channel")
    # exact integers in float64, then the scales: (b, h, t, l)
    acc = proj_ref(xq, wq.reshape(4, 512, 256), None, weight)
    sx = xs if hin == 1 else xs.expand(2, 4, 64, 1)
    want = torch.relu(acc * sx * ws.double().reshape(1, 4, 1, 512))
    assert rel(y, want) < 1e-6
    # straight-through: the gradients of the dequantized math, masked where the
    # integer sum is > 0 (a float64 sum of the dequantized terms can miss a
    # tie at 0 by rounding; ternary codes make ties common)
    xd = (xq.double() * xs).requires_grad_()
    wd = (wq.double() * ws.double()[:, None]).reshape(4, 512, 256).requires_grad_()
    ref = proj_ref(xd, wd, None, weight)
    g = torch.randn_like(ref)
    y.backward(g.float())
    ref.backward(g * (acc > 0))
    # the gradient GEMMs may take bf16 operands (a tensor-core path): bf16's rounding
    assert rel(x.grad, xd.grad) < 1e-2 and rel(w.grad, wd.grad) < 1e-2


@pytest.mark.parametrize("weight", ["int8", "bf16"])
def test_decoder_against_float64(gpu, weight):
    y = torch.rand(2, 4, 64, 512, device=gpu, dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(256, 4 * 512, device=gpu) * 0.02).requires_grad_()
    out = dt.decoder(y, w, weight=weight)
    wd = w.detach().to(torch.bfloat16).double()  # what a bf16 weight is
    if weight == "int8":
        wq, ws = dt.quantize_weight(w.detach(), "int8", "channel")
        wd = wq.double() * ws.double()[:, None]
    yd = y.detach().double().requires_grad_()
    wd = wd.requires_grad_()
    want = torch.einsum("bhtl,ehl->bte", yd, wd.view(256, 4, 512)).unsqueeze(1)
    assert rel(out, want) < 1e-3
    g = torch.randn_like(want)
    out.backward(g.float())
    want.backward(g)
    assert rel(y.grad, yd.grad) < 1e-2 and rel(w.grad, wd.grad) < 1e-2


def rope_ref(xs, t, n):
    i = torch.arange(n, dtype=torch.float64, device=xs.device)
    freq = 1.0 / (2.0 ** 16) ** ((i / 2).floor() * 2 / n) / (2 * math.pi)
    ph = (torch.arange(t, dtype=torch.float64, device=xs.device)[:, None] * freq) % 1.0 * 2 * math.pi
    rot = torch.stack((-xs[..., 1::2], xs[..., 0::2]), dim=-1).flatten(-2)
    return xs * torch.cos(ph) + rot * torch.sin(ph)


def test_attention_against_float64(gpu):
    xs = torch.rand(2, 4, 64, 512, device=gpu, requires_grad=True)
    v = torch.randn(2, 1, 64, 256, device=gpu, requires_grad=True)
    out = dt.attention(xs, v)
    xd, vd = xs.detach().double().requires_grad_(), v.detach().double().requires_grad_()
    qr = rope_ref(xd, 64, 512)
    want = (qr @ qr.mT).tril(-1) @ vd
    assert rel(out, want) < 1e-3
    g = torch.randn_like(want)
    out.backward(g.float())
    want.backward(g)
    assert rel(xs.grad, xd.grad) < 5e-3 and rel(v.grad, vd.grad) < 5e-3


TINY = dict(n_layer=2, n_embd=64, n_head=2, mlp_internal_dim_multiplier=8, vocab_size=256)  # 256 neurons a head
REF = dict(layers=2, embd=64, heads=2, neurons=256, vocab=256)


def gpu_model(gpu, preset, scale=10.0, **kw):
    """A small BDH on the GPU (its init scaled up) and the PyTorch model
    holding its weights."""
    import bdh_torch

    m = dt.BDH(dt.BDHConfig(preset=preset, **{**TINY, "dropout": 0.0, "seed": 3, "batch_size": 2, "block_size": 32,
                                              **kw}))
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(scale)
    m = m.to(gpu)
    ref = bdh_torch.BDH(dropout=0.0, quant=None if preset in ("f32", "bf16") else preset, **REF).to(gpu)
    ref.load_state_dict(m.state_dict())
    return m, ref


def gpu_tokens(gpu, seed, b=2, t=32):
    g = torch.Generator(device=gpu).manual_seed(seed)
    return (torch.randint(0, 256, (b, t), device=gpu, generator=g),
            torch.randint(0, 256, (b, t), device=gpu, generator=g))


LOSS_TOL = {"f32": 1e-5, "bf16": 1e-2, "w8a8": 3e-3, "bitnet": 3e-3}
# f32 to rounding; bf16 and the low-bit recipes against PyTorch's bf16 and
# fake-quant forms: 5-11% normwise at a small config (README, bench/parity)
GRAD_TOL = {"f32": 1e-3, "bf16": 0.1, "w8a8": 0.15, "bitnet": 0.15}


def against_ref(m, ref, idx, tgt, preset):
    m.zero_grad()
    ref.zero_grad()
    logits, loss = m(idx, tgt)
    assert logits is None
    loss.backward()
    with torch.autocast("cuda", torch.bfloat16, enabled=preset == "bf16"):
        want = ref(idx, tgt)
    want.backward()
    assert abs(loss.item() - want.item()) <= LOSS_TOL[preset] * want.item(), (loss.item(), want.item())
    for (n, p), (_, q) in zip(sorted(m.named_parameters()), sorted(ref.named_parameters())):
        assert rel(p.grad, q.grad) < GRAD_TOL[preset], n


@pytest.mark.parametrize("preset", ["f32", "bf16", "w8a8", "bitnet"])
def test_bdh_module_against_the_pytorch_model(gpu, preset):
    """Loss and gradients; the logits (bfloat16 for bf16 and the low-bit
    recipes, f32 for f32) against the PyTorch model's."""
    m, ref = gpu_model(gpu, preset)
    idx, tgt = gpu_tokens(gpu, 1)
    against_ref(m, ref, idx, tgt, preset)
    assert not m.bad_tokens()
    logits, loss = m(idx)
    assert loss is None and logits.shape == (2, 32, 256) and not logits.requires_grad
    assert logits.dtype == (torch.float32 if preset == "f32" else torch.bfloat16)
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16, enabled=preset == "bf16"):
        want = ref(idx)
    assert rel(logits, want) < {"f32": 1e-5, "bf16": 2e-2}.get(preset, 5e-2)


def test_bdh_plans_cover_smaller_batches_and_grow(gpu):
    """A batch up to the plan's (B, T) runs on it, padded (its loss and
    gradients the batch's own); a larger one is planned at its first
    forward, the plans kept; each batch takes the smallest that covers it."""
    m, ref = gpu_model(gpu, "f32", batch_size=4)
    for (b, t), plans in (((2, 16), 1), ((4, 32), 1), ((1, 1), 1), ((8, 32), 2), ((3, 40), 3), ((2, 16), 3)):
        idx, tgt = gpu_tokens(gpu, b * 100 + t, b, t)
        against_ref(m, ref, idx, tgt, "f32")
        assert len(m.plans()) == plans, ((b, t), m.plans())
    assert {p[1:] for p in m.plans()} == {(4, 32), (8, 32), (4, 40)}
    assert not m.bad_tokens()  # the padding's targets are not the batch's
    bad = torch.zeros(2, 16, dtype=torch.long, device=gpu)
    bad[1, 3] = 300
    m(bad, bad)
    assert m.bad_tokens()
    with pytest.raises(dragon_bdh.InvalidArgument, match=r"idx\[19\] = 300"):
        m(bad.cpu(), bad.cpu())
    m.clear_plans()
    assert m.plans() == []


def test_bdh_backward_runs_in_loss_backward(gpu, monkeypatch):
    """No backward inside the forward; one in loss.backward(); a forward
    in between makes the later backward recompute its own forward first, so
    its gradients are its own batch's."""
    m, ref = gpu_model(gpu, "w8a8")
    idx, tgt = gpu_tokens(gpu, 2)
    m(idx, tgt)
    (plan,) = m._plans.values()
    calls = []
    real = plan.model.backward
    monkeypatch.setattr(plan.model, "backward", lambda: (calls.append(1), real())[1])
    _, loss = m(idx, tgt)
    torch.cuda.synchronize()
    assert calls == [] and all(p.grad is None for p in m.parameters())
    loss.backward()
    assert calls == [1]
    g1 = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    _, first = m(idx, tgt)
    m(*gpu_tokens(gpu, 3))
    first.backward()
    assert calls == [1, 1]
    for p, g in zip(m.parameters(), g1):
        assert torch.equal(p.grad, g)


def test_bdh_generate_on_the_gpu(gpu):
    """Greedy generate() is the PyTorch model's argmax at each last
    position (f32), the prompt kept, the context every token so far (the
    decoder's state: no window, past block_size 16)."""
    m, ref = gpu_model(gpu, "f32", block_size=16)
    idx, _ = gpu_tokens(gpu, 5, 2, 6)
    out = m.generate(idx, 20, temperature=0)
    assert out.shape == (2, 26) and torch.equal(out[:, :6], idx)
    with torch.no_grad():
        for k in range(6, 26):
            assert torch.equal(out[:, k], ref(out[:, :k])[:, -1].argmax(-1)), k
    torch.manual_seed(1)
    assert m.generate(idx, 8, temperature=0.8, top_k=10).shape == (2, 14)


def test_bdh_moves_between_the_cpu_and_the_gpu(gpu):
    """.to(cuda) and back: the same parameters (the optimizer's), each
    side's plan on its own device, the same loss (f32) on both."""
    m = dt.BDH(preset="f32", dropout=0.0, batch_size=2, block_size=16, **TINY)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    params = list(m.parameters())
    idx, tgt = gpu_tokens(gpu, 4, 2, 16)
    cpu_loss = m(idx.cpu(), tgt.cpu())[1].item()
    m.cuda()
    assert list(m.parameters()) == params and all(p.device == gpu for p in params)
    _, loss = m(idx, tgt)
    assert abs(loss.item() - cpu_loss) <= 1e-5 * cpu_loss
    loss.backward()
    opt.step()
    after = m(idx, tgt)[1].item()
    m.to("cpu")
    assert all(p.device.type == "cpu" for p in params) and all(k[0].type == "cpu" for k in m._plans)
    assert abs(m(idx.cpu(), tgt.cpu())[1].item() - after) <= 1e-5 * after
    with pytest.raises(dragon_bdh.InvalidArgument, match="the model on cpu"):
        m(idx, tgt)


def test_bdh_trains_with_adamw(gpu):
    m = dt.BDH(preset="w8a8", seed=2, batch_size=4, block_size=64, **TINY).to(gpu)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.1, fused=True)
    idx = torch.randint(0, 256, (4, 64), device=gpu)
    tgt = torch.roll(idx, -1, 1)
    losses = []
    for _ in range(40):
        _, loss = m(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.3, losses


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(2, 128, 64) * 0.1)
        self.d = torch.nn.Parameter(torch.randn(64, 2 * 128) * 0.05)

    def forward(self, x):
        y = dt.projection(x, self.w, weight="int8", relu=True)
        return dt.decoder(y.to(torch.bfloat16), self.d, weight="int8")


def test_torch_compile_traces_the_ops(gpu):
    torch.manual_seed(0)
    mod = Tiny().to(gpu)
    x = torch.randn(2, 1, 32, 64, device=gpu, requires_grad=True)
    eager = mod(x)
    eager.sum().backward()
    ge = [p.grad.clone() for p in mod.parameters()]
    mod.zero_grad()
    comp = torch.compile(mod, fullgraph=True)
    out = comp(x)
    out.sum().backward()
    assert torch.equal(out, eager)
    for p, g in zip(mod.parameters(), ge):
        assert torch.equal(p.grad, g)


def test_cuda_graph_capture_replays_the_ops(gpu):
    torch.manual_seed(0)
    mod = Tiny().to(gpu)
    x = torch.randn(2, 1, 32, 64, device=gpu, requires_grad=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up: the kernels compiled and loaded before capture
        for _ in range(2):
            mod(x).sum().backward()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    mod.zero_grad(set_to_none=False)
    with torch.cuda.graph(g):
        out = mod(x)
        out.sum().backward()
    with torch.no_grad():
        x.copy_(torch.randn_like(x))
        for p in mod.parameters():
            p.grad.zero_()
    g.replay()
    torch.cuda.synchronize()
    eager = mod(x)
    assert torch.equal(out, eager)


def test_the_example_follows_dragon_train_on_the_gpu(gpu, tmp_path):
    """examples/train_bdh.py on the GPU (the tiny size) against `dragon
    train` on the GPU of the same run: the same batches, init, schedule and
    dropout; torch's fused AdamW and clip for dragon's device step."""
    import json
    import os
    import random
    import subprocess
    import sys

    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    prog = os.environ.get("DRAGON") or os.path.join(os.path.dirname(dragon_bdh.library_path()), "dragon")
    if not os.path.isfile(prog):
        pytest.fail("no dragon program at %s" % prog)
    random.seed(1)
    words = open(os.path.join(os.path.dirname(pkg), "README.md")).read().split()
    text = tmp_path / "text.txt"
    text.write_text(" ".join(random.choice(words) for _ in range(40000)))
    common = ["--preset", "w8a8", "--steps", "60", "--batch", "4", "--time", "64", "--seed", "5", "--lr", "3e-3",
              "--data", str(text)]
    ex = subprocess.run([sys.executable, os.path.join(pkg, "examples", "train_bdh.py"), *common, "--size", "tiny",
                         "--log", str(tmp_path / "ex.jsonl")], capture_output=True, text=True, timeout=600)
    assert ex.returncode == 0, ex.stderr
    dr = subprocess.run([prog, "train", *common, "--layers", "2", "--embd", "32", "--heads", "2", "--neurons", "64",
                         "--eval-batches", "2", "--out", str(tmp_path / "run")], capture_output=True, text=True,
                        timeout=600)
    assert dr.returncode == 0, dr.stderr
    got = [json.loads(l) for l in open(tmp_path / "ex.jsonl")]
    want = [json.loads(l) for l in open(tmp_path / "run" / "log.jsonl")]
    assert len(got) == len(want) == 60
    worst = max(abs(g["train_loss"] - w["train_loss"]) / w["train_loss"] for g, w in zip(got, want))
    print("example vs dragon train on the GPU: worst relative loss difference %.2e over 60 steps" % worst)
    assert worst < 1e-2
    assert got[-1]["train_loss"] < got[0]["train_loss"] - 0.5


def test_ops_keep_their_prepared_kernels(gpu):
    """A second call of a shape launches the op prepared at the first (no
    new prepare), with the same results into other memory; another shape
    prepares its own; clear_prepared lets them go and the next call
    prepares again."""
    dt.clear_prepared()
    x = torch.randn(48, 256, device=gpu) * 3
    st0 = dt.prepared_stats()
    c1, s1 = dt.quantize_act(x, "int8", "token")
    st1 = dt.prepared_stats()
    c2, s2 = dt.quantize_act(x.clone(), "int8", "token")
    st2 = dt.prepared_stats()
    assert st1["prepares"] - st0["prepares"] == 1
    assert st2["prepares"] == st1["prepares"], "the second call of the shape prepared again"
    assert st2["launches"] - st1["launches"] == 1
    assert torch.equal(c1, c2) and torch.equal(s1, s2)
    dt.quantize_act(torch.randn(16, 256, device=gpu), "int8", "token")
    assert dt.prepared_stats()["prepares"] == st2["prepares"] + 1
    dt.clear_prepared()
    assert dt.prepared_stats()["kept"] == 0
    c3, s3 = dt.quantize_act(x, "int8", "token")
    torch.cuda.synchronize()
    assert dt.prepared_stats()["prepares"] == st2["prepares"] + 2
    assert torch.equal(c1, c3) and torch.equal(s1, s3)
