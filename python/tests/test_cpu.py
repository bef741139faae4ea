"""The package without a GPU: import, the library's discovery, dragon's
messages as exceptions, every op's wiring (specs, shapes, formats) passing
dragon's checks in check_only mode, the projection's ReLU arguments, the
argument checks. (The model: test_bdh_cpu.py; the install and the names:
test_package.py.)"""
import os
import subprocess
import sys

import pytest
import torch

import dragon_bdh
import dragon_bdh.torch as dt

PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_py(code, timeout_s=120, argv=(), **env):
    e = dict(os.environ)
    e.update(env)
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=e,
                          timeout=timeout_s)


def test_import_needs_no_torch_and_no_gpu():
    r = run_py("import sys; sys.modules['torch'] = None\nimport dragon_bdh\n"
               "s = dragon_bdh.Spec('op=lowrank_fwd;weight=ternary;act=int8;relu=0')\n"
               "print(s.text); print(dragon_bdh.device_count() >= 0)")
    assert r.returncode == 0, r.stderr
    assert "op=lowrank_fwd" in r.stdout and "weight=ternary" in r.stdout


def test_library_found_and_a_bad_dragon_lib_named():
    assert os.path.isfile(dragon_bdh.library_path())
    r = run_py("import dragon_bdh; dragon_bdh.Spec('op=lowrank_fwd')", DRAGON_LIB="/nonexistent/libdragon.so")
    assert r.returncode != 0
    assert "libdragon not found" in r.stderr and "/nonexistent/libdragon.so" in r.stderr


def test_corpus_refuses_what_is_not_a_file(tmp_path):
    """A directory or a FIFO as a corpus: dragon's line naming it, at once
    (a FIFO is not waited on; the child is given 60 s)."""
    fifo = tmp_path / "c.fifo"
    os.mkfifo(fifo)
    for path, what in ((tmp_path, "a directory"), (fifo, "a FIFO")):
        r = run_py("import sys, dragon_bdh\n"
                   "try:\n    dragon_bdh.Corpus(sys.argv[1])\n"
                   "except dragon_bdh.DragonError as e:\n    print(e)\n", timeout_s=60, argv=[str(path)])
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

    monkeypatch.setattr(dragon_bdh.Device, "get", staticmethod(lambda i: FakeDevice()))
    for handle in (0, 0x7F00DEAD):
        monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None, h=handle: FakeStream(h))
        dt._call.device(torch.device("cuda", 0))
    assert seen == [dragon_bdh.Device.LEGACY_STREAM, 0x7F00DEAD]
    assert dragon_bdh.Device.LEGACY_STREAM == 1  # the driver's CU_STREAM_LEGACY


def test_spec_errors_are_dragons_messages():
    with pytest.raises(dragon_bdh.InvalidSpec, match="latent=8190"):
        dragon_bdh.Spec("op=lowrank_fwd;latent=8190")
    with pytest.raises(dragon_bdh.InvalidSpec, match="frob"):
        dragon_bdh.Spec("op=frob")
    s = dragon_bdh.Spec("op=decoder_fwd;heads=2;embd=32;latent=64")
    assert [a["name"] for a in s.args(b=2, t=3)] == ["y", "w", "out"]
    assert s.args(b=2, t=3)[2]["shape"] == (2, 1, 3, 32)


def test_spec_plans_without_a_device():
    p = dragon_bdh.Spec("op=lowrank_fwd;weight=ternary;act=int8;relu=0").plan(90)
    assert p["path"] and "tile=" in p["canonical"] and "tile=auto" not in p["canonical"]
    with pytest.raises(dragon_bdh.InvalidSpec, match="48"):
        dragon_bdh.Spec("op=lowrank_fwd;tile=48x64x64/2x2/2").plan(90)


def test_no_device_says_why():
    if dragon_bdh.device_count():
        pytest.skip("a GPU is here")
    with pytest.raises(dragon_bdh.NoDevice) as e:
        dragon_bdh.Device(0)
    assert str(e.value)
    x = torch.randn(2, 1, 3, 32)
    w = torch.randn(2, 64, 32)
    with pytest.raises(dragon_bdh.InvalidArgument, match="expected a CUDA tensor"):
        dt.projection(x, w)


# B, Hin, T, E, H, L: the tiny shapes every op is wired at
B, T, E, H, L = 2, 5, 32, 2, 64


