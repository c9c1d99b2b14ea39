"""Job checkpoints of several ranks, each rank a real process (run by
capi's TestPython with the other Python tests)."""

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np

import stasis

from test_numpy import PYTHON_DIR, StoreTest

# A rank: saves its shard of step STEP (asynchronously, as training loops
# do) after SLEEP seconds, as rank $RANK of $WORLD_SIZE, then waits for it.
RANK = """
    import os, sys, time
    import numpy as np
    import stasis
    step = int(os.environ["STEP"])
    rank = int(os.environ["RANK"])
    state = {"shard": np.full(1000 + rank, rank * 1000 + step, dtype=np.int64), "step": step}
    time.sleep(float(os.environ.get("SLEEP", "0")))
    h = stasis.save(state, job="big", step=step, part_timeout=float(os.environ.get("PART_TIMEOUT", "30")))
    try:
        rec = h.wait()
    except stasis.JobIncomplete as e:
        print("INCOMPLETE", e, flush=True)
        sys.exit(3)
    print("SAVED", rec["kind"], rec["id"], flush=True)
"""


class Ranks(StoreTest):
    def start(self, rank, world, step, attempt, **env):
        e = dict(os.environ, PYTHONPATH=PYTHON_DIR, STASIS_HOME=self.home, RANK=str(rank), WORLD_SIZE=str(world),
                 STEP=str(step), STASIS_ATTEMPT=attempt, **{k: str(v) for k, v in env.items()})
        return subprocess.Popen([sys.executable, "-c", textwrap.dedent(RANK)], env=e,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    @staticmethod
    def finish(p):
        out, err = p.communicate(timeout=120)
        return p.returncode, out + err

    def job_checkpoints(self):
        return [r for r in stasis.list("big", home=self.home)]

    def test_every_rank_saves_and_loads_its_part(self):
        ranks = [self.start(r, 4, 10, "a1") for r in range(4)]
        outs = [p.communicate(timeout=120) for p in ranks]
        for r, (p, (out, err)) in enumerate(zip(ranks, outs)):
            self.assertEqual(p.returncode, 0, f"rank {r}: {out} {err}")
        self.assertIn("SAVED job ", outs[0][0])
        recs = self.job_checkpoints()
        self.assertEqual([(r["kind"], r["step"]) for r in recs], [("job", 10)])
        for r in range(4):
            state = stasis.load(job="big", home=self.home, rank=r, world_size=4)
            self.assertEqual(state["step"], 10)
            np.testing.assert_array_equal(state["shard"], np.full(1000 + r, r * 1000 + 10, dtype=np.int64))
        with self.assertRaises(stasis.Mismatch):
            stasis.load(job="big", home=self.home, rank=0, world_size=2)
        with self.assertRaises(stasis.InvalidArgument):  # no rank: which part?
            stasis.load(job="big", home=self.home)

    def test_a_rank_killed_leaves_nothing_listed(self):
        """One rank killed with SIGKILL at a random point before its part is
        committed, or the coordinator killed while it waits for the last
        part: never a listed incomplete checkpoint, and the complete one of
        an earlier step stays loadable."""
        ranks = [self.start(r, 3, 1, "a0") for r in range(3)]
        for p in ranks:
            self.assertEqual(self.finish(p)[0], 0)
        rng = random.Random(os.getpid())
        for trial in range(4):
            step = 2 + trial
            victim = rng.randrange(3) if trial < 3 else 0
            # The victim saves late, and is killed before it does (or,
            # for the coordinator, while it waits for a late rank 2).
            sleeps = {victim: 30} if trial < 3 else {2: 3}
            ranks = [self.start(r, 3, step, f"t{trial}", SLEEP=sleeps.get(r, 0), PART_TIMEOUT=2) for r in range(3)]
            time.sleep(rng.uniform(0.5, 1.5))
            ranks[victim].send_signal(signal.SIGKILL)
            codes = [self.finish(p)[0] for p in ranks]
            self.assertEqual(codes[victim], -signal.SIGKILL)
            if victim != 0:
                self.assertEqual(codes[0], 3, f"trial {trial}: the coordinator did not report the missing rank")
            recs = self.job_checkpoints()
            self.assertEqual([r["step"] for r in recs], [1], f"trial {trial}: listed {recs}")
            state = stasis.load(job="big", home=self.home, rank=1, world_size=3)
            self.assertEqual(state["step"], 1)
        # A later complete attempt at the last step: listed, and gc then
        # removes the parts the failed attempts left behind.
        ranks = [self.start(r, 3, 5, "again") for r in range(3)]
        for p in ranks:
            self.assertEqual(self.finish(p)[0], 0)
        self.assertEqual([r["step"] for r in self.job_checkpoints()], [1, 5])
        gc = subprocess.run([os.environ.get("STASIS_BIN") or os.path.join(os.path.dirname(PYTHON_DIR), "bin", "stasis"),
                             "gc", "--json"], env=dict(os.environ, STASIS_HOME=self.home), capture_output=True, text=True)
        self.assertEqual(gc.returncode, 0, gc.stderr)
        self.assertIn('"parts_removed"', gc.stdout)
        state = stasis.load(job="big", home=self.home, rank=2, world_size=3)
        self.assertEqual(state["step"], 5)
