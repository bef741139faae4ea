"""One op call on torch tensors: the spec (parsed once, cached), each
tensor checked for its dtype and device here and for its shape, format
and contiguity by dragon (its messages), outputs and workspaces allocated
by torch (the caching allocator, so torch.cuda.graph captures them), the
launch on torch.cuda.current_stream().

Each op is prepared once a shape (dg_ffi_op_prepare: the checks, the
kernels fetched, the launches laid out) and kept, keyed by its spec, its
device, its tensors' formats, shapes and strides and the options a
prepare reads; a call of that shape again only launches the prepared op
(dg_ffi_prepared_run compares the tensors and pointers with the prepared
ones). At most PREPARED_MAX are kept, the least recently used let go
first; clear_prepared() lets go of them all, prepared_stats() counts.

check_only(): a context in which calls run dragon's checks instead of
launching (CPU tensors allowed, outputs left as allocated) and ask the
template for each spec's plan on an H200 (what the JIT asks before it
compiles), so the wiring of every op is testable without a GPU.
"""
import collections
import contextlib
import ctypes
import threading

import torch

import dragon_bdh
from dragon_bdh import _lib

# the storage dtype of each dragon format, and its codes a storage element
STORAGE = {
    "f32": (torch.float32, 1),
    "bf16": (torch.bfloat16, 1),
    "int8": (torch.int8, 1),
    "int4": (torch.int8, 1),
    "uint8pos": (torch.uint8, 1),
    "ternary": (torch.int32, 16),
    "sign1": (torch.int32, 32),
    "i32": (torch.int32, 1),
}
FLOAT_FMT = {torch.float32: "f32", torch.bfloat16: "bf16"}

_state = threading.local()
_specs = {}
_planned = set()
_compiled = set()
_specs_lock = threading.Lock()


@contextlib.contextmanager
def check_only(compile=False):
    """Calls inside run dragon's checks and the template's plan only (no
    launch, no GPU needed); compile=True also compiles each kernel for an
    H200 with NVRTC (into the JIT's disk cache)."""
    old = getattr(_state, "check_only", False), getattr(_state, "compile", False)
    _state.check_only, _state.compile = True, compile
    try:
        yield
    finally:
        _state.check_only, _state.compile = old


def checking():
    """Whether this thread is inside check_only()."""
    return getattr(_state, "check_only", False)


def spec(text):
    """The parsed spec of text (cached: parsing is once per text)."""
    s = _specs.get(text)
    if s is None:
        with _specs_lock:
            s = _specs.get(text)
            if s is None:
                s = _specs[text] = dragon_bdh.Spec(text)
    return s


def float_fmt(t, what):
    """dragon's format name of float tensor t (f32, bf16), else InvalidArgument."""
    f = FLOAT_FMT.get(t.dtype)
    if f is None:
        raise dragon_bdh.InvalidArgument("%s: expected a float32 or bfloat16 tensor, got %s" % (what, t.dtype),
                                     "invalid argument")
    return f


