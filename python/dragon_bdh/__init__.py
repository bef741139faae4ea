"""dragon_bdh: dragon's low-bit BDH kernels and training step, from Python.

The package of the dragon toolchain (distribution dragon-bdh, import
name dragon_bdh; it was imported as `dragon` before 0.2, a name HPE's
dragonhpc installs too, so that name is no longer installed: write
`import dragon_bdh` where `import dragon` was, `dragon_bdh.torch` for
`dragon.torch`).

Pure Python over libdragon (ctypes; dragon/ffi.h). `import dragon_bdh`
needs neither torch nor a GPU; dragon_bdh.torch runs the ops and the BDH
model on torch tensors. Calls that need a GPU raise dragon_bdh.NoDevice
with dragon's reason when there is none. The library is found at run
time ($DRAGON_LIB, the package's bundled copy, an installed libdragon:
dragon_bdh._lib says in which order).

    import dragon_bdh
    dragon_bdh.device_count()             # 0 without a driver or device
    s = dragon_bdh.Spec("op=lowrank_fwd;weight=ternary;act=int8;relu=0")
    s.text, s.args(b=8, t=512)            # canonical text, the op's tensors
    dragon_bdh.build_bundle("kernels", specs=[s])  # a kernel bundle, no GPU needed
"""
import ctypes
import threading

from . import _lib
from ._dlpack import Buffer
from ._lib import DragonError, InvalidArgument, InvalidSpec, NoDevice, Unsupported

__all__ = ["Spec", "Device", "Model", "Buffer", "DragonError", "InvalidArgument", "InvalidSpec",
           "NoDevice", "Unsupported", "Corpus", "device_count", "library_path", "check_weights", "PRESETS",
           "PARAMS", "build_bundle", "check_bundle", "default_specs"]
__version__ = "0.2.0"

#: dragon's recipes (dg_model_preset): the GPU model runs f32, bf16, w8a8
#: and bitnet, the CPU model f32, w8a8 and bitnet; seed is kept for comparison.
PRESETS = ("f32", "bf16", "w8a8", "bitnet", "seed")
#: the model's parameters in dragon's order, as pathwaycom/bdh names them.
PARAMS = ("embed.weight", "encoder", "encoder_v", "decoder", "lm_head")


def library_path():
    """Where libdragon was loaded from (loading it)."""
    return _lib.library_path()


def device_count():
    """CUDA devices dragon sees: 0 without a driver or device (no error)."""
    n = ctypes.c_int(0)
    buf = _lib.msgbuf()
    _lib.check(_lib.lib().dg_device_count(ctypes.byref(n), buf, _lib.MSG), buf)
    return n.value


def no_device_reason():
    """Why there is no device ("" when there is one)."""
    n = ctypes.c_int(0)
    buf = _lib.msgbuf()
    _lib.lib().dg_device_count(ctypes.byref(n), buf, _lib.MSG)
    return "" if n.value else (buf.value.decode(errors="replace") or "no CUDA device")


