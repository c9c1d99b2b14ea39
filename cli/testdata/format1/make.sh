#!/usr/bin/env bash
# Writes the fixtures of store format 1 into this directory: export streams
# of a files checkpoint, a tensors checkpoint (saved by the Python
# package), a job checkpoint of two ranks and a process checkpoint (a
# `sleep`), and what their contents must be (want.json). They were made
# once, by the stasis of 2026-11-25, and are kept as they are: the tests
# (cli/format_test.go) import and check them with every later stasis, so
# that a change of the format never strands a user's checkpoints. Run it
# again only for a new format, into a new directory.
#
#   cli/testdata/format1/make.sh STASIS_BINARY LIBSTASIS   (root, CRIU, /usr/bin/python3 with NumPy)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
stasis=$1 lib=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export STASIS_HOME=$work/store STASIS_LIB=$lib PYTHONPATH=$here/../../../python

# files: a text, a compressible and an incompressible file, a link, an empty directory
mkdir -p "$work/tree/sub" "$work/tree/empty"
printf 'hello fixtures\n' >"$work/tree/a.txt"
python3 -c "import sys; sys.stdout.write('stasis ' * 20000)" >"$work/tree/sub/text.txt"
python3 -c "import random, sys; r = random.Random(1); sys.stdout.buffer.write(bytes(r.getrandbits(8) for _ in range(65536)))" >"$work/tree/sub/random.bin"
ln -s a.txt "$work/tree/link"
files=$("$stasis" save --job fx-files --step 1 --compress auto "$work/tree" | tail -1)
"$stasis" export "$files" -o "$here/files.tar"

# tensors and a job checkpoint, through the Python package (NumPy): the
# state of rank R (0 for the tensors checkpoint) as want_state in
# cli/format_test.go computes it
cat >"$work/save.py" <<'PY'
import os, sys
import numpy as np
import stasis
r = int(os.environ.get("RANK", "0"))
state = {"w": np.arange(4096, dtype=np.float32).reshape(64, 64) * (r + 1),
         "h": np.linspace(-1, 1, 1000).astype(np.float16), "n": np.arange(7, dtype=np.int64) - r,
         "meta": {"step": 3, "name": "fixture", "lr": 0.25}}
if sys.argv[1] == "tensors":
    stasis.save(state, job="fx-tensors", step=3, blocking=True, compress="zstd")
else:
    stasis.save(state, job="fx-job", step=5, blocking=True, rank=r, world_size=2, attempt="fixture")
PY
/usr/bin/python3 "$work/save.py" tensors
RANK=0 /usr/bin/python3 "$work/save.py" job & RANK=1 /usr/bin/python3 "$work/save.py" job
wait
tensors=$("$stasis" ls --job fx-tensors --json | python3 -c 'import json, sys; print(json.load(sys.stdin)[0]["id"])')
job=$("$stasis" ls --job fx-job --json | python3 -c 'import json, sys; print(json.load(sys.stdin)[0]["id"])')
"$stasis" export "$tensors" -o "$here/tensors.tar"
"$stasis" export "$job" -o "$here/job.tar"

# a process checkpoint of a sleep
pid=$(sh -c 'setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $!')
process=$("$stasis" checkpoint --pid "$pid" --job fx-process | tail -1)
"$stasis" export "$process" -o "$here/process.tar"

cat >"$here/want.json" <<JSON
{"files": {"id": "$files", "sha256": {
  "a.txt": "$(sha256sum <"$work/tree/a.txt" | cut -c1-64)",
  "sub/text.txt": "$(sha256sum <"$work/tree/sub/text.txt" | cut -c1-64)",
  "sub/random.bin": "$(sha256sum <"$work/tree/sub/random.bin" | cut -c1-64)"}},
 "tensors": {"id": "$tensors"}, "job": {"id": "$job", "ranks": 2}, "process": {"id": "$process"}}
JSON
ls -la "$here"
