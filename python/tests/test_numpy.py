"""Tests of the Python package with NumPy, against a real libstasis.so and
a real store (run by capi's TestPython, or by hand:
cd python; STASIS_LIB=../bin/libstasis.so PYTHONPATH=. python3 -m unittest discover -s tests)."""

import glob
import math
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

import numpy as np

import stasis

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STASIS_BIN = os.environ.get("STASIS_BIN") or os.path.join(os.path.dirname(PYTHON_DIR), "bin", "stasis")


def sample_state(seed):
    rng = np.random.default_rng(seed)
    big = rng.standard_normal((512, 1024)).astype(np.float32)
    return {
        "model": {"layer.0/weight": big, "layer.0/bias": rng.standard_normal(1024).astype(np.float16),
                  "..": np.arange(10, dtype=np.int64), "": np.array(True)},
        "columns": big[:, ::3],  # not contiguous
        "big_endian": np.arange(6, dtype=">i4").reshape(2, 3),
        "empty": np.zeros((0, 4), dtype=np.uint8),
        "complex": np.array([1 + 2j, -3j], dtype=np.complex64),
        "opt": {0: {"exp_avg": rng.standard_normal(7)}, 1: {"exp_avg": rng.standard_normal(3)},
                "groups": [{"betas": (0.9, 0.999), "lr": 3e-4, "foreach": None, "name": "ü"}]},
        "values": [float("nan"), float("inf"), -float("inf"), 2 ** 62, True, "text", None],
        "np_scalars": [np.float32(1.5), np.int16(-3), np.bool_(True)],
    }


