"""stasis for training loops: save a training state (nested dicts and lists
of torch tensors on the GPU or CPU, NumPy arrays and small Python values)
into a stasis store, asynchronously, and load it back, straight into GPU
memory or in place.

    import stasis
    h = stasis.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step},
                    job="llama", step=step)        # returns once the tensors are copied out
    ...
    h.wait()                                        # durable and listed
    state = stasis.load(job="llama", device="cuda") # the latest checkpoint

Under `stasis run --mode app` (docs/cli.md), the loop polls
`stasis.preempted()` at step boundaries (or registers
`stasis.on_preempt(callback)`), saves, and exits; `stasis.resume_id()` and
`stasis.resume_step()` say what the run resumes from, and
`stasis.load(job=...)` picks it up.

It calls libstasis.so (the C ABI, capi/stasis.h) through ctypes: found
through $STASIS_LIB, beside this package, or in the repository's bin/
(`make` builds it there). The store is $STASIS_HOME (or home=).
"""

from ._api import SaveHandle, latest, load, prepare, save
from ._api import checkpoints as list
from ._run import on_preempt, preempted, preemption, resume_id, resume_step
from ._lib import (CheckpointNotFound, CorruptCheckpoint, InvalidArgument, LibraryError, Mismatch,
                   SaveInFlight, StasisError, JobIncomplete, library_path)

__all__ = ["save", "prepare", "load", "latest", "list", "SaveHandle", "StasisError", "InvalidArgument",
           "CheckpointNotFound", "CorruptCheckpoint", "Mismatch", "SaveInFlight", "JobIncomplete", "LibraryError",
           "library_path", "preempted", "preemption", "on_preempt", "resume_id", "resume_step"]
