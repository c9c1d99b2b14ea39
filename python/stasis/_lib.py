"""Loading libstasis.so and calling it: the ctypes side of the C ABI
(capi/stasis.h), its error codes as exceptions, and the store handles."""

import ctypes
import json
import os
import threading

ABI_VERSION = 1  # STASIS_ABI_VERSION of the stasis.h this package speaks

ASYNC = 1
FAIL_IF_BUSY = 2


class StasisError(RuntimeError):
    """A failure reported by libstasis; .code is its stasis_code."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code

    def __reduce__(self):
        # Picklable (torch.distributed gathers a rank's exception so).
        return (type(self), (self.code, str(self)))


class InvalidArgument(StasisError, ValueError):
    """A bad argument: job name, dtype, tensor name, JSON."""


class CheckpointNotFound(StasisError, LookupError):
    """No checkpoint matches the job, step or ID."""


class CorruptCheckpoint(StasisError):
    """Stored data or a manifest failed its checks."""


class Mismatch(StasisError, ValueError):
    """Buffers do not match their description or the checkpoint."""


class SaveInFlight(StasisError):
    """A save is still in flight and the call was asked not to wait."""


class JobIncomplete(StasisError):
    """A job checkpoint's ranks did not all save their part in time;
    nothing was listed."""


class LibraryError(ImportError):
    """libstasis.so is missing or of another ABI version."""


_ERRORS = {2: InvalidArgument, 3: CheckpointNotFound, 4: InvalidArgument,
           5: CorruptCheckpoint, 12: Mismatch, 13: SaveInFlight, 17: JobIncomplete}


class Error(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int32), ("message", ctypes.c_char * 1024)]


class Tensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_char_p),
                ("ndim", ctypes.c_int32), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("host", ctypes.c_void_p), ("device", ctypes.c_uint64),
                ("nbytes", ctypes.c_uint64)]


def _candidates():
    env = os.environ.get("STASIS_LIB")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    return [os.path.join(here, "libstasis.so"),  # installed beside the package
            os.path.normpath(os.path.join(here, "..", "..", "bin", "libstasis.so"))]  # the repository


def _load():
    tried = []
    for path in _candidates():
        if not os.path.exists(path):
            tried.append(path)
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise LibraryError(f"cannot load {path}: {e}") from None
        try:
            version = lib.stasis_abi_version()
        except AttributeError:
            raise LibraryError(f"{path} is not libstasis (no stasis_abi_version)") from None
        if version != ABI_VERSION:
            raise LibraryError(f"{path} has ABI version {version}, this package needs {ABI_VERSION}: "
                               "rebuild it with `make` in the same stasis checkout, or set STASIS_LIB")
        _declare(lib)
        return lib, path
    raise LibraryError("libstasis.so not found (looked at " + ", ".join(tried) +
                       "): run `make` in the stasis repository, or set STASIS_LIB to its path")


def _declare(lib):
    u64, i64, i32, p = ctypes.c_uint64, ctypes.c_int64, ctypes.c_int, ctypes.c_char_p
    err = ctypes.POINTER(Error)
    out_json = ctypes.POINTER(ctypes.c_void_p)
    u64p = ctypes.POINTER(u64)
    tens = ctypes.POINTER(Tensor)
    sigs = {
        "stasis_version": ([], ctypes.c_char_p),
        "stasis_open": ([p, p, u64p, err], i32),
        "stasis_close": ([u64, err], i32),
        "stasis_prepare": ([u64, tens, ctypes.c_size_t, err], i32),
        "stasis_begin": ([u64, p, i64, u64p, err], i32),
        "stasis_add": ([u64, tens, ctypes.c_size_t, err], i32),
        "stasis_set_state": ([u64, p, err], i32),
        "stasis_set_compress": ([u64, p, err], i32),
        "stasis_set_io": ([u64, p, err], i32),
        "stasis_commit": ([u64, i32, u64p, out_json, err], i32),
        "stasis_discard": ([u64], None),
        "stasis_save_wait": ([u64, out_json, err], i32),
        "stasis_save_done": ([u64], i32),
        "stasis_save_times": ([u64, ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_double), err], i32),
        "stasis_save_release": ([u64], None),
        "stasis_find": ([u64, p, i64, out_json, err], i32),
        "stasis_set_part": ([u64, i32, i32, p, i64, i32, err], i32),
        "stasis_commit_job": ([u64, p, i64, i32, p, i64, p, out_json, err], i32),
        "stasis_job": ([u64, p, i64, out_json, err], i32),
        "stasis_find_for_rank": ([u64, p, i64, i32, i32, out_json, err], i32),
        "stasis_list": ([u64, p, out_json, err], i32),
        "stasis_describe": ([u64, p, out_json, err], i32),
        "stasis_load": ([u64, p, tens, ctypes.c_size_t, err], i32),
        "stasis_load_io": ([u64, p, tens, ctypes.c_size_t, p, err], i32),
        "stasis_free": ([ctypes.c_void_p], None),
    }
    for name, (args, res) in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res


_lock = threading.Lock()
_lib = None


def lib():
    """The loaded library (loaded on first use)."""
    global _lib
    with _lock:
        if _lib is None:
            _lib = _load()
        return _lib[0]


def library_path():
    lib()
    return _lib[1]


def call(fn, *args):
    """Calls fn(*args, &error) and raises the matching exception on failure."""
    e = Error()
    code = fn(*args, ctypes.byref(e))
    if code != 0:
        raise _ERRORS.get(code, StasisError)(code, e.message.decode("utf-8", "replace"))


def call_json(fn, *args):
    """Calls fn(*args, &json, &error) and returns the parsed JSON."""
    out = ctypes.c_void_p()
    call(fn, *args, ctypes.byref(out))
    try:
        return json.loads(ctypes.string_at(out.value).decode("utf-8"))
    finally:
        lib().stasis_free(out)


def _encode(s):
    return None if s is None else s.encode("utf-8")


class Store:
    """An open store: one libstasis store handle."""

    def __init__(self, home=None):
        self.home = home
        h = ctypes.c_uint64()
        call(lib().stasis_open, _encode(home), None, ctypes.byref(h))
        self.handle = h.value

    def close(self):
        if self.handle:
            h, self.handle = self.handle, 0
            call(lib().stasis_close, h)


_stores = {}


def store(home=None):
    """The store at home ($STASIS_HOME, else the default), opened once per
    process: one snapshot memory, and one save in flight at a time."""
    home = home or os.environ.get("STASIS_HOME") or None
    key = os.path.realpath(home) if home else None
    with _lock:
        s = _stores.get(key)
    if s is None:
        s = Store(home)
        with _lock:
            s = _stores.setdefault(key, s)
    return s


def encode_job(job):
    """A job name for the library: a non-empty str without NUL."""
    if not isinstance(job, str) or not job or "\0" in job:
        raise InvalidArgument(2, f"job must be a non-empty string without NUL characters, not {job!r}")
    return job.encode("utf-8")


def check_step(step):
    """A step for the library: an int from 0 to 2**63-1."""
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 1 << 63:
        raise InvalidArgument(2, f"step must be an int from 0 to 2**63-1, not {step!r}")
    return step