class Spec:
    """A parsed spec (dragon's text form, "op=...;key=value"): the kernel
    an op call runs. Parsing checks it (InvalidSpec with dragon's line)."""

    def __init__(self, text):
        L = _lib.lib()
        h = ctypes.c_void_p()
        buf = _lib.msgbuf()
        _lib.check(L.dg_ffi_spec_parse(text.encode(), ctypes.byref(h), buf, _lib.MSG), buf)
        self._h = h
        out = ctypes.create_string_buffer(512)
        _lib.check(L.dg_ffi_spec_text(h, out, 512), what="spec text")
        self.text = out.value.decode()
        self.op = self.text.split(";")[0].split("=")[1]

    @property
    def handle(self):
        """The dg_spec handle (for dragon's calls through ctypes)."""
        return self._h

    def args(self, b=1, t=1, r=1):
        """The op's tensors at a call's B, T (or R): a list of dicts with
        name, fmt (format name), shape (None: any shape), output, optional."""
        L = _lib.lib()
        arr = (_lib.FfiTensor * 8)()
        out = (ctypes.c_int32 * 8)()
        opt = (ctypes.c_int32 * 8)()
        n = ctypes.c_int32(0)
        buf = _lib.msgbuf()
        _lib.check(L.dg_ffi_op_args(self._h, b, t, r, arr, out, opt, ctypes.byref(n), buf, _lib.MSG), buf)
        res = []
        for i in range(n.value):
            a = arr[i]
            res.append({"name": a.name.decode(), "fmt": _lib.fmt_name(a.fmt),
                        "shape": tuple(a.shape[d] for d in range(a.ndim)) if a.ndim else None,
                        "output": bool(out[i]), "optional": bool(opt[i])})
        return res

    def plan(self, sm=90):
        """The template's plan on a device of SM sm, as the runtime asks it
        before compiling (no device needed): {"path": "wgmma" | "mma.sync"
        | "simt" | ..., "canonical": the text with the tile resolved}.
        InvalidSpec with the template's line when it refuses the spec."""
        path, canon = ctypes.create_string_buffer(64), ctypes.create_string_buffer(512)
        buf = _lib.msgbuf()
        _lib.check(_lib.lib().dg_ffi_spec_plan(self._h, sm, path, 64, canon, 512, buf, _lib.MSG), buf)
        return {"path": path.value.decode(), "canonical": canon.value.decode()}

    def compile(self, sm=90):
        """Compiles the planned kernel for SM sm with NVRTC into the JIT's
        disk cache (no device needed); True when it was cached already."""
        hit = ctypes.c_int32(0)
        buf = _lib.msgbuf()
        _lib.check(_lib.lib().dg_ffi_spec_compile(self._h, sm, ctypes.byref(hit), buf, _lib.MSG), buf)
        return bool(hit.value)

    def check(self, tensors, opts=None):
        """dragon's checks of a call (FfiTensor array, in args() order)
        without a device; InvalidArgument naming the tensor."""
        L = _lib.lib()
        n = len(tensors)
        arr = (_lib.FfiTensor * max(n, 1))(*tensors)
        buf = _lib.msgbuf()
        _lib.check(L.dg_ffi_op_check(self._h, arr, n, ctypes.byref(opts) if opts else None, buf, _lib.MSG), buf)

    def __repr__(self):
        return "dragon_bdh.Spec(%r)" % self.text

    def __del__(self):
        h = getattr(self, "_h", None)
        if h and _lib._lib is not None:
            _lib._lib.dg_ffi_spec_destroy(h)
            self._h = None


class Device:
    """A GPU as dragon holds it: its primary context (the one torch uses),
    its JIT and kernel map. Device.get(i) is one per ordinal per process."""

    _open = {}
    _lock = threading.Lock()

    def __init__(self, ordinal=0):
        L = _lib.lib()
        h = ctypes.c_void_p()
        opts = _lib.DeviceOpts(ordinal, None)
        st = L.dg_device_open(ctypes.byref(h), ctypes.byref(opts))
        if st:
            msg = L.dg_device_errmsg(h).decode(errors="replace") if h else ""
            L.dg_device_close(h)
            raise _lib.error(st, msg or "device %d: cannot open" % ordinal)
        self._h, self.ordinal = h, ordinal

    @classmethod
    def get(cls, ordinal=0):
        """The process's one Device of ordinal (opened at the first call);
        NoDevice with dragon's reason where there is none."""
        with cls._lock:
            d = cls._open.get(ordinal)
            if d is None:
                d = cls._open[ordinal] = cls(ordinal)
            return d

    @property
    def handle(self):
        """The dg_device handle."""
        return self._h

    def errmsg(self):
        """dragon's message of the device's last error."""
        return _lib.lib().dg_device_errmsg(self._h).decode(errors="replace")

    def check(self, code):
        """Raises the exception of status `code` with the device's message."""
        if code:
            raise _lib.error(code, self.errmsg())

    LEGACY_STREAM = 1  # the driver's CU_STREAM_LEGACY (dragon/runtime.h DG_STREAM_LEGACY)

    def set_stream(self, cu_stream):
        """The calling thread's stream for dragon's launches: a CUstream as
        an int, Device.LEGACY_STREAM for the legacy default stream (what a
        framework's handle 0 is: torch's default stream), None for the
        device's own (non-blocking: it does not wait for other work)."""
        self.check(_lib.lib().dg_device_set_stream(self._h, ctypes.c_void_p(cu_stream) if cu_stream else None))

    def sync(self):
        """Waits for the device's work on the calling thread's stream."""
        self.check(_lib.lib().dg_device_sync(self._h))


