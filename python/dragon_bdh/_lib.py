"""libdragon through ctypes: finding it, its prototypes (dragon/ffi.h and
the few calls of dragon/runtime.h the package needs), and its statuses as
Python exceptions.

The library is looked for at run time, first found wins (nothing about
where the package was built is written into it):
  1. $DRAGON_LIB: the library file, or a folder holding libdragon.so (the
     only place looked at when it is set);
  2. the copy bundled in the package (dragon_bdh/_libs/libdragon.so): a
     wheel built from a tree whose library is built carries it
     (python/setup.py says where it looks);
  3. an installed one: `pkg-config --variable=libdir dragon`, then the
     linker's search path (ctypes.util.find_library);
  4. when the package is imported from a source tree itself
     (PYTHONPATH=python, not installed), that tree's build folders:
     build, build-test, build-gpu.
Nothing is loaded at `import dragon_bdh`; the first call that needs the
library loads it, and a missing one is one ImportError naming where it
looked and how to point the package at a library.
"""
import ctypes
import ctypes.util
import os
import subprocess
import threading

FFI_VERSION = 6
MSG = 1024  # bytes of a message buffer


class DragonError(RuntimeError):
    """A dragon call failed: .status is dragon's status name ("invalid
    argument", ...), the message is dragon's own line."""

    def __init__(self, message, status="internal error"):
        super().__init__(message)
        self.status = status


class InvalidArgument(DragonError, ValueError):
    """A tensor, shape, format or value dragon refuses (DG_ERR_INVALID_ARG)."""


class InvalidSpec(DragonError, ValueError):
    """A spec dragon refuses (DG_ERR_INVALID_SPEC, DG_ERR_PARSE)."""


class Unsupported(DragonError, NotImplementedError):
    """Something this build or machine does not do (DG_ERR_UNSUPPORTED)."""


class NoDevice(DragonError):
    """No CUDA driver or device (DG_ERR_NO_DEVICE): dragon runs everything
    but launches without one."""


_BY_STATUS = {
    "invalid argument": InvalidArgument,
    "invalid spec": InvalidSpec,
    "parse error": InvalidSpec,
    "unsupported": Unsupported,
    "no CUDA device": NoDevice,
}


class FfiTensor(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("fmt", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * 4),
        ("stride", ctypes.c_int64 * 4),
        ("data", ctypes.c_uint64),
        ("scale", ctypes.c_uint64),
    ]