def storage_shape(fmt, shape):
    """The torch shape holding a dragon tensor of fmt and logical shape."""
    dt, per = STORAGE[fmt]
    if per == 1:
        return tuple(shape)
    if shape[-1] % per:
        raise dragon_bdh.InvalidArgument("a %s tensor's last dimension (%d) must be a multiple of %d"
                                     % (fmt, shape[-1], per), "invalid argument")
    return tuple(shape[:-1]) + (shape[-1] // per,)


def empty(fmt, shape, like):
    """An empty torch tensor holding a dragon tensor of fmt and shape, on like's device."""
    dt, _ = STORAGE[fmt]
    return torch.empty(storage_shape(fmt, shape), dtype=dt, device=like.device)


def ffi_tensor(name, t, fmt, scale=None, logical=None):
    """The FfiTensor of torch tensor t holding dragon format fmt (t's dtype
    and device checked here; the rest is dragon's to check)."""
    dt, per = STORAGE[fmt]
    if t.dtype != dt:
        raise dragon_bdh.InvalidArgument("%s: expected a %s tensor (dragon %s), got %s" % (name, dt, fmt, t.dtype),
                                     "invalid argument")
    if not checking() and t.device.type != "cuda":
        raise dragon_bdh.InvalidArgument("%s: expected a CUDA tensor, got one on %s" % (name, t.device),
                                     "invalid argument")
    shape = tuple(logical) if logical is not None else (
        tuple(t.shape[:-1]) + (t.shape[-1] * per,) if t.dim() else ())
    f = _lib.FfiTensor()
    f.name = name.encode()
    f.fmt = _lib.fmt_code(fmt)
    f.ndim = len(shape)
    for i, e in enumerate(shape[:4]):
        f.shape[i] = e
    strides = ()
    if not t.is_contiguous():  # dragon names it ("not contiguous")
        strides = tuple(s * per if i == t.dim() - 1 else s for i, s in enumerate(t.stride()[:4]))
        for i, s in enumerate(strides):
            f.stride[i] = s
    f.data = t.data_ptr()
    if scale is not None:
        if scale.dtype != torch.float32:
            raise dragon_bdh.InvalidArgument("%s's scale: expected float32, got %s" % (name, scale.dtype),
                                         "invalid argument")
        if scale.device != t.device:
            raise dragon_bdh.InvalidArgument("%s's scale: on %s, the tensor on %s" % (name, scale.device, t.device),
                                         "invalid argument")
        f.scale = scale.data_ptr()
    f._sig = (f.fmt, len(shape), shape[:4], strides, f.data != 0, scale is not None)  # the key of its prepared op
    return f


def _device_of(ts):
    dev = None
    for t in ts:
        if t is None:
            continue
        if dev is None:
            dev = t.device
        elif t.device != dev:
            raise dragon_bdh.InvalidArgument("tensors on %s and %s: an op's tensors share one device" % (dev, t.device),
                                         "invalid argument")
    return dev


def device(tdev):
    """dragon's Device for a torch CUDA device, its stream set to torch's
    current one on this thread."""
    d = dragon_bdh.Device.get(tdev.index if tdev.index is not None else torch.cuda.current_device())
    # torch's default stream is handle 0, the legacy default stream: dragon's
    # NULL would be its own non-blocking stream, which never waits for torch
    d.set_stream(torch.cuda.current_stream(tdev).cuda_stream or dragon_bdh.Device.LEGACY_STREAM)
    return d


# ---- prepared ops -------------------------------------------------------------------

PREPARED_MAX = 512  # prepared ops kept (a BDH step at one shape uses a few dozen)

# the dg_ffi_opts fields a prepare reads (checks, or lays out launches by):
# by value; the optional pointers by whether they are given. The rest
# (seed, step, elem0: the dropout's draw) are the launch's alone.
_OPT_VALUES = ("eps", "p", "layer", "splits", "accumulate", "unpack", "backward", "decay")
_OPT_POINTERS = ("absum", "bad", "grad_scale", "step_at", "ctl", "copy")

_prepared = collections.OrderedDict()  # key -> Prepared, least recently used first
_prepared_lock = threading.Lock()
_counts = {"prepares": 0, "launches": 0, "let_go": 0}


class Prepared:
    """A dg_prepared op of one device and one shape of call; freed with
    the object (the library's handle holds no device memory)."""

    __slots__ = ("handle", "device", "ws_bytes", "_destroy")

    def __init__(self, device, handle):
        self.handle = handle
        L = _lib.lib()
        self.device, self._destroy = device, L.dg_prepared_destroy
        self.ws_bytes = L.dg_prepared_workspace(handle)

    def run(self, arr, n, o):
        """Launches it on the calling thread's stream (the device's)."""
        self.device.check(_lib.lib().dg_ffi_prepared_run(self.handle, arr, n, ctypes.byref(o), None, 0))

    def __del__(self):
        h, self.handle = self.handle, None
        if h:
            self._destroy(h)


def _tensor_sig(f):
    sig = getattr(f, "_sig", None)
    if sig is None:  # an FfiTensor made elsewhere (an optional one left out: all 0)
        nd = max(0, min(f.ndim, 4))
        sig = (f.fmt, f.ndim, tuple(f.shape[:nd]), tuple(f.stride[:nd]) if any(f.stride[:nd]) else (), f.data != 0,
               f.scale != 0)
    return sig


def prepared(s, d, tensors, arr, o, opts):
    """The prepared op of spec s on Device d for a call of these tensors
    (FfiTensor list, arr its ctypes array) and options (the dg_ffi_opts o
    was made from): kept from an earlier call of the same shape, else
    prepared now (dragon's checks: InvalidArgument naming the tensor)."""
    key = (s.text, d.ordinal, tuple(_tensor_sig(f) for f in tensors),
           tuple(opts.get(k, 0) for k in _OPT_VALUES), tuple(bool(opts.get(k)) for k in _OPT_POINTERS))
    with _prepared_lock:
        p = _prepared.get(key)
        if p is not None:
            _prepared.move_to_end(key)
            return p
    h = ctypes.c_void_p()
    d.check(_lib.lib().dg_ffi_op_prepare(d.handle, s.handle, arr, len(tensors), ctypes.byref(o),
                                         ctypes.byref(h), None, 0))
    p = Prepared(d, h.value)
    with _prepared_lock:
        kept = _prepared.get(key)  # another thread prepared it meanwhile: one is kept, p freed
        if kept is not None:
            return kept
        _prepared[key] = p
        _counts["prepares"] += 1
        while len(_prepared) > PREPARED_MAX:
            _prepared.popitem(last=False)  # freed once no call holds it
            _counts["let_go"] += 1
    return p


def clear_prepared():
    """Lets go of every prepared op (each freed once no call holds it)."""
    with _prepared_lock:
        _counts["let_go"] += len(_prepared)
        _prepared.clear()


def prepared_stats():
    """{"prepares": ops prepared, "launches": prepared launches, "kept":
    prepared ops held now, "let_go": those let go (the bound, clear_prepared)}."""
    with _prepared_lock:
        return dict(_counts, kept=len(_prepared))


def call(text, tensors, like, **opts):
    """Runs spec text's op on tensors (FfiTensor list in the op's order);
    opts are dg_ffi_opts fields. The op is prepared at the first call of
    a shape and launched from then on; a workspace is allocated here
    (torch) when the op asks for one."""
    s = spec(text)
    n = len(tensors)
    arr = (_lib.FfiTensor * max(n, 1))(*tensors)
    o = _lib.FfiOpts()
    for k, v in opts.items():
        setattr(o, k, int(v) if isinstance(v, bool) else v)
    if checking():
        buf = _lib.msgbuf()
        _lib.check(_lib.lib().dg_ffi_op_check(s.handle, arr, n, ctypes.byref(o), buf, _lib.MSG), buf)
        if s.text not in _planned:  # and the template takes it, as the runtime's JIT will ask (an H200)
            s.plan(90)
            _planned.add(s.text)
        if getattr(_state, "compile", False) and s.text not in _compiled:
            s.compile(90)
            _compiled.add(s.text)
        return
    d = device(like.device)
    p = prepared(s, d, tensors, arr, o, opts)
    ws = None
    if p.ws_bytes:
        ws = torch.empty(p.ws_bytes, dtype=torch.uint8, device=like.device)
        o.ws, o.ws_bytes = ws.data_ptr(), p.ws_bytes
    p.run(arr, n, o)
    _counts["launches"] += 1
    return ws  # the caller keeps it alive until the stream is past it (torch's allocator does)