class Model:
    """dragon's BDH model of a preset for batches of (B, T): on a Device,
    or on the CPU (device None: f32, w8a8, bitnet; the CPU model runs any
    (B, T), a GPU model the one it was made for). Its f32 masters and
    gradients are its own memory: `params` lists their names, shapes and
    addresses, buffer() wraps one for DLPack. dragon_bdh.torch.BDH is the
    nn.Module over it."""

    def __init__(self, preset="w8a8", batch=8, time=512, seed=1, device=None, layers=0, embd=0, heads=0,
                 neurons=0, vocab=0, dropout=None):
        L = _lib.lib()
        self.device = device
        sizes = _lib.FfiModelSizes(layers, embd, heads, neurons, vocab, -1.0 if dropout is None else dropout)
        h = ctypes.c_void_p()
        buf = _lib.msgbuf()
        st = L.dg_ffi_model_create(device.handle if device else None, preset.encode(), ctypes.byref(sizes),
                                   batch, time, seed, ctypes.byref(h), buf, _lib.MSG)
        _lib.check(st, buf)
        if device:  # the weights went up on dragon's stream; a consumer on another one waits for them
            device.sync()
        self._h, self.preset, self.batch, self.time = h, preset, batch, time
        self.params = []
        for p in range(len(PARAMS)):
            name = ctypes.c_char_p()
            nd = ctypes.c_int32()
            sh = (ctypes.c_int64 * 3)()
            mp, gp = ctypes.c_uint64(), ctypes.c_uint64()
            _lib.check(L.dg_ffi_model_param(h, p, ctypes.byref(name), ctypes.byref(nd), sh, ctypes.byref(mp),
                                            ctypes.byref(gp)), what="param %d" % p)
            self.params.append({"name": name.value.decode(), "shape": tuple(sh[i] for i in range(nd.value)),
                                "master": mp.value, "grad": gp.value})

    def _where(self):
        from ._dlpack import KDLCPU, KDLCUDA

        return (KDLCUDA, self.device.ordinal) if self.device else (KDLCPU, 0)

    def buffer(self, p, which="master"):
        """Param p's master or gradient ("grad") as a DLPack Buffer."""
        d = self.params[p]
        return Buffer(d[which], d["shape"], "float32", *self._where(), owner=self)

    def loss_buffer(self):
        """The last run's loss (one float32, shape ()) as a DLPack Buffer."""
        return Buffer(_lib.lib().dg_ffi_model_loss(self._h), (), "float32", *self._where(), owner=self)

    def bad_buffer(self):
        """The int32 flag a device-token run sets on a token outside the
        vocabulary (GPU models)."""
        if not self.device:
            return None
        return Buffer(_lib.lib().dg_ffi_model_bad(self._h), (), "int32", *self._where(), owner=self)

    def run(self, idx, targets, tokens_on_device=False, seed=0, step=0, train=True, backward=True):
        """One forward (and backward) at the model's (B, T): idx, targets
        the addresses of (B, T) int32 tokens, host memory unless
        tokens_on_device. The gradients are overwritten."""
        buf = _lib.msgbuf()
        st = _lib.lib().dg_ffi_model_run(self._h, idx, targets, int(tokens_on_device), seed, step, int(train),
                                        int(backward), buf, _lib.MSG)
        _lib.check(st, buf)

    def forward(self, idx, targets, b, t, tokens_on_device=False, seed=0, step=0, train=True):
        """The forward alone of a batch of (b, t) (the CPU model: any; a GPU
        model: its own), its activations kept for backward(): idx, targets
        the addresses of (b, t) int32 tokens (host memory unless
        tokens_on_device); targets 0: no loss (the CPU model only; a GPU
        model takes targets outside the vocabulary, which add nothing).
        The loss is at loss_buffer(), the last hidden state at hidden()."""
        buf = _lib.msgbuf()
        st = _lib.lib().dg_ffi_model_forward(self._h, idx, targets, b, t, int(tokens_on_device), seed, step,
                                            int(train), buf, _lib.MSG)
        _lib.check(st, buf)

    def backward(self):
        """The backward of the last forward(), its gradients overwritten;
        InvalidArgument saying why when there is none to run."""
        buf = _lib.msgbuf()
        _lib.check(_lib.lib().dg_ffi_model_backward(self._h, buf, _lib.MSG), buf)

    def hidden(self):
        """The last forward's last hidden state, (b, t, D) float32 or
        bfloat16, as a DLPack Buffer (valid until the next forward, run or
        backward)."""
        addr, fmt, sh = ctypes.c_uint64(), ctypes.c_int32(), (ctypes.c_int64 * 3)()
        _lib.check(_lib.lib().dg_ffi_model_hidden(self._h, ctypes.byref(addr), ctypes.byref(fmt), sh),
                   what="no forward has run: no hidden state")
        dtype = {"f32": "float32", "bf16": "bfloat16"}[_lib.fmt_name(fmt.value)]
        return Buffer(addr.value, tuple(sh), dtype, *self._where(), owner=self)

    @property
    def vocab(self):
        """The model's vocabulary V: token ids are 0..V-1 (embed.weight's rows)."""
        return self.params[0]["shape"][0]

    def logits(self, idx, pos):
        """The logits at position pos of every row of a (batch, time) batch
        of host int32 tokens (idx: their address): a ctypes float array
        of batch*vocab, row r at r*vocab. The forward alone, dropout off."""
        out = (ctypes.c_float * (self.batch * self.vocab))()
        buf = _lib.msgbuf()
        st = _lib.lib().dg_ffi_model_logits(self._h, idx, pos, ctypes.addressof(out), buf, _lib.MSG)
        _lib.check(st, buf)
        return out

    def decode(self, tokens, rows, n, restart):
        """Logits from a decoder state (no window; a token costs the same
        at any position; on a GPU model made from its masters as they are
        at the restart): restart True starts `rows` rows,
        row r with its n tokens tokens[r*n:(r+1)*n]; restart False adds one
        token a row (n 1) to the state made last. tokens: the address of
        host int32 tokens. A ctypes float array of rows*vocab, the logits
        after each row's last token, row r at r*vocab."""
        out = (ctypes.c_float * (rows * self.vocab))()
        buf = _lib.msgbuf()
        st = _lib.lib().dg_ffi_model_decode(self._h, tokens, rows, n, 1 if restart else 0, ctypes.addressof(out),
                                            buf, _lib.MSG)
        _lib.check(st, buf)
        return out

    def generate(self, prompt=None, length=200, temperature=0.8, top_k=40, seed=1337):
        """The tokens drawn after prompt, a list of `length` ints, as
        `dragon sample` draws them (the same weights and seed, the same
        tokens): each from the logits at the end of the context, every
        token so far (the model decodes from a state: no window), at a
        temperature (0 greedy) among the top_k most likely
        (dragon/sample.h). prompt: token ids (a list of ints), or for a
        byte model (vocab 256) bytes or str (UTF-8); None starts a byte
        model after a newline. A model of another vocabulary needs ids."""
        V = self.vocab
        if prompt is None or len(prompt) == 0:
            if V != 256:
                raise InvalidArgument("a vocabulary of %d, token ids: give the prompt as a list of ids" % V,
                                      "invalid argument")
            ctx = [10]
        elif isinstance(prompt, (bytes, bytearray, str)):
            if V != 256:
                raise InvalidArgument("a vocabulary of %d, token ids, not bytes: give the prompt as a list of "
                                      "ids" % V, "invalid argument")
            ctx = list(prompt.encode() if isinstance(prompt, str) else prompt)
        else:
            ctx = [int(t) for t in prompt]
            bad = [t for t in ctx if not 0 <= t < V]
            if bad:
                raise InvalidArgument("prompt: token %d is outside the vocabulary 0..%d" % (bad[0], V - 1),
                                      "invalid argument")
        L = _lib.lib()
        rng = ctypes.c_uint64(0)
        L.dg_rng_seed(ctypes.byref(rng), seed)
        return self._generate_state(ctx, length, temperature, top_k, rng)

    def _generate_state(self, ctx, length, temperature, top_k, rng):
        """generate() from a decoder state: the prompt prefilled, then a
        token at a time."""
        L, V = _lib.lib(), self.vocab
        tok = (ctypes.c_int32 * len(ctx))(*ctx)
        nxt = ctypes.c_int32()
        buf = _lib.msgbuf()
        out = []
        if length > 0:
            z = self.decode(ctypes.addressof(tok), 1, len(ctx), True)
        for i in range(length):
            _lib.check(L.dg_sample_draw(z, V, float(temperature), int(top_k), ctypes.byref(rng), ctypes.byref(nxt),
                                        buf, _lib.MSG), buf)
            out.append(nxt.value)
            if i + 1 < length:
                z = self.decode(ctypes.addressof(nxt), 1, 1, False)
        return out

    def __del__(self):
        h = getattr(self, "_h", None)
        if h and _lib._lib is not None:
            _lib._lib.dg_ffi_model_destroy(h)
            self._h = None