def assert_same(test, a, b, path="state"):
    test.assertEqual(type(a), type(b), path)
    if isinstance(a, np.ndarray):
        test.assertEqual(a.dtype.newbyteorder("<"), b.dtype.newbyteorder("<"), path)
        test.assertEqual(a.shape, b.shape, path)
        test.assertTrue(np.array_equal(a, b), path)
    elif isinstance(a, dict):
        test.assertEqual(list(a.keys()), list(b.keys()), path)
        for k in a:
            assert_same(test, a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        test.assertEqual(len(a), len(b), path)
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(test, x, y, f"{path}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        test.assertTrue(math.isnan(b), path)
    else:
        test.assertEqual(a, b, path)
        if isinstance(a, np.generic):
            test.assertEqual(a.dtype, b.dtype, path)


class StoreTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.home = os.path.join(self.tmp.name, "store")

    def tearDown(self):
        self.tmp.cleanup()

    def run_python(self, code, **env):
        e = dict(os.environ, PYTHONPATH=PYTHON_DIR, STASIS_HOME=self.home, **env)
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e, capture_output=True, text=True)


class RoundTrip(StoreTest):
    def test_blocking_and_async_round_trip(self):
        for blocking in (True, False):
            with self.subTest(blocking=blocking):
                state = sample_state(1)
                h = stasis.save(state, job="rt", step=10 if blocking else 11, blocking=blocking, home=self.home)
                rec = h.wait()
                self.assertTrue(h.done())
                if not blocking:
                    self.assertGreater(h.snapshot_s, 0)
                self.assertEqual((rec["job"], rec["step"]), ("rt", 10 if blocking else 11))
                loaded = stasis.load(job="rt", step=rec["step"], home=self.home)
                assert_same(self, state, loaded)

    def test_async_save_is_a_snapshot(self):
        state = sample_state(2)
        stasis.prepare(state, home=self.home)
        want = {k: v.copy() for k, v in state["model"].items()}
        h = stasis.save(state, job="snap", step=1, home=self.home)
        for arr in state["model"].values():
            arr[...] = 0
        h.wait()
        loaded = stasis.load(job="snap", home=self.home)
        for k, v in want.items():
            self.assertTrue(np.array_equal(loaded["model"][k], v), k)

    def test_load_in_place(self):
        stasis.save(sample_state(3), job="into", step=1, blocking=True, home=self.home)
        target = sample_state(4)
        weight, columns = target["model"]["layer.0/weight"], target["columns"]
        out = stasis.load(job="into", into=target, home=self.home)
        self.assertIs(out["model"]["layer.0/weight"], weight)
        want = sample_state(3)
        self.assertTrue(np.array_equal(weight, want["model"]["layer.0/weight"]))
        self.assertTrue(np.array_equal(columns, want["columns"]), "a non-contiguous target was not filled")
        assert_same(self, want, out)

    def test_find_list_latest(self):
        ids = [stasis.save({"x": np.full(3, s)}, job="steps", step=s, home=self.home).id for s in (5, 6, 7)]
        self.assertEqual([r["step"] for r in stasis.list("steps", home=self.home)], [5, 6, 7])
        self.assertEqual(stasis.latest("steps", home=self.home)["id"], ids[2])
        self.assertIsNone(stasis.latest("nosuchjob", home=self.home))
        self.assertEqual(stasis.load(id=ids[0][:8], home=self.home)["x"][0], 5)
        self.assertEqual(stasis.load(job="steps", step=6, home=self.home)["x"][0], 6)
        with self.assertRaises(stasis.CheckpointNotFound):
            stasis.load(job="steps", step=99, home=self.home)
        self.assertEqual(stasis.load(job="steps", home=self.home)["x"][0], 7)

    def test_empty_and_tensorless_states(self):
        stasis.save({}, job="empty", step=1, blocking=True, home=self.home)
        self.assertEqual(stasis.load(job="empty", home=self.home), {})
        stasis.save({"epoch": 3, "tags": ["a"]}, job="plain", step=1, home=self.home).wait()
        self.assertEqual(stasis.load(job="plain", home=self.home), {"epoch": 3, "tags": ["a"]})

    def test_second_save_waits_or_refuses(self):
        big = {"w": np.random.default_rng(5).standard_normal(48 << 20 >> 3)}
        first = stasis.save(big, job="busy", step=1, home=self.home)
        if first.done():
            self.skipTest("the first save finished before a second could start")
        with self.assertRaises(stasis.SaveInFlight):
            stasis.save({"w": np.ones(3)}, job="busy", step=2, wait_if_busy=False, home=self.home)
        second = stasis.save({"w": np.ones(3)}, job="busy", step=3, home=self.home)
        self.assertTrue(first.done(), "the second save did not wait for the first")
        second.wait()
        self.assertEqual([r["step"] for r in stasis.list("busy", home=self.home)], [1, 3])

    def test_exit_with_a_save_in_flight(self):
        r = self.run_python("""
            import numpy as np, stasis
            stasis.save({"w": np.arange(8 << 20, dtype=np.float32)}, job="exit", step=1)
        """)
        self.assertEqual(r.returncode, 0, r.stderr)
        loaded = stasis.load(job="exit", home=self.home)
        self.assertTrue(np.array_equal(loaded["w"], np.arange(8 << 20, dtype=np.float32)))


class Edges(StoreTest):
    def test_tied_arrays_are_saved_once_and_stay_tied(self):
        w = np.arange(1 << 16, dtype=np.float32)
        rec = stasis.save({"embed": w, "head": w, "other": w.copy()}, job="tied", step=1, home=self.home).wait()
        self.assertEqual(rec["bytes"], 2 * w.nbytes)
        out = stasis.load(job="tied", home=self.home)
        self.assertIs(out["embed"], out["head"])
        self.assertIsNot(out["embed"], out["other"])
        self.assertTrue(np.array_equal(out["head"], w))
        untied = {"embed": np.zeros_like(w), "head": np.zeros_like(w), "other": np.zeros_like(w)}
        stasis.load(job="tied", into=untied, home=self.home)
        self.assertTrue(np.array_equal(untied["head"], w), "the second object of a tied pair was not loaded")

    def test_numpy_scalars_keep_their_type(self):
        stasis.save({"x": np.float64(0.5), "y": np.float32(2)}, job="scalars", step=1, blocking=True, home=self.home)
        out = stasis.load(job="scalars", home=self.home)
        self.assertIs(type(out["x"]), np.float64)
        self.assertIs(type(out["y"]), np.float32)
        with self.assertRaisesRegex(TypeError, r"state\['q'\]: NumPy scalars of dtype float128"):
            stasis.save({"q": np.longdouble(1)}, job="scalars", step=2, home=self.home)

    def test_bad_job_step_and_state(self):
        for job, step in ((" spaced ", 1), ("", 1), ("a\0b", 1), ("ok", -1), ("ok", 1 << 63), ("ok", 1.5)):
            with self.subTest(job=job, step=step):
                with self.assertRaises(stasis.InvalidArgument):
                    stasis.save({}, job=job, step=step, home=self.home)
        with self.assertRaises(stasis.InvalidArgument):
            stasis.load(job="", home=self.home)
        with self.assertRaisesRegex(stasis.InvalidArgument, "keep large data in tensors or arrays"):
            stasis.save({"perm": list(range(3_000_000))}, job="ok", step=1, home=self.home)
        self.assertEqual(stasis.list(home=self.home), [])

    def test_compress_per_save_shares_the_store(self):
        w = {"w": np.zeros(1 << 20, dtype=np.float32)}
        stasis.prepare(w, home=self.home)
        none = stasis.save(w, job="c", step=1, compress="none", home=self.home).wait()
        auto = stasis.save(w, job="c", step=2, compress="auto", home=self.home).wait()
        self.assertGreater(none["stored_bytes"], 10 * auto["stored_bytes"])
        from stasis import _lib
        self.assertEqual(sum(1 for s in _lib._stores.values() if s.home == self.home), 1)

    def test_io_path_is_checked_and_host_arrays_take_the_host_path(self):
        w = {"w": np.arange(1 << 20, dtype=np.float32)}
        with self.assertRaisesRegex(stasis.InvalidArgument, 'I/O path "gds": use auto, cufile or pinned'):
            stasis.save(w, job="io", step=1, io="gds", home=self.home)
        stasis.save(w, job="io", step=2, io="cufile", blocking=True, home=self.home).wait()
        back = stasis.load(job="io", io="pinned", home=self.home)
        np.testing.assert_array_equal(back["w"], w["w"])
        with self.assertRaisesRegex(stasis.InvalidArgument, 'I/O path "gds"'):
            stasis.load(job="io", io="gds", home=self.home)

    def test_done_does_not_wait_for_a_waiting_thread(self):
        import threading
        h = stasis.save({"w": np.random.default_rng(1).standard_normal(32 << 20)}, job="poll", step=1, home=self.home)
        waiter = threading.Thread(target=h.wait)
        waiter.start()
        seen = h.done()
        waiter.join()
        if seen:
            self.skipTest("the save finished before done() was called")
        self.assertTrue(h.done())
        self.assertEqual(h.wait()["step"], 1)

    def test_a_failed_save_at_exit_is_reported(self):
        r = self.run_python("""
            import resource, signal, numpy as np, stasis
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 20, 4 << 20))
            stasis.save({"w": np.random.default_rng(2).standard_normal(4 << 20)}, job="full", step=3)
        """)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("stasis: the asynchronous save of job 'full' step 3 failed", r.stderr)
        self.assertEqual(stasis.list("full", home=self.home), [])


class Transfer(StoreTest):
    def test_exported_checkpoint_loads_on_another_node(self):
        """A checkpoint saved into one store, exported, imported into a
        second store (another node's) and loaded from there."""
        if not os.access(STASIS_BIN, os.X_OK):
            self.skipTest(f"needs the stasis command at {STASIS_BIN} (make builds it) or $STASIS_BIN")
        state = sample_state(7)
        rid = stasis.save(state, job="moved", step=4, home=self.home).id
        other = os.path.join(self.tmp.name, "node2")
        export = subprocess.Popen([STASIS_BIN, "export", rid], env=dict(os.environ, STASIS_HOME=self.home),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        imported = subprocess.run([STASIS_BIN, "import", "-"], env=dict(os.environ, STASIS_HOME=other),
                                  stdin=export.stdout, capture_output=True, text=True)
        export.stdout.close()
        export_errors = export.stderr.read()
        export.stderr.close()
        self.assertEqual(export.wait(), 0, export_errors)
        self.assertEqual(imported.returncode, 0, imported.stderr)
        self.assertEqual(stasis.latest("moved", home=other)["id"], rid)
        assert_same(self, state, stasis.load(job="moved", home=other))


class BadInput(StoreTest):
    def test_unsupported_object_names_its_path(self):
        with self.assertRaisesRegex(TypeError, r"state\['opt'\]\['groups'\]\[0\]\['fn'\]: objects of type builtins.function"):
            stasis.save({"opt": {"groups": [{"fn": lambda: 0}]}}, job="bad", step=1, home=self.home)
        with self.assertRaisesRegex(TypeError, r"state\['k'\]: key 1.5"):
            stasis.save({"k": {1.5: 1}}, job="bad", step=1, home=self.home)
        with self.assertRaisesRegex(TypeError, "NumPy dtype"):
            stasis.save({"s": np.array(["text"])}, job="bad", step=1, home=self.home)
        self.assertEqual(stasis.list("bad", home=self.home), [])

    def test_bad_job_name(self):
        with self.assertRaises(stasis.InvalidArgument):
            stasis.save({}, job=" spaced ", step=1, home=self.home)

    def test_load_into_a_structure_that_does_not_match(self):
        stasis.save({"a": {"w": np.zeros((2, 3), np.float32)}, "b": np.zeros(2)}, job="m", step=1, blocking=True, home=self.home)
        cases = [
            ({"a": {"w": np.zeros((3, 2), np.float32)}, "b": np.zeros(2)}, r"state\['a'\]\['w'\]: the checkpoint has <f4\[2, 3\], into= has <f4\[3, 2\]"),
            ({"a": {"w": np.zeros((2, 3), np.float64)}, "b": np.zeros(2)}, r"state\['a'\]\['w'\]: the checkpoint has <f4"),
            ({"a": {}, "b": np.zeros(2)}, r"state\['a'\]\['w'\]: the checkpoint has a tensor there, into= has nothing"),
            ({"a": {"w": np.zeros((2, 3), np.float32)}, "b": np.zeros(2), "c": np.zeros(1)}, r"state\['c'\]: into= has a tensor there"),
            ({"a": {"w": 1.0}, "b": np.zeros(2)}, r"state\['a'\]\['w'\]: the checkpoint has a tensor, into= has float"),
        ]
        for into, pattern in cases:
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex(stasis.Mismatch, pattern):
                    stasis.load(job="m", into=into, home=self.home)

    def test_corrupted_chunk_is_refused(self):
        rid = stasis.save({"w": np.arange(1 << 20, dtype=np.float32)}, job="rot", step=1, home=self.home).id
        data = glob.glob(os.path.join(self.home, "checkpoints", rid, "data.*"))[0]
        with open(data, "r+b") as f:
            f.seek(100)
            b = f.read(1)
            f.seek(100)
            f.write(bytes([b[0] ^ 0x40]))
        with self.assertRaisesRegex(stasis.CorruptCheckpoint, "chunk"):
            stasis.load(job="rot", home=self.home)

    def test_library_missing_or_of_another_version(self):
        r = self.run_python("import stasis; stasis.list()", STASIS_LIB=os.path.join(self.tmp.name, "nope.so"))
        self.assertIn("libstasis.so not found", r.stderr)
        self.assertIn("run `make`", r.stderr)
        src = os.path.join(self.tmp.name, "old.c")
        with open(src, "w") as f:
            f.write("int stasis_abi_version(void) { return 99; }\n")
        old = os.path.join(self.tmp.name, "libold.so")
        if subprocess.run(["gcc", "-shared", "-fPIC", "-o", old, src]).returncode != 0:
            self.skipTest("gcc could not build a library of another ABI version")
        r = self.run_python("import stasis; stasis.list()", STASIS_LIB=old)
        self.assertIn("has ABI version 99, this package needs 1", r.stderr)


if __name__ == "__main__":
    unittest.main()
