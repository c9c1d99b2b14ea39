"""save, load, latest and list."""

import atexit
import ctypes
import json
import os
import sys
import threading
import weakref

from . import _lib, _state

# Every save handle the library gave out and not released yet: handle ->
# (weak reference to its SaveHandle, job, step). A save whose SaveHandle
# was dropped still runs; its handle is released once it is done (at the
# next save), and the process waits for every one at exit, so that a
# checkpoint begun is not lost because the interpreter ended. A failure
# nobody else can see any more is printed, and at exit it makes the
# process's status 1.
_open_saves = {}
_open_lock = threading.Lock()


def _finish_unwatched(h, job, step):
    """Waits for a save whose SaveHandle is gone and releases it; returns
    whether it succeeded, printing why not."""
    lib = _lib.lib()
    e = _lib.Error()
    code = lib.stasis_save_wait(h, None, ctypes.byref(e))
    lib.stasis_save_release(h)
    if code != 0:
        print(f"stasis: the asynchronous save of job {job!r} step {step} failed: "
              f"{e.message.decode('utf-8', 'replace')}", file=sys.stderr, flush=True)
    return code == 0


def _reap():
    """Releases the handles of finished saves nobody can wait for any more."""
    lib = _lib.lib()
    with _open_lock:
        gone = [(h, job, step) for h, (ref, job, step) in _open_saves.items()
                if ref() is None and lib.stasis_save_done(h) != 0]
        for h, _, _ in gone:
            del _open_saves[h]
    for h, job, step in gone:
        _finish_unwatched(h, job, step)


class SaveHandle:
    """A save: .wait() returns its record once durable and listed, .done()
    tells whether it has finished; both may be called from any thread. For
    an asynchronous save, .waited_s is how long it waited for the save
    before it and .snapshot_s how long copying the tensors out took."""

    def __init__(self, handle=0, record=None, job=None, step=None):
        self._handle = handle  # never reused by the library, even once released
        self._record = record
        self._error = None
        self._finished = threading.Event()
        self._lock = threading.Lock()
        self.waited_s = self.snapshot_s = None
        if not handle:
            self._finished.set()
            return
        waited, snapshot = ctypes.c_double(), ctypes.c_double()
        _lib.call(_lib.lib().stasis_save_times, handle, ctypes.byref(waited), ctypes.byref(snapshot))
        self.waited_s, self.snapshot_s = waited.value, snapshot.value
        with _open_lock:
            _open_saves[handle] = (weakref.ref(self), job, step)

    def done(self):
        if self._finished.is_set():
            return True
        # -1: the handle was released by a wait in another thread, which
        # happens only once the save has finished.
        return _lib.lib().stasis_save_done(self._handle) != 0

    def wait(self):
        """Blocks until the checkpoint is durable and listed; returns its
        record (a dict with id, job, step, ...). Raises what the save
        raised."""
        if not self._finished.is_set():
            record, error = None, None
            try:
                record = _lib.call_json(_lib.lib().stasis_save_wait, self._handle)
            except _lib.StasisError as e:
                error = e  # or the handle was released by another waiter: see below
            with self._lock:
                if not self._finished.is_set():
                    self._record, self._error = record, error
                    with _open_lock:
                        _open_saves.pop(self._handle, None)
                    _lib.lib().stasis_save_release(self._handle)
                    self._finished.set()
        if self._error is not None:
            raise self._error
        return self._record

    @property
    def id(self):
        return self.wait()["id"]


@atexit.register
def _wait_at_exit():
    with _open_lock:
        left = [(h, job, step) for h, (_, job, step) in _open_saves.items()]
        _open_saves.clear()
    ok = all([_finish_unwatched(h, job, step) for h, job, step in left])
    if not ok:
        sys.stdout.flush()
        os._exit(1)


def _ctypes_tensors(items):
    """A ctypes array of stasis_tensor for [(name, dtype, shape, host, device, nbytes)]
    and the objects that must stay alive while it is used."""
    arr = (_lib.Tensor * len(items))()
    keep = []
    for i, (name, dtype, shape, host, device, nbytes) in enumerate(items):
        n, d = name.encode("utf-8"), dtype.encode("utf-8")
        sh = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        keep += [n, d, sh]
        arr[i] = _lib.Tensor(n, d, len(shape), sh, host, device, nbytes)
    return arr, keep


def _synchronize(devices):
    torch = _state._torch()
    for dev in sorted(devices):
        if dev.startswith("cuda"):
            torch.cuda.synchronize(dev)


def _items(leaves):
    items = []
    for leaf in leaves:
        host, device = leaf.pointer()
        items.append((leaf.name, leaf.dtype, leaf.shape, host, device, leaf.nbytes))
    return items


