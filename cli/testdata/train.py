"""train.py OUT STEPS SAVER: a small NumPy training loop run by `stasis run
--mode app`, to test preemption and resumption end to end.

Each step updates the weights deterministically from the step number and
appends the step to OUT. At every step boundary the loop asks stasis
whether it was preempted; if so it saves its state (the weights, as of the
next step to run) as a checkpoint of $STASIS_JOB and exits 0. Started with
STASIS_RESUME_ID, it loads that checkpoint and, before going on, checks
that the weights equal those of a run that never stopped (replayed from
the start): exit 3 if not.

SAVER is how the checkpoint is written and read: "cli" through `stasis
save` and `stasis load` ($STASIS_BIN), "package" through the stasis Python
package's save and load.
"""

import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from stasis import preempted, resume_id, resume_step

NAMES = ("w", "b")


def initial_state():
    rng = np.random.default_rng(7)
    return {"w": rng.standard_normal((128, 128), dtype=np.float32), "b": np.zeros(128, dtype=np.float32)}


def train_step(state, step):
    x = np.random.default_rng(1000 + step).standard_normal(128, dtype=np.float32)
    state["w"] = state["w"] * np.float32(0.99) + np.outer(x, x) * np.float32(0.01)
    state["b"] = state["b"] + x


def replay(steps):
    state = initial_state()
    for step in range(steps):
        train_step(state, step)
    return state


def save_cli(state, job, step):
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for name in NAMES:
            paths.append(os.path.join(tmp, name + ".npy"))
            np.save(paths[-1], state[name])
        subprocess.run([os.environ["STASIS_BIN"], "save", "--job", job, "--step", str(step)] + paths,
                       check=True, stdout=subprocess.DEVNULL)


def load_cli(checkpoint_id):
    with tempfile.TemporaryDirectory() as tmp:
        into = os.path.join(tmp, "loaded")
        subprocess.run([os.environ["STASIS_BIN"], "load", checkpoint_id, "--to", into], check=True)
        return {name: np.load(os.path.join(into, name + ".npy")) for name in NAMES}


def save_package(state, job, step):
    import stasis
    stasis.save(state, job=job, step=step, blocking=True)


def load_package(checkpoint_id):
    import stasis
    return stasis.load(id=checkpoint_id)


def main():
    out, steps, saver = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    save, load = {"cli": (save_cli, load_cli), "package": (save_package, load_package)}[saver]
    job = os.environ["STASIS_JOB"]
    start, state = 0, initial_state()
    if resume_id() is not None:
        start, state = resume_step(), load(resume_id())
        expected = replay(start)
        for name in NAMES:
            if not np.array_equal(state[name], expected[name]):
                print(f"train.py: resumed {name} at step {start} differs from the uninterrupted run's", file=sys.stderr)
                sys.exit(3)
        print(f"train.py: resumed at step {start}; the weights match", flush=True)
    for step in range(start, steps):
        if preempted():
            save(state, job, step)
            print(f"train.py: preempted; saved step {step}", flush=True)
            sys.exit(0)
        train_step(state, step)
        time.sleep(0.05)  # the rest of a real step
        with open(out, "a") as f:
            f.write(f"{step}\n")
    print("train.py: done", flush=True)


main()
