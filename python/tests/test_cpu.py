"""The package without a GPU: import, the library's discovery, dragon's
messages as exceptions, every op's wiring (specs, shapes, formats) passing
dragon's checks in check_only mode, the argument checks, and the CPU
model under dragon.torch.BDH against the project's PyTorch model."""
import os
import subprocess
import sys

import pytest
import torch

import dragon
import dragon.torch as dt

PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_py(code, timeout_s=120, argv=(), **env):
    e = dict(os.environ)
    e.update(env)
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=e,
                          timeout=timeout_s)


def test_import_needs_no_torch_and_no_gpu():
    r = run_py("import sys; sys.modules['torch'] = None\nimport dragon\n"
               "s = dragon.Spec('op=lowrank_fwd;weight=ternary;act=int8;relu=0')\n"
               "print(s.text); print(dragon.device_count() >= 0)")
    assert r.returncode == 0, r.stderr
    assert "op=lowrank_fwd" in r.stdout and "weight=ternary" in r.stdout


def test_library_found_and_a_bad_dragon_lib_named():
    assert os.path.isfile(dragon.library_path())
    r = run_py("import dragon; dragon.Spec('op=lowrank_fwd')", DRAGON_LIB="/nonexistent/libdragon.so")
    assert r.returncode != 0
    assert "libdragon not found" in r.stderr and "/nonexistent/libdragon.so" in r.stderr


def test_corpus_refuses_what_is_not_a_file(tmp_path):
    """A directory or a FIFO as a corpus: dragon's line naming it, at once
    (a FIFO is not waited on; the child is given 60 s)."""
    fifo = tmp_path / "c.fifo"
    os.mkfifo(fifo)
    for path, what in ((tmp_path, "a directory"), (fifo, "a FIFO")):
        r = run_py("import sys, dragon\n"
                   "try:\n    dragon.Corpus(sys.argv[1])\n"
                   "except dragon.DragonError as e:\n    print(e)\n", timeout_s=60, argv=[str(path)])
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith(f"{path}: {what}"), r.stdout


def test_torchs_default_stream_is_the_legacy_stream(monkeypatch):
    """torch's default stream has handle 0: dragon must be told the legacy
    stream (DG_STREAM_LEGACY), not NULL, which is its own non-blocking
    stream and would race torch's work; a side stream's handle passes as is."""
    seen = []

    class FakeDevice:
        def set_stream(self, s):
            seen.append(s)

    class FakeStream:
        def __init__(self, h):
            self.cuda_stream = h

    monkeypatch.setattr(dragon.Device, "get", staticmethod(lambda i: FakeDevice()))
    for handle in (0, 0x7F00DEAD):
        monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None, h=handle: FakeStream(h))
        dt._call.device(torch.device("cuda", 0))
    assert seen == [dragon.Device.LEGACY_STREAM, 0x7F00DEAD]
    assert dragon.Device.LEGACY_STREAM == 1  # the driver's CU_STREAM_LEGACY


def test_spec_errors_are_dragons_messages():
    with pytest.raises(dragon.InvalidSpec, match="latent=8190"):
        dragon.Spec("op=lowrank_fwd;latent=8190")
    with pytest.raises(dragon.InvalidSpec, match="frob"):
        dragon.Spec("op=frob")
    s = dragon.Spec("op=decoder_fwd;heads=2;embd=32;latent=64")
    assert [a["name"] for a in s.args(b=2, t=3)] == ["y", "w", "out"]
    assert s.args(b=2, t=3)[2]["shape"] == (2, 1, 3, 32)


def test_spec_plans_without_a_device():
    p = dragon.Spec("op=lowrank_fwd;weight=ternary;act=int8;relu=0").plan(90)
    assert p["path"] and "tile=" in p["canonical"] and "tile=auto" not in p["canonical"]
    with pytest.raises(dragon.InvalidSpec, match="48"):
        dragon.Spec("op=lowrank_fwd;tile=48x64x64/2x2/2").plan(90)


def test_no_device_says_why():
    if dragon.device_count():
        pytest.skip("a GPU is here")
    with pytest.raises(dragon.NoDevice) as e:
        dragon.Device(0)
    assert str(e.value)
    x = torch.randn(2, 1, 3, 32)
    w = torch.randn(2, 64, 32)
    with pytest.raises(dragon.InvalidArgument, match="expected a CUDA tensor"):
        dt.projection(x, w)


# B, Hin, T, E, H, L: the tiny shapes every op is wired at
B, T, E, H, L = 2, 5, 32, 2, 64