def check_weights(data, name="weights"):
    """Checks the bytes of a safetensors file of weights (a checkpoint,
    a weights file) as every reader of dragon's checks it before using a
    value of it (dg_model_file_check): that it is as it was written (its
    seal, file_sha256: the whole file's SHA-256, metadata included), that
    it is not gradients, and that its weights and AdamW moments are
    finite (the second moments not negative). Raises DragonError with
    dragon's message naming `name` ("<name>: damaged: ...",
    "<name>: lm_head[17] is nan: ...") otherwise."""
    buf = _lib.msgbuf()
    data = bytes(data)
    _lib.check(_lib.lib().dg_model_file_check(data, len(data), str(name).encode(), buf, _lib.MSG), buf)


class Corpus:
    """A training corpus as `dragon train --data PATH [--vocab V]` reads it
    (dragon/data.h): the built-in one (path None: $DRAGON_CORPUS or
    data/shakespeare.txt, its digest checked), a file of bytes (its first
    90% trains, the rest validates), llm.c's token shards (a shard, a
    glob, a comma list, a folder; the *_val_* shards validate) or raw
    uint16 tokens (a folder of train.bin and val.bin, or a file with a
    vocab other than 256); every token is checked below the vocabulary
    when it is opened. batch() draws `dragon train`'s batches (the same
    rows for the same seed, in the same order). size and train_size count
    tokens; vocab is the data's (256 for bytes)."""

    VAL_SEED = 0x76616C  # the validation batches' seed (the trainer's)

    def __init__(self, path=None, seed=1, vocab=0):
        L = _lib.lib()
        p = ctypes.POINTER(_lib.Corpus)()
        buf = _lib.msgbuf()
        if path is None:
            st = L.dg_corpus_builtin(ctypes.byref(p), buf, _lib.MSG)
        else:
            o = _lib.CorpusOpts(int(vocab))
            st = L.dg_corpus_open_with(str(path).encode(), ctypes.byref(o), ctypes.byref(p), buf, _lib.MSG)
        _lib.check(st, buf)
        self._c = p
        self.path = p.contents.path.decode()
        self.size, self.train_size = p.contents.len, p.contents.train_len
        self.vocab, self.split = p.contents.vocab, p.contents.split.decode()
        self._rng = ctypes.c_uint64(0)
        L.dg_rng_seed(ctypes.byref(self._rng), seed)
        self._val = ctypes.c_uint64(0)

    def batch(self, b, t, val=False):
        """(idx, targets): two lists of b*t int32 tokens (row-major), or
        numpy-free buffers for torch.frombuffer: ctypes int32 arrays."""
        L = _lib.lib()
        buf = _lib.msgbuf()
        _lib.check(L.dg_corpus_check(self._c, t, buf, _lib.MSG), buf)
        idx = (ctypes.c_int32 * (b * t))()
        tgt = (ctypes.c_int32 * (b * t))()
        L.dg_corpus_batch(self._c, bool(val), ctypes.byref(self._val if val else self._rng), b, t, idx, tgt)
        return idx, tgt

    def digest(self):
        """The corpus's digest (hex): what a checkpoint of a run on it records."""
        buf = _lib.msgbuf()
        hx = ctypes.create_string_buffer(65)
        _lib.check(_lib.lib().dg_corpus_digest(self._c, hx, buf, _lib.MSG), buf)
        return hx.value.decode()

    def val_batches(self, n, b, t):
        """The trainer's n fixed validation batches."""
        L = _lib.lib()
        self._val = ctypes.c_uint64(0)
        L.dg_rng_seed(ctypes.byref(self._val), self.VAL_SEED)
        return [self.batch(b, t, val=True) for _ in range(n)]

    def __del__(self):
        c = getattr(self, "_c", None)
        if c and _lib._lib is not None:
            _lib._lib.dg_corpus_close(c)
            self._c = None