def prepare(state, home=None):
    """Readies the snapshot memory for asynchronous saves of states like
    this one (the same tensor sizes; the values are not read): allocated
    now, and pinned (GPU states) or touched (host states) in the
    background, so that the first save stalls no longer than the later
    ones. Call it once before the first save, after the first optimizer
    step (optimizers create their state in their first step: prepared
    earlier, the memory would be too small and made again); without it,
    the first save pays for that memory (seconds for gigabytes)."""
    _, leaves = _state.flatten(state)
    s = _lib.store(home)
    arr, keep = _ctypes_tensors(_items(leaves))
    _lib.call(_lib.lib().stasis_prepare, s.handle, arr, len(leaves))
    del keep


def _world(rank, world_size):
    """(rank, world size) of this process: as given, else torch.distributed's
    when it is initialized, else $RANK and $WORLD_SIZE (torchrun); (None,
    None) for one process. srun's $SLURM_PROCID and $SLURM_NTASKS are not
    read: tasks of one srun may well be independent jobs, each saving its
    own checkpoint (a training script sets RANK and WORLD_SIZE from them
    when its ranks are one job)."""
    if rank is not None or world_size is not None:
        if rank is None or world_size is None:
            raise TypeError("give rank= and world_size= together")
        return int(rank), int(world_size)
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if os.environ.get("RANK") and os.environ.get("WORLD_SIZE"):
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return None, None


_attempt_cache = []