@pytest.mark.parametrize("weight", ["int8", "ternary", "sign1", "f32", "bf16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_projection_wiring_passes_dragons_checks(weight, dtype):
    x = torch.randn(B, 1, T, E, dtype=dtype, requires_grad=True)
    w = torch.randn(H, L, E, dtype=dtype, requires_grad=True)
    with dt.check_only():
        y = dt.projection(x, w, weight=weight)
        assert y.shape == (B, H, T, L) and y.dtype == dtype
        y.sum().backward()
        dt.projection(x.detach(), w.detach(), weight=weight, relu=False)
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


def test_projection_relu_is_a_bool_and_the_threshold_its_own(monkeypatch):
    """relu=True/False says whether a ReLU follows, threshold= what it
    subtracts: the spec's relu= (the forward's and the backward's mask)
    is the threshold, or none. The forms before 0.2 (relu=<threshold>,
    relu=None) still mean what they meant, with a DeprecationWarning; a
    threshold without a ReLU, or a relu that is not a bool, is refused."""
    import warnings

    from dragon_bdh.torch import ops

    texts = []
    real = ops.call
    monkeypatch.setattr(ops, "call", lambda text, *a, **k: (texts.append(text), real(text, *a, **k))[1])
    x = torch.randn(B, 1, T, E, requires_grad=True)
    w = torch.randn(H, L, E, requires_grad=True)

    def relu_of(**kw):
        del texts[:]
        with dt.check_only():
            ops.projection(x, w, weight="f32", **kw).sum().backward()
        fwd = [t for t in texts if t.startswith("op=lowrank_fwd")]
        mask = [t for t in texts if t.startswith("op=relu_mask")]
        assert len(fwd) == 1
        r = fwd[0].split("relu=")[1].split(";")[0]
        assert [m.split("relu=")[1].split(";")[0] for m in mask] == ([] if r == "none" else [r])
        return r

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the current forms do not warn
        assert relu_of() == "0.0"
        assert relu_of(relu=True, threshold=0.25) == "0.25"
        assert relu_of(relu=False) == "none"
    with pytest.warns(DeprecationWarning, match="relu=True, threshold=0.0"):
        assert relu_of(relu=0.0) == "0.0"
    with pytest.warns(DeprecationWarning, match="relu=True, threshold=0.5"):
        assert relu_of(relu=0.5) == "0.5"
    with pytest.warns(DeprecationWarning, match="relu=False"):
        assert relu_of(relu=None) == "none"
    with pytest.raises(dragon_bdh.InvalidArgument, match="without a ReLU"):
        ops.projection(x, w, relu=False, threshold=0.5)
    with pytest.raises(dragon_bdh.InvalidArgument, match="True or False"):
        ops.projection(x, w, relu="yes")


def test_bad_arguments_are_refused_by_name():
    x = torch.randn(B, 1, T, E)
    with dt.check_only():
        with pytest.raises(dragon_bdh.InvalidArgument, match=r"w: expected .*\(2, 64, 32\)|w.*31"):
            dt._call.call("op=lowrank_fwd;heads=2;in_heads=1;embd=32;latent=64;weight=f32;act=f32;out=f32;relu=0",
                          [dt._call.ffi_tensor("x", x, "f32"),
                           dt._call.ffi_tensor("w", torch.randn(H, L, 31), "f32"),
                           dt._call.ffi_tensor("out", torch.empty(B, H, T, L), "f32")], x)
        with pytest.raises(dragon_bdh.InvalidArgument, match="float32 or bfloat16"):
            dt.projection(x.to(torch.int32), torch.randn(H, L, E))
        with pytest.raises(dragon_bdh.InvalidArgument, match="contiguous"):
            xt = torch.randn(B, 1, E, T).transpose(2, 3)
            dt._call.call("op=lowrank_fwd;heads=2;in_heads=1;embd=32;latent=64;weight=f32;act=f32;out=f32;relu=0",
                          [dt._call.ffi_tensor("x", xt, "f32"), dt._call.ffi_tensor("w", torch.randn(H, L, E), "f32"),
                           dt._call.ffi_tensor("out", torch.empty(B, H, T, L), "f32")], x)
        with pytest.raises(dragon_bdh.InvalidArgument, match="weight 'fp4'"):
            dt.projection(x, torch.randn(H, L, E), weight="fp4")
        with pytest.raises(dragon_bdh.InvalidArgument, match="expected a torch.int8 tensor"):
            dt._call.ffi_tensor("codes", torch.zeros(4, dtype=torch.uint8), "int8")


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
            dt.projection(x, w, weight=weight).float().sum().backward()
            dt.decoder(y, d, weight=weight).sum().backward()
        dt.attention(y, v).float().sum().backward()
    assert len(dt._call._compiled) >= 10


# ---- prepared ops: the cache in front of dg_ffi_op_prepare ------------------------------

QA = "op=quantize_act;src=f32;act=int8;ascale=token"


def _qa_tensors(rows, cols=64):
    """quantize_act's tensors on the CPU as FfiTensors (ffi_tensor takes
    CPU tensors inside check_only), with the torch tensors they point at."""
    from dragon_bdh.torch import _call

    x = torch.randn(1, 1, rows, cols)
    codes = torch.empty(1, 1, rows, cols, dtype=torch.int8)
    scale = torch.empty(rows)
    with dt.check_only():
        ts = [_call.ffi_tensor("x", x, "f32"), _call.ffi_tensor("codes", codes, "int8", scale)]
    return ts, (x, codes, scale)


class _FakeDevice:
    ordinal = 0
    handle = None

    def check(self, code):
        assert code == 0


def test_a_second_call_of_a_shape_only_launches(monkeypatch):
    """The op is prepared once a shape: a second call of the same shape
    launches the kept handle (the library's prepare and launch stood in
    for, no GPU), another shape prepares again, clear_prepared lets go
    of the handles and each is destroyed once."""
    import ctypes

    from dragon_bdh import _lib
    from dragon_bdh.torch import _call

    L = _lib.lib()
    log = {"prepare": 0, "run": [], "destroy": []}
    handles = iter(range(0x1000, 0x2000, 0x10))

    def prepare(dev, spec, arr, n, opts, out, msg, size):
        log["prepare"] += 1
        ctypes.cast(out, ctypes.POINTER(ctypes.c_void_p))[0] = next(handles)
        return 0

    def run(h, arr, n, opts, msg, size):
        log["run"].append((h, arr[1].data))
        return 0

    monkeypatch.setattr(L, "dg_ffi_op_prepare", prepare)
    monkeypatch.setattr(L, "dg_ffi_prepared_run", run)
    monkeypatch.setattr(L, "dg_prepared_workspace", lambda h: 0)
    monkeypatch.setattr(L, "dg_prepared_destroy", lambda h: log["destroy"].append(h))
    monkeypatch.setattr(_call, "device", lambda tdev: _FakeDevice())
    _call.clear_prepared()
    before = _call.prepared_stats()

    a, keep_a = _qa_tensors(6)
    b, keep_b = _qa_tensors(6)  # the same shape, other memory
    c, keep_c = _qa_tensors(8)
    _call.call(QA, a, keep_a[0])
    _call.call(QA, b, keep_b[0])
    assert log["prepare"] == 1, "the second call of the shape prepared again"
    assert [r[1] for r in log["run"]] == [a[1].data, b[1].data] and log["run"][0][0] == log["run"][1][0]
    _call.call(QA, c, keep_c[0])
    assert log["prepare"] == 2 and log["run"][2][0] != log["run"][0][0]
    _call.call(QA, a, keep_a[0], accumulate=True)  # an option a prepare reads: another op
    assert log["prepare"] == 3
    st = _call.prepared_stats()
    assert st["prepares"] - before["prepares"] == 3 and st["launches"] - before["launches"] == 4
    assert st["kept"] == 3
    _call.clear_prepared()
    import gc

    gc.collect()
    assert sorted(log["destroy"]) == sorted({r[0] for r in log["run"]}), "each handle destroyed once"
    assert _call.prepared_stats()["kept"] == 0


def test_the_kept_prepared_ops_are_bounded(monkeypatch):
    import ctypes

    from dragon_bdh import _lib
    from dragon_bdh.torch import _call

    L = _lib.lib()
    destroyed = []
    handles = iter(range(0x1000, 0x9000, 0x10))

    def prepare(dev, spec, arr, n, opts, out, msg, size):
        ctypes.cast(out, ctypes.POINTER(ctypes.c_void_p))[0] = next(handles)
        return 0

    monkeypatch.setattr(L, "dg_ffi_op_prepare", prepare)
    monkeypatch.setattr(L, "dg_ffi_prepared_run", lambda *a: 0)
    monkeypatch.setattr(L, "dg_prepared_workspace", lambda h: 0)
    monkeypatch.setattr(L, "dg_prepared_destroy", destroyed.append)
    monkeypatch.setattr(_call, "device", lambda tdev: _FakeDevice())
    monkeypatch.setattr(_call, "PREPARED_MAX", 4)
    _call.clear_prepared()
    for rows in range(1, 11):
        ts, keep = _qa_tensors(rows)
        _call.call(QA, ts, keep[0])
    import gc

    gc.collect()
    assert _call.prepared_stats()["kept"] == 4 and len(destroyed) == 6
    _call.clear_prepared()


def test_prepare_without_a_device_fails_cleanly():
    """The library's prepare on a device that did not open: a right call
    is the device's failure, a wrong one refused by name first; nothing
    kept."""
    if dragon_bdh.device_count():
        pytest.skip("a GPU is here")
    import ctypes

    from dragon_bdh import _lib
    from dragon_bdh.torch import _call

    L = _lib.lib()
    h = ctypes.c_void_p()
    assert L.dg_device_open(ctypes.byref(h), None) != 0 and h
    d = dragon_bdh.Device.__new__(dragon_bdh.Device)
    d._h, d.ordinal = h, 0
    try:
        _call.clear_prepared()
        s = _call.spec(QA)
        ts, keep = _qa_tensors(6)
        arr = (_lib.FfiTensor * 2)(*ts)
        with pytest.raises(dragon_bdh.NoDevice) as e:
            _call.prepared(s, d, ts, arr, _lib.FfiOpts(), {})
        assert str(e.value)
        ts[1].shape[3] = 60
        arr = (_lib.FfiTensor * 2)(*ts)
        with pytest.raises(dragon_bdh.InvalidArgument, match="codes"):
            _call.prepared(s, d, ts, arr, _lib.FfiOpts(), {})
        assert _call.prepared_stats()["kept"] == 0
        # the door itself: a NULL handle's launch is refused with a message
        buf = _lib.msgbuf()
        assert L.dg_ffi_prepared_run(None, arr, 2, None, buf, _lib.MSG) != 0 and buf.value
    finally:
        L.dg_device_close(h)