# ---- bundles ------------------------------------------------------------------------

#: dg_bundle_step's names: where a failed build stopped (DragonError.step).
BUNDLE_STEPS = ("", "args", "plan", "folder", "compile", "publish")


def _spec_lines(call):
    """The spec texts a call writes one a line into a buffer (it says the
    size it needs when the buffer is short)."""
    size = 1 << 16
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        need, n = ctypes.c_uint64(0), ctypes.c_int32(0)
        msg = _lib.msgbuf()
        st = call(buf, size, ctypes.byref(need), ctypes.byref(n), msg, _lib.MSG)
        if st == 0:
            return buf.value.decode().splitlines()
        if need.value <= size:
            _lib.check(st, msg)
        size = need.value
    raise DragonError("the spec list grew while it was read", "internal error")


def default_specs():
    """The default build set (dg_bundle_default_specs): the canonical texts
    of every kernel of a BDH training step, forward and backward, at the op
    table's build lists, tiles auto. What build_bundle builds without specs."""
    return _spec_lines(_lib.lib().dg_ffi_bundle_default_specs)


def check_bundle(path):
    """A bundle folder through dragon's reader: manifest.json read and
    every file it lists checked against it (size, SHA-256, the cubin's
    SM). Returns its kernels' specs (canonical texts, tiles resolved);
    otherwise raises DragonError naming the file (status "not found"
    without a manifest or with a listed file missing)."""
    L = _lib.lib()
    return _spec_lines(lambda *a: L.dg_ffi_bundle_check(str(path).encode(), *a))


