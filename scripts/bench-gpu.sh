#!/usr/bin/env bash
# Compares stasis with the by-hand sequence on one GPU process, in one run:
# a PyTorch process holding GIB GiB of bf16 weights-like values in GPU
# memory (cli/testdata/gpu_workload.py ... weights).
#
#   scripts/bench-gpu.sh [-g GIB] [-d DIR]      (root, CRIU, a GPU, after make)
#
# By hand (the job goes on): driver lock + checkpoint (`stasis cuda`), `criu
# dump --leave-running` into DIR on disk, driver restore + unlock: that is
# the pause; then `sync` to make it durable. stasis: `checkpoint
# --leave-running` (durable, compressed, checksummed before the job
# resumes) and `checkpoint --fast`. Restores from a cold page cache: `criu
# restore -d` + driver restore + unlock by hand, against `stasis restore`
# (memory filled in by stasis, the default) and `stasis restore --pages
# stream`. Prints one JSON object.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/gpu-lib.sh
gpu_setup /var/tmp/stasis-bench-gpu "$@"
criu_bin=${STASIS_CRIU:-$PWD/bin/criu}
export STASIS_CRIU=$criu_bin
mkdir -p "$dir/by-hand"

now() { date +%s.%N; }
since() { awk -v a="$(now)" -v b="$1" 'BEGIN { printf "%.3f\n", a - b }'; }
cold() { sync; echo 3 >/proc/sys/vm/drop_caches; }
gone() { while [ -d /proc/$1 ]; do sleep 0.05; done; }
healthy() { local n; n=$(wc -l <"$1")
	until [ "$(wc -l <"$1")" -gt "$((n + 2))" ]; do sleep 0.1; done
	! grep -q "ok=False" "$1"; }

log=$dir/workload.log
pid=$(sh -c "setsid python3 cli/testdata/gpu_workload.py '$log' $gib weights </dev/null >'$log.err' 2>&1 & echo \$!")
until [ -s "$log" ]; do sleep 0.2; done
healthy "$log"

# By hand, the job goes on.
cold
t=$(now)
"$stasis" cuda lock --pid "$pid" >/dev/null
"$stasis" cuda checkpoint --pid "$pid" >/dev/null
t_dump=$(now)
"$criu_bin" dump -t "$pid" -D "$dir/by-hand" --leave-running -o dump.log
hand_dump=$(since "$t_dump")
"$stasis" cuda restore --pid "$pid" >/dev/null
"$stasis" cuda unlock --pid "$pid" >/dev/null
hand_pause=$(since "$t")
t=$(now); sync; hand_sync=$(since "$t")
hand_bytes=$(du -sb "$dir/by-hand" | cut -f1)
healthy "$log"

# stasis, durable before the job resumes.
cold
t=$(now)
durable=$("$stasis" checkpoint --pid "$pid" --leave-running --job bench --json)
durable_total=$(since "$t")
healthy "$log"

# stasis --fast.
cold
t=$(now)
fast=$("$stasis" checkpoint --pid "$pid" --fast --job bench --json)
fast_total=$(since "$t")
healthy "$log"
id=$(echo "$fast" | field 'j["record"]["id"]')

# Restores.
kill -9 "$pid"; gone "$pid"; cold
t=$(now)
"$criu_bin" restore -D "$dir/by-hand" -d -o restore.log
"$stasis" cuda restore --pid "$pid" >/dev/null
"$stasis" cuda unlock --pid "$pid" >/dev/null
hand_restore=$(since "$t")
healthy "$log"
kill -9 "$pid"; gone "$pid"; cold
t=$(now)
restored=$("$stasis" restore --json "$id")
stasis_restore=$(since "$t")
healthy "$log"
kill -9 "$pid"; gone "$pid"; cold
t=$(now)
"$stasis" restore --pages stream "$id" >/dev/null
stasis_restore_stream=$(since "$t")
healthy "$log"
kill -9 "$pid"; gone "$pid"

python3 - "$gib" "$hand_pause" "$hand_dump" "$hand_sync" "$hand_bytes" "$durable" "$durable_total" "$fast" "$fast_total" "$hand_restore" "$stasis_restore" "$restored" "$stasis_restore_stream" <<'PY'
import json, sys
gib, hp, hd, hs, hb, durable, dt, fast, ft, hr, sr, restored, srs = sys.argv[1:]
hp, hd, hs, dt, ft, hr, sr, srs = map(float, (hp, hd, hs, dt, ft, hr, sr, srs))
rj = json.loads(restored)
hb = int(hb)
d, f = json.loads(durable), json.loads(fast)
r = lambda x: round(x, 3)
print(json.dumps({
    "gpu_gib": float(gib),
    "by_hand": {"pause_s": r(hp), "criu_dump_s": r(hd), "sync_s": r(hs), "image_bytes": hb, "restore_s": r(hr)},
    "stasis_durable": {"pause_s": r(d["pause_seconds"]), "total_s": r(dt), "gpu_lock_s": r(d["gpu_lock_seconds"]),
                       "gpu_checkpoint_s": r(d["gpu_checkpoint_seconds"]), "dump_s": r(d["dump_seconds"]),
                       "store_s": r(d["store_seconds"]), "gpu_resume_s": r(d["gpu_resume_seconds"]),
                       "stored_bytes": d["record"]["stored_bytes"]},
    "stasis_fast": {"pause_s": r(f["pause_seconds"]), "total_s": r(ft), "store_after_resume_s": r(f["store_seconds"]),
                    "stored_bytes": f["record"]["stored_bytes"]},
    "stasis_restore_s": r(sr),
    "stasis_restore": {k: rj[k] for k in ("unpack_seconds", "criu_seconds", "fill_seconds", "gpu_seconds", "filled_bytes", "filled_zero_bytes", "kept_for_criu_bytes")},
    "stasis_restore_streamed_s": r(srs),
    "ratios": {
        "fast_pause_vs_by_hand_pause": r(f["pause_seconds"] / hp),
        "fast_pause_vs_by_hand_pause_plus_sync": r(f["pause_seconds"] / (hp + hs)),
        "durable_pause_vs_by_hand_dump_plus_sync": r(d["pause_seconds"] / (hp + hs)),
        "stored_vs_by_hand_image": r(f["record"]["stored_bytes"] / hb),
        "restore_vs_by_hand": r(sr / hr),
        "restore_streamed_vs_by_hand": r(srs / hr),
    },
}, indent=1))
PY