class FfiOpts(ctypes.Structure):
    _fields_ = [
        ("ws", ctypes.c_uint64),
        ("ws_bytes", ctypes.c_uint64),
        ("absum", ctypes.c_uint64),
        ("bad", ctypes.c_uint64),
        ("grad_scale", ctypes.c_uint64),
        ("step_at", ctypes.c_uint64),
        ("ctl", ctypes.c_uint64),
        ("copy", ctypes.c_uint64),
        ("seed", ctypes.c_uint64),
        ("eps", ctypes.c_float),
        ("p", ctypes.c_float),
        ("step", ctypes.c_uint32),
        ("layer", ctypes.c_uint32),
        ("splits", ctypes.c_int32),
        ("accumulate", ctypes.c_int32),
        ("unpack", ctypes.c_int32),
        ("backward", ctypes.c_int32),
        ("decay", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("elem0", ctypes.c_uint64),
    ]


class FfiModelSizes(ctypes.Structure):
    _fields_ = [
        ("layers", ctypes.c_int32),
        ("embd", ctypes.c_int32),
        ("heads", ctypes.c_int32),
        ("neurons", ctypes.c_int32),
        ("vocab", ctypes.c_int32),
        ("dropout", ctypes.c_float),
    ]


class Corpus(ctypes.Structure):
    _fields_ = [
        ("bytes", ctypes.c_void_p),
        ("len", ctypes.c_size_t),
        ("train_len", ctypes.c_size_t),
        ("path", ctypes.c_char * 4096),
        ("vocab", ctypes.c_int),
        ("kind", ctypes.c_int),
        ("n_files", ctypes.c_int),
        ("n_val_files", ctypes.c_int),
        ("file_bytes", ctypes.c_uint64),
        ("split", ctypes.c_char * 160),
        ("files", ctypes.c_void_p),
    ]


SPEC_TEXT_MAX = 512  # DG_SPEC_TEXT_MAX


class BundleSummary(ctypes.Structure):
    _fields_ = [
        ("specs", ctypes.c_int64),
        ("dropped", ctypes.c_int64),
        ("kernels", ctypes.c_int64),
        ("cache_hits", ctypes.c_int64),
        ("wall_ms", ctypes.c_double),
        ("jobs", ctypes.c_int32),
        ("sm", ctypes.c_int32),
        ("step", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("device", ctypes.c_char * 128),
        ("failed", ctypes.c_char * SPEC_TEXT_MAX),
    ]


class CorpusOpts(ctypes.Structure):
    _fields_ = [("vocab", ctypes.c_int)]


class DeviceOpts(ctypes.Structure):
    _fields_ = [("ordinal", ctypes.c_int), ("jit", ctypes.c_void_p)]


_P = ctypes.c_void_p
_U64 = ctypes.c_uint64
_I32 = ctypes.c_int32
_SZ = ctypes.c_size_t
_STR = ctypes.c_char_p

# name: (restype, argtypes)
_PROTOS = {
    "dg_ffi_version": (ctypes.c_int, []),
    "dg_status_str": (_STR, [ctypes.c_int]),
    "dg_fmt_name": (_STR, [ctypes.c_int]),
    "dg_fmt_from_name": (ctypes.c_bool, [_STR, ctypes.POINTER(ctypes.c_int)]),
    "dg_device_count": (ctypes.c_int, [ctypes.POINTER(ctypes.c_int), _STR, _SZ]),
    "dg_device_open": (ctypes.c_int, [ctypes.POINTER(_P), ctypes.POINTER(DeviceOpts)]),
    "dg_device_close": (None, [_P]),
    "dg_device_errmsg": (_STR, [_P]),
    "dg_device_set_stream": (ctypes.c_int, [_P, _P]),
    "dg_device_sync": (ctypes.c_int, [_P]),
    "dg_ffi_spec_parse": (ctypes.c_int, [_STR, ctypes.POINTER(_P), _STR, _SZ]),
    "dg_ffi_spec_destroy": (None, [_P]),
    "dg_ffi_spec_text": (ctypes.c_int, [_P, _STR, _SZ]),
    "dg_ffi_spec_plan": (ctypes.c_int, [_P, _I32, _STR, _SZ, _STR, _SZ, _STR, _SZ]),
    "dg_ffi_spec_compile": (ctypes.c_int, [_P, _I32, ctypes.POINTER(_I32), _STR, _SZ]),
    "dg_ffi_op_args": (ctypes.c_int, [_P, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                      ctypes.POINTER(FfiTensor), ctypes.POINTER(_I32),
                                      ctypes.POINTER(_I32), ctypes.POINTER(_I32), _STR, _SZ]),
    "dg_ffi_op_check": (ctypes.c_int, [_P, ctypes.POINTER(FfiTensor), _I32, ctypes.POINTER(FfiOpts),
                                       _STR, _SZ]),
    "dg_ffi_op_prepare": (ctypes.c_int, [_P, _P, ctypes.POINTER(FfiTensor), _I32, ctypes.POINTER(FfiOpts),
                                         ctypes.POINTER(_P), _STR, _SZ]),
    "dg_ffi_prepared_run": (ctypes.c_int, [_P, ctypes.POINTER(FfiTensor), _I32, ctypes.POINTER(FfiOpts),
                                           _STR, _SZ]),
    "dg_prepared_workspace": (_SZ, [_P]),
    "dg_prepared_destroy": (None, [_P]),
    "dg_ffi_model_create": (ctypes.c_int, [_P, _STR, ctypes.POINTER(FfiModelSizes), _I32, _I32, _U64,
                                           ctypes.POINTER(_P), _STR, _SZ]),
    "dg_ffi_model_destroy": (None, [_P]),
    "dg_ffi_model_param": (ctypes.c_int, [_P, _I32, ctypes.POINTER(_STR), ctypes.POINTER(_I32),
                                          ctypes.c_int64 * 3, ctypes.POINTER(_U64), ctypes.POINTER(_U64)]),
    "dg_ffi_model_loss": (_U64, [_P]),
    "dg_ffi_model_bad": (_U64, [_P]),
    "dg_corpus_builtin": (ctypes.c_int, [ctypes.POINTER(ctypes.POINTER(Corpus)), _STR, _SZ]),
    "dg_corpus_open": (ctypes.c_int, [_STR, ctypes.POINTER(ctypes.POINTER(Corpus)), _STR, _SZ]),
    "dg_corpus_open_with": (ctypes.c_int, [_STR, ctypes.POINTER(CorpusOpts), ctypes.POINTER(ctypes.POINTER(Corpus)),
                                           _STR, _SZ]),
    "dg_corpus_digest": (ctypes.c_int, [ctypes.POINTER(Corpus), _STR, _STR, _SZ]),
    "dg_corpus_close": (None, [ctypes.POINTER(Corpus)]),
    "dg_corpus_check": (ctypes.c_int, [ctypes.POINTER(Corpus), ctypes.c_int, _STR, _SZ]),
    "dg_corpus_batch": (None, [ctypes.POINTER(Corpus), ctypes.c_bool, ctypes.POINTER(_U64), ctypes.c_int,
                               ctypes.c_int, _P, _P]),
    "dg_rng_seed": (None, [ctypes.POINTER(_U64), _U64]),
    "dg_model_file_check": (ctypes.c_int, [_P, _SZ, _STR, _STR, _SZ]),
    "dg_ffi_model_run": (ctypes.c_int, [_P, _U64, _U64, _I32, _U64, ctypes.c_uint32, _I32, _I32, _STR, _SZ]),
    "dg_ffi_model_forward": (ctypes.c_int, [_P, _U64, _U64, _I32, _I32, _I32, _U64, ctypes.c_uint32, _I32, _STR,
                                            _SZ]),
    "dg_ffi_model_backward": (ctypes.c_int, [_P, _STR, _SZ]),
    "dg_ffi_model_hidden": (ctypes.c_int, [_P, ctypes.POINTER(_U64), ctypes.POINTER(_I32), ctypes.c_int64 * 3]),
    "dg_ffi_model_logits": (ctypes.c_int, [_P, _U64, _I32, _U64, _STR, _SZ]),
    "dg_ffi_model_decode": (ctypes.c_int, [_P, _U64, _I32, _I32, _I32, _U64, _STR, _SZ]),
    "dg_ffi_bundle_build": (ctypes.c_int, [_STR, ctypes.POINTER(_STR), _I32, _STR, _I32, _I32, _STR, _I32, _STR,
                                           _I32, ctypes.POINTER(BundleSummary), _STR, _SZ]),
    "dg_ffi_bundle_default_specs": (ctypes.c_int, [_STR, _U64, ctypes.POINTER(_U64), ctypes.POINTER(_I32), _STR,
                                                   _SZ]),
    "dg_ffi_bundle_check": (ctypes.c_int, [_STR, _STR, _U64, ctypes.POINTER(_U64), ctypes.POINTER(_I32), _STR,
                                           _SZ]),
    "dg_sample_draw": (ctypes.c_int, [_P, ctypes.c_int, ctypes.c_double, ctypes.c_int, ctypes.POINTER(_U64),
                                      ctypes.POINTER(_I32), _STR, _SZ]),
}

_lock = threading.Lock()
_lib = None
_path = None
_status_names = {}


HERE = os.path.dirname(os.path.abspath(__file__))
BUNDLED = os.path.join(HERE, "_libs")  # where a wheel built from a built tree puts its copy


def _source_root():
    """The source tree the package is imported from (PYTHONPATH=python), or
    None for an installed package (its folder is not in a tree)."""
    root = os.path.dirname(os.path.dirname(HERE))
    return root if os.path.isfile(os.path.join(root, "include", "dragon", "ffi.h")) else None


def _in_dir(d):
    for name in ("libdragon.so", "libdragon.so.0", "libdragon.dylib"):
        p = os.path.join(d, name)
        if os.path.isfile(p):
            return p
    return None


def candidates():
    """Where the library is looked for, in order: a list of (what, path or
    None where there is none)."""
    out = []
    env = os.environ.get("DRAGON_LIB")
    if env:
        out.append(("$DRAGON_LIB=" + env, _in_dir(env) if os.path.isdir(env) else env))
        return out  # an explicit choice is the only one
    out.append(("the package's bundled copy (%s)" % BUNDLED, _in_dir(BUNDLED)))
    try:
        libdir = subprocess.run(["pkg-config", "--variable=libdir", "dragon"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
        if libdir:
            out.append(("pkg-config dragon (%s)" % libdir, _in_dir(libdir)))
    except (OSError, subprocess.SubprocessError):
        pass
    found = ctypes.util.find_library("dragon")
    out.append(("the linker's path", found))
    root = _source_root()
    for b in ("build", "build-test", "build-gpu") if root else ():
        out.append((os.path.join(root, b), _in_dir(os.path.join(root, b))))
    return out


def lib():
    """The loaded library (loaded at the first call)."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for what, path in candidates():
            if not path:
                tried.append(what + ": none")
                continue
            try:
                cand = ctypes.CDLL(path)
            except OSError as e:
                tried.append("%s: %s" % (path, e))
                continue
            if not hasattr(cand, "dg_ffi_version"):
                tried.append("%s: no dg_ffi_version (a libdragon older than the package)" % path)
                continue
            v = cand.dg_ffi_version()
            if v != FFI_VERSION:
                tried.append("%s: ffi version %d, the package speaks %d" % (path, v, FFI_VERSION))
                continue
            for name, (res, args) in _PROTOS.items():
                fn = getattr(cand, name)
                fn.restype = res
                fn.argtypes = args
            for code in range(64):
                s = cand.dg_status_str(code)
                if s:
                    _status_names[code] = s.decode()
            _lib, _path = cand, path
            return _lib
        raise ImportError("dragon_bdh: libdragon not found; set DRAGON_LIB to the library or its build folder "
                          "(DRAGON_LIB=build), install it (cmake --install build), or reinstall the package once "
                          "the library is built (pip install ./python bundles it). Looked in: "
                          + "; ".join(tried or ["nowhere"]))


def library_path():
    """The path of the loaded library (loading it)."""
    lib()
    return _path


def status_name(code):
    """dragon's name of status `code` ("invalid argument", ...)."""
    lib()
    return _status_names.get(code, "status %d" % code)


def error(code, message):
    """The exception for dragon status `code` with dragon's message."""
    name = status_name(code)
    cls = _BY_STATUS.get(name, DragonError)
    return cls(message or name, name)


def check(code, buf=None, what=None):
    """Raises for a non-zero status, with the message in buf (a ctypes
    string buffer) or `what`."""
    if code:
        msg = buf.value.decode(errors="replace") if buf is not None else (what or "")
        raise error(code, msg)


def msgbuf():
    """A buffer for dragon's one-line messages."""
    return ctypes.create_string_buffer(MSG)


_fmt_cache = {}


def fmt_code(name):
    """dg_fmt value of a format name ("int8", "ternary", ...)."""
    c = _fmt_cache.get(name)
    if c is None:
        out = ctypes.c_int(-1)
        if not lib().dg_fmt_from_name(name.encode(), ctypes.byref(out)):
            raise InvalidArgument("format '%s': not one of f32, bf16, int8, ternary, sign1, int4, "
                                  "uint8pos, i32" % name, "invalid argument")
        c = _fmt_cache[name] = out.value
    return c


def fmt_name(code):
    """The format name of a dg_fmt value."""
    return lib().dg_fmt_name(code).decode()
