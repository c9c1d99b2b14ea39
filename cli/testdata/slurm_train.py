"""slurm_train.py STEPS HOLD: one rank of a NumPy training job, run under
SLURM as `srun ... stasis run --job J-rank$SLURM_PROCID -- python3
slurm_train.py STEPS HOLD` (scripts/slurm-example.sbatch; cli/slurm_test.go).

Each rank's state is deterministic in its rank and step: replay(rank, n) is
the state after n steps. At every step boundary the loop asks stasis whether
the job was preempted; if so it saves its state (as of the next step to run)
with the stasis library and exits 0, and `stasis run` exits 75. Started with
STASIS_RESUME_ID, it loads its latest checkpoint and compares it with
replay(rank, step) before going on. It prints, for the test to read:

    rank R: step S                          every 10 steps
    rank R: holding at step S
    rank R: preempted; saved step S
    rank R: resumed at step S; state matches   (or "differs": exit 3)
    rank R: done at step N; state matches

A run that did not resume holds at step HOLD + rank until it is preempted,
so that the preemption comes mid-run however loaded the machine is, and
each rank's checkpoint is of a step of its own.

SLURM signals every process of a job step (--signal without B:, scancel
without --batch): this process gets SIGUSR1 too, besides `stasis run`, and
must not die of it. stasis run's notice file says what to do.

The checkpoint calls are save_state and load_state: per-rank jobs
(NAME-rank0..3, one `stasis run` each, each a world of one); a job-level
checkpoint across the ranks changes those two functions (and needs `stasis
run` to watch for a job checkpoint; docs/slurm.md).
"""

import os
import signal
import sys
import time

import numpy as np

import stasis

signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # stasis run acts on it

RANK = int(os.environ["SLURM_PROCID"])
WORLD = int(os.environ["SLURM_NTASKS"])
JOB = os.environ["STASIS_JOB"]


def initial_state():
    rng = np.random.default_rng(RANK)
    return {"w": rng.standard_normal((64, 64), dtype=np.float32), "b": np.zeros(64, dtype=np.float32),
            "step": np.zeros((), dtype=np.int64)}


def train_step(state, step):
    x = np.random.default_rng(1_000_000 * RANK + step).standard_normal(64, dtype=np.float32)
    state["w"] = state["w"] * np.float32(0.99) + np.outer(x, x) * np.float32(0.01)
    state["b"] = state["b"] + x
    state["step"] = np.array(step + 1, dtype=np.int64)


def replay(steps):
    state = initial_state()
    for step in range(steps):
        train_step(state, step)
    return state


def save_state(state, step):
    # Each rank is a job of its own (JOB is NAME-rankR): a world of one.
    # Without rank= and world_size=, stasis.save takes the rank and world
    # size from $SLURM_PROCID and $SLURM_NTASKS, and would save a part of a
    # job checkpoint of 4 ranks that the other ranks never join.
    stasis.save(state, job=JOB, step=step, blocking=True, rank=0, world_size=1)


def load_state():
    # What stasis run resumes the rank from.
    return stasis.load(id=stasis.resume_id()), stasis.resume_step()


def check(state, step, what):
    expected = replay(step)
    for name in expected:
        if not np.array_equal(state[name], expected[name]):
            say(f"{what} at step {step}; state differs in {name}")
            sys.exit(3)
    say(f"{what} at step {step}; state matches")


def say(line):
    print(f"rank {RANK}: {line}", flush=True)


def main():
    steps, hold = int(sys.argv[1]), int(sys.argv[2])
    start, state = 0, initial_state()
    resumed = stasis.resume_id() is not None
    if resumed:
        state, start = load_state()
        check(state, start, "resumed")
    step, holding = start, False
    while step < steps:
        if stasis.preempted():
            save_state(state, step)
            say(f"preempted; saved step {step}")
            sys.exit(0)
        if step == hold + RANK and not resumed:
            if not holding:
                say(f"holding at step {step}")
                holding = True
            time.sleep(0.05)
            continue
        train_step(state, step)
        step += 1
        if step % 10 == 0:
            say(f"step {step}")
        time.sleep(0.02)  # the rest of a real step
    check(state, steps, "done")


main()
