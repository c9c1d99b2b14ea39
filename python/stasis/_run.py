"""Cooperation with ``stasis run``: preemption notices and resumption.

``stasis run --job J -- python train.py`` starts the job with, in its
environment:

``STASIS_JOB``, ``STASIS_HOME``
    the job's name and the store, so that the job saves where stasis looks.
``STASIS_PREEMPT_FILE``
    a file that does not exist until the job is preempted; stasis then
    creates it (atomically) holding one JSON line,
    ``{"signal": "USR1", "deadline": "2025-01-01T12:00:00Z"}``: the job
    should save a checkpoint of job J before the deadline and exit.
``STASIS_RESUME_ID``, ``STASIS_RESUME_STEP``
    set when the job is restarted after a checkpoint: the checkpoint to
    load and its step.

The job polls ``preempted()`` at step boundaries (it costs one failed
``open``), or registers a callback with ``on_preempt``. When the job first
sees the notice, this module creates ``STASIS_PREEMPT_FILE + ".ack"``:
``stasis run --fallback process`` then knows the job is saving and does not
take a process checkpoint in its place.

Standard library only. Outside ``stasis run`` every function says "not
preempted" and "nothing to resume".
"""

import json
import os
import threading
import time

__all__ = ["preempted", "preemption", "on_preempt", "resume_id", "resume_step"]

_acknowledged = False


def _notice_path():
    return os.environ.get("STASIS_PREEMPT_FILE") or None


def preemption():
    """The preemption notice as a dict ("signal", "deadline"), or None."""
    path = _notice_path()
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            notice = json.loads(f.read())
    except (FileNotFoundError, ValueError):
        # No notice yet (it appears whole, by a rename).
        return None
    _acknowledge(path)
    return notice


def preempted():
    """True once ``stasis run`` has asked the job to save and exit."""
    return preemption() is not None


def _acknowledge(path):
    global _acknowledged
    if _acknowledged:
        return
    try:
        os.close(os.open(path + ".ack", os.O_WRONLY | os.O_CREAT, 0o600))
        _acknowledged = True
    except OSError:
        pass


def on_preempt(callback, interval=0.1):
    """Call ``callback(notice)`` once, from a daemon thread, when the job is
    preempted. Returns the thread, or None outside ``stasis run`` (the
    callback is then never called)."""
    if _notice_path() is None:
        return None
    def watch():
        while True:
            time.sleep(interval)
            notice = preemption()
            if notice is not None:
                callback(notice)
                return

    thread = threading.Thread(target=watch, name="stasis-preempt", daemon=True)
    thread.start()
    return thread


def resume_id():
    """The ID of the checkpoint to resume from, or None."""
    return os.environ.get("STASIS_RESUME_ID") or None


def resume_step():
    """The step of the checkpoint to resume from (an int), or None."""
    step = os.environ.get("STASIS_RESUME_STEP")
    return int(step) if step else None