def build_bundle(path, specs=None, device=None, sm=0, jobs=0, cache_dir=None, no_cache=False, tune_db=None,
                 tuned=False):
    """Compiles kernels into a bundle folder at path, as `dragon-gen build`
    does (dg_bundle_build; no GPU needed): specs (spec texts or Spec
    objects; None: the default build set, default_specs()), each auto
    tile resolved as the runtime resolves it on the device the bundle is
    for: device None, for each spec's SM the one device the tuning
    records name; "" none (the templates' defaults); or a name with its
    sm (90 for an H200). jobs: kernels compiled at a time (0: the CPUs);
    cache_dir, no_cache: the kernel cache; tune_db: the tuning records (a
    file or folder, "builtin", "none"; None: $DRAGON_TUNE_DB, else the
    cache's); tuned: copy the records used into the bundle. The folder
    changes only if every kernel builds. Returns a dict: specs, dropped,
    kernels, cache_hits, compiled, jobs, wall_ms, device, sm. On failure
    DragonError with dragon's message, .step where it stopped
    (BUNDLE_STEPS) and .failed the spec of a kernel that failed ("")."""
    L = _lib.lib()
    arr, n = None, 0
    if specs is not None:
        texts = [s.text if isinstance(s, Spec) else str(s) for s in specs]
        n = len(texts)
        arr = (ctypes.c_char_p * max(n, 1))(*[t.encode() for t in texts])

    def enc(v):
        return None if v is None else str(v).encode()

    summ = _lib.BundleSummary()
    buf = ctypes.create_string_buffer(8192)
    st = L.dg_ffi_bundle_build(str(path).encode(), arr, n, enc(device), int(sm), int(jobs), enc(cache_dir),
                               int(bool(no_cache)), enc(tune_db), int(bool(tuned)), ctypes.byref(summ), buf,
                               len(buf))
    if st:
        e = _lib.error(st, buf.value.decode(errors="replace"))
        e.step = BUNDLE_STEPS[summ.step] if 0 <= summ.step < len(BUNDLE_STEPS) else str(summ.step)
        e.failed = summ.failed.decode()
        raise e
    return {"specs": summ.specs, "dropped": summ.dropped, "kernels": summ.kernels,
            "cache_hits": summ.cache_hits, "compiled": summ.kernels - summ.cache_hits, "jobs": summ.jobs,
            "wall_ms": summ.wall_ms, "device": summ.device.decode(), "sm": summ.sm}