def _attempt(attempt):
    """The key every rank of this run of the job shares, so that two runs
    reaching the same step never mix their parts: as given, else
    $STASIS_ATTEMPT, else one rank 0 draws and broadcasts through
    torch.distributed (once per process), else the scheduler's job and
    restart count (SLURM, torchrun), else "0"."""
    if attempt is not None:
        return str(attempt)
    if os.environ.get("STASIS_ATTEMPT"):
        return os.environ["STASIS_ATTEMPT"]
    if _attempt_cache:
        return _attempt_cache[0]
    dist = sys.modules.get("torch.distributed")
    key = None
    if dist is not None and dist.is_available() and dist.is_initialized():
        import uuid
        box = [uuid.uuid4().hex if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(box, src=0)
        key = box[0]
    elif os.environ.get("SLURM_JOB_ID"):
        key = f"slurm-{os.environ['SLURM_JOB_ID']}.{os.environ.get('SLURM_RESTART_COUNT', '0')}"
    elif os.environ.get("TORCHELASTIC_RUN_ID"):
        key = f"{os.environ['TORCHELASTIC_RUN_ID']}.{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    key = key or "0"
    _attempt_cache.append(key)
    return key


PART_NO_COMMIT = 1


def save(state, job, step, blocking=False, wait_if_busy=True, home=None, compress=None, io=None,
         rank=None, world_size=None, attempt=None, part_timeout=None, _no_commit=False):
    """Saves state (nested dicts, lists and tuples of torch tensors (CUDA or
    CPU), NumPy arrays, None, bool, int, float and str) as checkpoint `step`
    of `job`.

    blocking=False returns once every tensor is copied out (the snapshot):
    the training loop may then change or free its tensors; compression and
    writing go on in the background. blocking=True returns once the
    checkpoint is durable and listed. Either way the result is a SaveHandle.
    A save while another is in flight waits for it (wait_if_busy=False
    raises SaveInFlight instead). compress: "auto" (the default), "none",
    "zstd" or "s2". io: the I/O path of CUDA tensors in a blocking save,
    "auto", "cufile" or "pinned" (None: $STASIS_IO, else auto); an
    asynchronous save writes its host snapshot through stasis's own
    pipeline whatever the path.

    In a job of several ranks (rank= and world_size=, else taken from
    torch.distributed or $RANK/$WORLD_SIZE),
    each rank saves its own part and the checkpoint is one job checkpoint
    of every rank's part, listed only once all are durable: rank 0, after
    its own part, waits up to part_timeout seconds (default 600) for the
    others' and commits it (its handle's record is the job checkpoint's;
    a missing rank raises JobIncomplete). attempt: the key the ranks of
    this run share (see _attempt).
    """
    job_name, step = _lib.encode_job(job), _lib.check_step(step)
    rank, world_size = _world(rank, world_size)
    tree, leaves = _state.flatten(state)
    s = _lib.store(home)
    _reap()
    lib = _lib.lib()
    ck = ctypes.c_uint64()
    _lib.call(lib.stasis_begin, s.handle, job_name, step, ctypes.byref(ck))
    try:
        if compress is not None:
            _lib.call(lib.stasis_set_compress, ck.value, compress.encode("utf-8"))
        if io is not None:
            _lib.call(lib.stasis_set_io, ck.value, io.encode("utf-8"))
        if world_size is not None and (world_size > 1 or _no_commit):
            timeout_ms = 0 if part_timeout is None else max(1, int(part_timeout * 1000))
            _lib.call(lib.stasis_set_part, ck.value, rank, world_size, _attempt(attempt).encode("utf-8"), timeout_ms,
                      PART_NO_COMMIT if _no_commit else 0)
        items = _items(leaves)
        arr, keep = _ctypes_tensors(items)
        if items:
            _lib.call(lib.stasis_add, ck.value, arr, len(items))
        _lib.call(lib.stasis_set_state, ck.value, json.dumps({"tree": tree}).encode("utf-8"))
        _synchronize({leaf.device for leaf in leaves})
    except BaseException:
        lib.stasis_discard(ck.value)
        raise
    if blocking:
        record = _lib.call_json(lib.stasis_commit, ck.value, 0, None)
        del keep
        return SaveHandle(record=record)
    flags = _lib.ASYNC | (0 if wait_if_busy else _lib.FAIL_IF_BUSY)
    h = ctypes.c_uint64()
    _lib.call(lib.stasis_commit, ck.value, flags, ctypes.byref(h), None)
    del keep
    return SaveHandle(handle=h.value, job=job, step=step)


def _find(s, job, step, id, rank=None, world_size=None):
    lib = _lib.lib()
    if id is not None:
        if not isinstance(id, str) or not id or "\0" in id:
            raise _lib.InvalidArgument(2, f"id must be a non-empty string, not {id!r}")
        return _lib.call_json(lib.stasis_describe, s.handle, id.encode("utf-8"))
    if job is None:
        raise TypeError("load needs job= or id=")
    rank, world_size = _world(rank, world_size)
    rec = _lib.call_json(lib.stasis_find_for_rank, s.handle, _lib.encode_job(job), -1 if step is None else _lib.check_step(step),
                         -1 if rank is None else rank, 0 if world_size is None else world_size)
    return _lib.call_json(lib.stasis_describe, s.handle, rec["id"].encode("utf-8"))


def _torch_dtype(node):
    torch = _state._torch()
    return getattr(torch, node["type"])


def _allocate(node, device):
    """A new, empty tensor or array for a saved tensor node."""
    shape = node["shape"]
    if node["lib"] == "torch":
        torch = _state._torch()
        if torch is None:
            try:
                import torch
            except ImportError:
                raise _lib.Mismatch(12, f"{node['tensor']} was saved from torch; loading it needs torch") from None
        target = device if device is not None else node["device"]
        if str(target).startswith("cuda") and not torch.cuda.is_available():
            raise RuntimeError(f"{node['tensor']} was saved on {node['device']} and CUDA is not available here: "
                               "load with device='cpu'")
        return torch.empty(shape, dtype=_torch_dtype(node), device=target)
    import numpy as np
    return np.empty(shape, dtype=np.dtype(node["type"]))


def _check_target(node, obj, path):
    """Raises Mismatch when obj cannot receive the saved tensor node."""
    where = _state.path_text(path)
    if node["lib"] == "torch" and _state.is_torch_tensor(obj):
        got = str(obj.dtype).replace("torch.", "")
    elif _state.is_numpy_array(obj):
        got = obj.dtype.newbyteorder("<").str  # a big-endian target is converted
        if node["lib"] == "torch":
            raise _lib.Mismatch(12, f"{where}: the checkpoint has a torch tensor, into= has a NumPy array")
    elif _state.is_torch_tensor(obj):
        raise _lib.Mismatch(12, f"{where}: the checkpoint has a NumPy array, into= has a torch tensor")
    else:
        raise _lib.Mismatch(12, f"{where}: the checkpoint has a tensor, into= has {type(obj).__name__}")
    if got != node["type"] or list(obj.shape) != node["shape"]:
        raise _lib.Mismatch(12, f"{where}: the checkpoint has {node['type']}{node['shape']}, "
                                f"into= has {got}{list(obj.shape)}")


def _writable_view(obj, path):
    """(buffer to load into, whether it must be copied back into obj)."""
    if _state.is_torch_tensor(obj):
        if obj.is_contiguous():
            return obj, False
        return obj.contiguous(), True
    if not obj.flags.writeable:
        raise _lib.Mismatch(12, f"{_state.path_text(path)}: into= has a read-only NumPy array there")
    if obj.dtype.byteorder == ">":
        return obj.astype(obj.dtype.newbyteorder("<"), order="C"), True
    if obj.flags.c_contiguous:
        return obj, False
    return obj.copy(order="C"), True


def load(job=None, step=None, id=None, device=None, into=None, home=None, io=None, rank=None, world_size=None):
    """Loads a checkpoint: job's latest (or its `step`), or the one whose
    ID starts with `id`. Returns the state as it was saved.

    device=None puts torch tensors back on the device they were saved
    from; device='cuda', 'cuda:1' or 'cpu' puts them there (loaded
    straight into GPU memory). NumPy arrays stay NumPy arrays.
    into=STATE loads in place into the tensors and arrays of an existing
    state of the same structure (the first mismatch is named) and returns
    the saved structure holding those same objects.
    io: the I/O path of CUDA tensors, "auto", "cufile" (raw chunks read
    straight into them by cuFile and verified on the GPU) or "pinned"
    (None: $STASIS_IO, else auto).
    rank, world_size: in a job of several ranks (else taken as save takes
    them), job= loads this rank's part of the latest job checkpoint, which
    must be of the same world size.
    """
    s = _lib.store(home)
    info = _find(s, job, step, id, rank, world_size)
    tree = (info.get("state") or {}).get("tree")
    if tree is None:
        raise _lib.InvalidArgument(2, f"checkpoint {info['id']} was not saved by the Python package "
                                      "(no state description)")
    nodes = _state.tensor_nodes(tree)
    targets = {}  # tensor name -> the object it is loaded into
    also = []  # (object, object loaded): a tensor saved once under several keys, into= holding several objects
    if into is not None:
        saved_paths = {tuple(p) for p, _ in nodes}
        for path, node in nodes:
            try:
                obj = _state.lookup(into, path)
            except (KeyError, IndexError, TypeError):
                raise _lib.Mismatch(12, f"{_state.path_text(path)}: the checkpoint has a tensor there, into= has nothing") from None
            _check_target(node, obj, path)
            first = targets.setdefault(node["tensor"], obj)
            if first is not obj:
                also.append((obj, first))
        for path in _state.tensor_paths(into):
            if tuple(path) not in saved_paths:
                raise _lib.Mismatch(12, f"{_state.path_text(path)}: into= has a tensor there, the checkpoint has none")
    else:
        for _, node in nodes:
            if node["tensor"] not in targets:
                targets[node["tensor"]] = _allocate(node, device)
    items, copy_back, devices, named = [], [], set(), set()
    for path, node in nodes:
        if node["tensor"] in named:  # the same tensor under a second key
            continue
        named.add(node["tensor"])
        obj = targets[node["tensor"]]
        buf, back = _writable_view(obj, path)
        if back:
            copy_back.append((obj, buf))
        nbytes = buf.numel() * buf.element_size() if _state.is_torch_tensor(buf) else buf.nbytes
        host, dev = None, 0
        if nbytes:
            if _state.is_torch_tensor(buf) and buf.is_cuda:
                dev = buf.data_ptr()
                devices.add(f"cuda:{buf.device.index}")
            elif _state.is_torch_tensor(buf):
                host = buf.data_ptr()
            else:
                host = buf.ctypes.data
        items.append((node["tensor"], node["dtype"], node["shape"], host, dev, nbytes))
    _synchronize(devices)
    arr, keep = _ctypes_tensors(items)
    _lib.call(_lib.lib().stasis_load_io, s.handle, info["id"].encode("utf-8"), arr, len(items),
              None if io is None else io.encode("utf-8"))
    del keep
    for obj, buf in copy_back + also:
        if _state.is_torch_tensor(obj):
            with _state._torch().no_grad():  # a parameter that requires grad
                obj.copy_(buf)
        else:
            obj[...] = buf
    if into is not None:
        return _state.build(tree, lambda node, at: _state.lookup(into, at))
    return _state.build(tree, lambda node, at: targets[node["tensor"]])


def _record(r):
    return {k: r[k] for k in ("id", "job", "step", "created", "kind", "bytes", "stored_bytes", "host") if k in r}


def latest(job, home=None):
    """The record of job's latest complete tensors checkpoint, or None."""
    s = _lib.store(home)
    try:
        return _record(_lib.call_json(_lib.lib().stasis_find, s.handle, _lib.encode_job(job), -1))
    except _lib.CheckpointNotFound:
        return None


def checkpoints(job=None, home=None):
    """The records of job's complete checkpoints (every job's when None),
    oldest step first."""
    s = _lib.store(home)
    recs = _lib.call_json(_lib.lib().stasis_list, s.handle, (job or "").encode("utf-8"))
    return [_record(r) for r in recs]