@pytest.mark.parametrize("weight", ["int8", "ternary", "sign1", "f32", "bf16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_projection_wiring_passes_dragons_checks(weight, dtype):
    x = torch.randn(B, 1, T, E, dtype=dtype, requires_grad=True)
    w = torch.randn(H, L, E, dtype=dtype, requires_grad=True)
    with dt.check_only():
        y = dt.projection(x, w, weight=weight, relu=0.0)
        assert y.shape == (B, H, T, L) and y.dtype == dtype
        y.sum().backward()
        dt.projection(x.detach(), w.detach(), weight=weight, relu=None)
    assert x.grad.shape == x.shape and w.grad.shape == w.shape


@pytest.mark.parametrize("weight", ["int8", "ternary", "bf16"])
def test_decoder_and_attention_wiring(weight):
    y = torch.randn(B, H, T, L, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(E, H * L, requires_grad=True)
    xs = torch.rand(B, H, T, L, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, 1, T, E, dtype=torch.bfloat16, requires_grad=True)
    with dt.check_only():
        out = dt.decoder(y, w, weight=weight)
        assert out.shape == (B, 1, T, E) and out.dtype == torch.float32
        out.sum().backward()
        a = dt.attention(xs, v)
        assert a.shape == (B, H, T, E)
        a.float().sum().backward()
    assert y.grad.shape == y.shape and w.grad.shape == w.shape
    assert xs.grad.shape == xs.shape and v.grad.shape == v.shape


def test_quantizers_and_packers_wiring():
    x = torch.randn(6, 64)
    with dt.check_only():
        c, s = dt.quantize_act(x, "int8", "token")
        assert c.dtype == torch.int8 and s.shape == (6,)
        c, s = dt.quantize_act(x, "uint8pos", "tensor")
        assert c.dtype == torch.uint8 and s.shape == (1,)
        c, s = dt.quantize_weight(x, "ternary", "channel")
        assert c.dtype == torch.int8 and s.shape == (6,)
        p = dt.pack(c, "ternary")
        assert p.shape == (6, 4) and p.dtype == torch.int32
        assert dt.unpack(p, "ternary").shape == (6, 64)
        assert dt.pack(c, "sign1").shape == (6, 2)
        assert dt.dequantize(c, s, "int8", "token").shape == (6, 64)
        xg = x.clone().requires_grad_()
        dt.fake_quant_act(xg).sum().backward()
        assert torch.equal(xg.grad, torch.ones_like(x))  # straight through


def test_bad_arguments_are_refused_by_name():
    x = torch.randn(B, 1, T, E)
    with dt.check_only():
        with pytest.raises(dragon.InvalidArgument, match=r"w: expected .*\(2, 64, 32\)|w.*31"):
            dt._call.call("op=lowrank_fwd;heads=2;in_heads=1;embd=32;latent=64;weight=f32;act=f32;out=f32;relu=0",
                          [dt._call.ffi_tensor("x", x, "f32"),
                           dt._call.ffi_tensor("w", torch.randn(H, L, 31), "f32"),
                           dt._call.ffi_tensor("out", torch.empty(B, H, T, L), "f32")], x)
        with pytest.raises(dragon.InvalidArgument, match="float32 or bfloat16"):
            dt.projection(x.to(torch.int32), torch.randn(H, L, E))
        with pytest.raises(dragon.InvalidArgument, match="contiguous"):
            xt = torch.randn(B, 1, E, T).transpose(2, 3)
            dt._call.call("op=lowrank_fwd;heads=2;in_heads=1;embd=32;latent=64;weight=f32;act=f32;out=f32;relu=0",
                          [dt._call.ffi_tensor("x", xt, "f32"), dt._call.ffi_tensor("w", torch.randn(H, L, E), "f32"),
                           dt._call.ffi_tensor("out", torch.empty(B, H, T, L), "f32")], x)
        with pytest.raises(dragon.InvalidArgument, match="weight 'fp4'"):
            dt.projection(x, torch.randn(H, L, E), weight="fp4")
        with pytest.raises(dragon.InvalidArgument, match="expected a torch.int8 tensor"):
            dt._call.ffi_tensor("codes", torch.zeros(4, dtype=torch.uint8), "int8")


TINY = dict(layers=2, embd=32, heads=2, neurons=64, vocab=256)


def tokens(seed, b=2, t=8):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (b, t), generator=g), torch.randint(0, 256, (b, t), generator=g)


@pytest.mark.parametrize("preset", ["f32", "w8a8", "bitnet"])
def test_cpu_bdh_matches_the_pytorch_model(preset):
    import bdh_torch

    m = dt.BDH(preset, batch=2, time=8, dropout=0.0, seed=3, **TINY)
    ref = bdh_torch.BDH(dropout=0.0, quant=None if preset == "f32" else preset, **TINY)
    with torch.no_grad():  # the reference's init scaled up, so the ReLUs are not all at their kinks
        for p in m.parameters():
            p.mul_(25.0)
    ref.load_state_dict(m.state_dict(), strict=True)
    idx, tgt = tokens(1)
    loss = m(idx, tgt)
    loss.backward()
    want = ref(idx, tgt)
    want.backward()
    tol = 1e-5 if preset == "f32" else 2e-3
    assert abs(loss.item() - want.item()) <= tol * abs(want.item()), (loss.item(), want.item())
    for (n, p), (n2, q) in zip(sorted(m.named_parameters()), sorted(ref.named_parameters())):
        assert n == n2
        rel = (p.grad - q.grad).norm() / q.grad.norm()
        assert rel < (1e-4 if preset == "f32" else 5e-2), (n, rel.item())


def test_cpu_bdh_state_dict_round_trip_and_checkpoint(tmp_path):
    import bdh_torch
    from safetensors.torch import save_file

    m = dt.BDH("f32", batch=2, time=8, seed=5, **TINY)
    ref = bdh_torch.BDH(**TINY)
    ref.load_state_dict(m.state_dict())
    m2 = dt.BDH("f32", batch=2, time=8, seed=6, **TINY)
    m2.load_state_dict(ref.state_dict())
    for a, b in zip(m.state_dict().values(), m2.state_dict().values()):
        assert torch.equal(a, b)
    path = str(tmp_path / "w.safetensors")
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, path)
    m3 = dt.BDH("f32", batch=2, time=8, seed=9, **TINY)
    m3.load_checkpoint(path)
    assert torch.equal(m3.encoder, m.encoder)
    with pytest.raises(dragon.InvalidArgument, match="shape"):
        m3(torch.zeros(2, 9, dtype=torch.long), torch.zeros(2, 9, dtype=torch.long))
    with pytest.raises(dragon.InvalidArgument, match=r"idx\[3\] = 300"):
        bad = torch.zeros(2, 8, dtype=torch.long)
        bad[0, 3] = 300
        m3(bad, torch.zeros(2, 8, dtype=torch.long))
    with pytest.raises(dragon.Unsupported, match="lives where it was made"):
        m3.to(torch.float64)


def test_load_checkpoint_checks_the_file_as_dragon_does(tmp_path):
    """load_checkpoint reads a `dragon train` checkpoint's weights, and
    refuses what dragon's own readers refuse: a flipped bit of its
    metadata (the step: the seal covers the header too), a NaN weight
    (named, though a file PyTorch wrote has no seal), and gradients."""
    prog = os.environ.get("DRAGON") or os.path.join(os.path.dirname(dragon.library_path()), "dragon")
    if not os.path.isfile(prog):
        pytest.skip("no dragon program beside the library (%s)" % prog)
    from safetensors.torch import load_file, save_file

    text = tmp_path / "text.txt"
    text.write_text("Now is the winter of our discontent made glorious summer by this sun of York. " * 80)
    tiny = ["--cpu", "--layers", "2", "--embd", "32", "--heads", "2", "--neurons", "64"]
    r = subprocess.run([prog, "train", *tiny, "--preset", "f32", "--steps", "3", "--batch", "2", "--time", "8",
                        "--eval-batches", "1", "--data", str(text), "--out", str(tmp_path / "run")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    ck = tmp_path / "run" / "ckpt-00000003.safetensors"
    m = dt.BDH("f32", batch=2, time=8, seed=9, **TINY)
    m.load_checkpoint(str(ck))
    assert torch.equal(m.encoder.detach(), load_file(str(ck))["encoder"])

    data = ck.read_bytes()
    at = data.index(b'"step":"3"') + 8
    flipped = tmp_path / "flipped.safetensors"
    flipped.write_bytes(data[:at] + bytes([data[at] ^ 1]) + data[at + 1:])  # "3" -> "2"
    with pytest.raises(dragon.DragonError, match=r"flipped.safetensors: damaged: "):
        m.load_checkpoint(str(flipped))
    assert torch.equal(m.encoder.detach(), load_file(str(ck))["encoder"])  # untouched

    sd = load_file(str(ck))
    sd["lm_head"][0, 5] = float("nan")
    nan = tmp_path / "nan.safetensors"
    save_file({k: sd[k] for k in dragon.PARAMS}, str(nan))
    with pytest.raises(dragon.DragonError, match=r"lm_head\[5\] is nan"):
        m.load_checkpoint(str(nan))

    grads = tmp_path / "grads.safetensors"
    r = subprocess.run([prog, "eval", "--model", str(ck), "--cpu", "--batch", "1", "--time", "8", "--batches", "1",
                        "--grads", str(grads)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    with pytest.raises(dragon.DragonError, match="a gradients file"):
        m.load_checkpoint(str(grads))


def test_cpu_bdh_trains_with_torch_adamw_and_grads_accumulate():
    m = dt.BDH("w8a8", batch=2, time=8, seed=2, **TINY)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.1)
    idx, tgt = tokens(4)
    first = None
    for _ in range(30):
        loss = m(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad()
        first = first if first is not None else loss.item()
    assert loss.item() < first - 0.5, (first, loss.item())
    # two backwards without zero_grad add up, as any module's do
    m.eval()
    m(idx, tgt).backward()
    g1 = [p.grad.clone() for p in m.parameters()]
    m(idx, tgt).backward()
    for p, g in zip(m.parameters(), g1):
        assert torch.allclose(p.grad, 2 * g)
    with torch.no_grad():
        assert m(idx, tgt).requires_grad is False


@pytest.mark.parametrize("preset,tol", [("f32", 1e-6), ("w8a8", 3e-3)])
def test_the_example_follows_dragon_train(tmp_path, preset, tol):
    """examples/train_bdh.py (tiny, on the CPU) against `dragon train
    --cpu` of the same recipe, seed and text: the same batches, init,
    schedule and dropout, torch's AdamW and clip for dragon's, so the two
    losses agree step by step within the optimizers' rounding (f32: 5e-8
    over the 40 steps) and fall. A low-bit recipe amplifies that rounding
    where a code flips (w8a8: about 1e-4 by step 40)."""
    prog = os.environ.get("DRAGON") or os.path.join(os.path.dirname(dragon.library_path()), "dragon")
    if not os.path.isfile(prog):
        pytest.skip("no dragon program beside the library (%s)" % prog)
    import random

    random.seed(1)
    words = open(os.path.join(os.path.dirname(PKG), "README.md")).read().split()
    text = tmp_path / "text.txt"
    text.write_text(" ".join(random.choice(words) for _ in range(20000)))
    common = ["--preset", preset, "--steps", "40", "--batch", "2", "--time", "16", "--seed", "5", "--data", str(text)]
    ex = subprocess.run([sys.executable, os.path.join(PKG, "examples", "train_bdh.py"), *common, "--size", "tiny",
                         "--lr", "3e-3", "--log", str(tmp_path / "ex.jsonl")], capture_output=True, text=True,
                        timeout=300, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert ex.returncode == 0, ex.stderr
    assert "val " in ex.stdout
    dr = subprocess.run([prog, "train", *common, "--cpu", "--layers", "2", "--embd", "32", "--heads", "2",
                         "--neurons", "64", "--lr", "3e-3", "--eval-batches", "2", "--out", str(tmp_path / "run")],
                        capture_output=True, text=True, timeout=300)
    assert dr.returncode == 0, dr.stderr
    import json

    got = [json.loads(l) for l in open(tmp_path / "ex.jsonl")]
    want = [json.loads(l) for l in open(tmp_path / "run" / "log.jsonl")]
    assert len(got) == len(want) == 40
    for g, w in zip(got, want):
        assert abs(g["lr"] - w["lr"]) <= 1e-6 * w["lr"], (g, w)
        assert abs(g["train_loss"] - w["train_loss"]) <= tol * w["train_loss"], (g, w)
    assert got[-1]["train_loss"] < got[0]["train_loss"] - 0.5


def test_the_kernels_of_a_low_bit_step_compile():
    """The kernels a w8a8 and a bitnet layer of the ops launch (projection
    forward and backward, decoder, attention, at BDH's per-head shapes),
    compiled for an H200 by NVRTC here, as the JIT will on first use."""
    x = torch.randn(2, 1, 64, 256, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(4, 512, 256, requires_grad=True)
    y = torch.rand(2, 4, 64, 512, dtype=torch.bfloat16, requires_grad=True)
    d = torch.randn(256, 4 * 512, requires_grad=True)
    v = torch.randn(2, 1, 64, 256, dtype=torch.bfloat16, requires_grad=True)
    with dt.check_only(compile=True):
        for weight in ("int8", "ternary"):
            dt.projection(x, w, weight=weight, relu=0.0).float().sum().backward()
            dt.decoder(y, d, weight=weight).sum().backward()
        dt.attention(y, v).float().sum().backward()
    assert len(dt._call._compiled) >= 10
