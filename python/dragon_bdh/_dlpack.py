"""DLPack for memory dragon owns (a model's masters, gradients, loss): a
capsule torch.from_dlpack (or any DLPack consumer) takes without a copy.

The DLManagedTensor is built with ctypes; its deleter, called by the
consumer when its tensor dies, drops the reference that kept the owner
(the dragon object whose memory it is) alive. Unversioned DLPack (the
"dltensor" capsule), which every consumer reads.
"""
import ctypes

KDLCPU, KDLCUDA = 1, 2
_INT, _UINT, _FLOAT, _BFLOAT = 0, 1, 2, 4
DTYPES = {  # name: (code, bits)
    "float32": (_FLOAT, 32),
    "bfloat16": (_BFLOAT, 16),
    "int8": (_INT, 8),
    "uint8": (_UINT, 8),
    "int32": (_INT, 32),
}


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _Managed(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Managed))
_Managed._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]

_live = {}  # id -> (managed struct, shape array, owner): alive until the deleter runs


def _delete(p):
    _live.pop(ctypes.addressof(p.contents), None)


_deleter = _DELETER(_delete)

_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def capsule(data, shape, dtype, device_type, device_id, owner):
    """A "dltensor" capsule of contiguous memory at address `data`, of
    `shape` and dtype name `dtype`, on (device_type, device_id), keeping
    `owner` alive while the consumer holds it."""
    code, bits = DTYPES[dtype]
    m = _Managed()
    sh = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    m.dl_tensor.data = ctypes.c_void_p(data)
    m.dl_tensor.device = _Device(device_type, device_id)
    m.dl_tensor.ndim = len(shape)
    m.dl_tensor.dtype = _DType(code, bits, 1)
    m.dl_tensor.shape = ctypes.cast(sh, ctypes.POINTER(ctypes.c_int64))
    m.dl_tensor.strides = None  # compact row-major
    m.dl_tensor.byte_offset = 0
    m.manager_ctx = None
    m.deleter = _deleter
    _live[ctypes.addressof(m)] = (m, sh, owner)
    return _PyCapsule_New(ctypes.addressof(m), b"dltensor", None)


class Buffer:
    """dragon-owned memory as a DLPack producer (__dlpack__,
    __dlpack_device__): torch.from_dlpack(buf) is a tensor over it."""

    def __init__(self, data, shape, dtype, device_type, device_id, owner):
        self.data, self.shape, self.dtype = data, tuple(shape), dtype
        self.device_type, self.device_id, self.owner = device_type, device_id, owner

    def __dlpack_device__(self):
        return (self.device_type, self.device_id)

    def __dlpack__(self, stream=None):
        # dragon's buffers are written on the stream the caller ran the
        # model on; a consumer on another stream orders itself after it
        # (torch passes its current stream; nothing to wait for here).
        return capsule(self.data, self.shape, self.dtype, self.device_type, self.device_id, self.owner)

    def __repr__(self):
        return "dragon_bdh.Buffer(%s, %s, %s)" % (
            "cuda:%d" % self.device_id if self.device_type == KDLCUDA else "cpu", self.shape, self.dtype)
