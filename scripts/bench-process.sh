#!/usr/bin/env bash
# Compares stasis checkpoint and restore with CRIU run by hand, on the same
# process, in one run: a Python process holding SIZE MiB of anonymous memory,
# half random and half zeros, that counts into a file every 20 ms.
#
#   scripts/bench-process.sh [-s MiB]... [-r ROUNDS] [-d DIR] [-C]   (root; after make)
#
# By hand: `criu dump --leave-running -D DIR/by-hand` (the images land in the
# page cache), then `sync` to make them durable; `criu restore -d`.
# stasis: `stasis checkpoint --leave-running` (durable, compressed,
# checksummed, committed; stasis copies the private anonymous memory
# itself, its largest run while CRIU dumps), the same with `--dump-pages
# criu` (CRIU writes the memory, streamed into the store), and `stasis
# restore` of the first (CRIU restores all but the private anonymous
# memory, which stasis writes into the tree from every core), `stasis
# restore --pages stream` (memory
# images streamed to CRIU as they are verified) and `stasis restore
# --verify-first` (every image unpacked and verified before CRIU runs; -C
# leaves these two out). Restores start from a cold page cache
# (drop_caches) on both sides. Each round measures both sides, in
# alternating order; the best time of each over the rounds is reported, and
# under "median" the medians of the main ones. Prints one JSON object per
# size.
set -euo pipefail
cd "$(dirname "$0")/.."

sizes=()
rounds=3
dir=/var/tmp/stasis-bench-process
restore_variants=1
while getopts "s:r:d:C" opt; do
	case $opt in
	s) sizes+=("$OPTARG") ;;
	r) rounds=$OPTARG ;;
	d) dir=$OPTARG ;;
	C) restore_variants=0 ;;
	*) echo "usage: $0 [-s MiB]... [-r ROUNDS] [-d DIR] [-C]" >&2; exit 2 ;;
	esac
done
[ ${#sizes[@]} -gt 0 ] || sizes=(1024 8192)
[ "$(id -u)" -eq 0 ] || { echo "$0: CRIU needs root" >&2; exit 1; }

stasis=${STASIS_BIN:-$PWD/bin/stasis} # STASIS_BIN: another build, to compare
criu_bin=${STASIS_CRIU:-$PWD/bin/criu}
[ -x "$criu_bin" ] || criu_bin=$(command -v criu)
export STASIS_CRIU=$criu_bin
export STASIS_HOME=$dir/store

now() { date +%s.%N; }
since() { awk -v a="$(now)" -v b="$1" 'BEGIN { printf "%.6f\n", a - b }'; }
wait_gone() { while [ -d /proc/$1 ] && ! grep -q '^State:.Z' /proc/$1/status 2>/dev/null; do sleep 0.02; done
	while [ -d /proc/$1 ]; do sleep 0.05; done; }
wait_counting() { local n; n=$(wc -l <"$1" 2>/dev/null || echo 0)
	until [ "$(wc -l <"$1" 2>/dev/null || echo 0)" -gt "$((n + 2))" ]; do sleep 0.05; done; }
cold() { sync; echo 3 >/proc/sys/vm/drop_caches; }

# Writes $1 bytes of random data with O_DIRECT into $2 and fsyncs it; prints
# the seconds it took.
direct_write() {
	python3 - "$1" "$2" <<'PY'
import mmap, os, sys, time
n, path = int(sys.argv[1]), sys.argv[2]
block = 16 << 20
buf = mmap.mmap(-1, block)
buf.write(os.urandom(block))
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o600)
t = time.monotonic()
done = 0
while done < n:
    done += os.write(fd, buf)
os.fsync(fd)
print(f"{time.monotonic() - t:.6f}")
os.close(fd)
os.unlink(path)
PY
}

best() { python3 -c 'import sys; print(min(float(x) for x in sys.argv[1:]))' "$@"; }

# One side's checkpoint; sets the named result variables. The restores use
# the checkpoint stasis_checkpoint took last, so it comes after
# stasis_checkpoint_criu_pages (which empties the store) in a round.
by_hand_checkpoint() {
	rm -rf "$dir/by-hand"; mkdir -p "$dir/by-hand"
	cold
	local t t2
	t=$(now)
	"$criu_bin" dump -t "$pid" -D "$dir/by-hand" --leave-running -o dump.log
	hand_dump+=("$(since "$t")")
	t2=$(now)
	sync
	hand_sync+=("$(since "$t2")")
	hand_bytes=$(du -sb "$dir/by-hand" | cut -f1)
	wait_counting "$dir/count"
}
clear_store() {
	"$stasis" gc >/dev/null
	for old in $("$stasis" ls --json | python3 -c 'import json,sys; print(" ".join(r["id"] for r in json.load(sys.stdin)))'); do
		"$stasis" rm "$old" >/dev/null
	done
}
# stasis's checkpoint with CRIU writing the memory.
stasis_checkpoint_criu_pages() {
	clear_store
	cold
	local t
	t=$(now)
	"$stasis" checkpoint --pid "$pid" --leave-running --job bench --dump-pages criu >/dev/null
	stasis_criu_pages+=("$(since "$t")")
	wait_counting "$dir/count"
}
stasis_checkpoint() {
	clear_store
	cold
	local t json
	t=$(now)
	json=$("$stasis" checkpoint --pid "$pid" --leave-running --job bench --json)
	stasis_total+=("$(since "$t")")
	id=$(echo "$json" | python3 -c 'import json,sys; print(json.load(sys.stdin)["record"]["id"])')
	stored=$(echo "$json" | python3 -c 'import json,sys; print(json.load(sys.stdin)["record"]["stored_bytes"])')
	stasis_pause+=("$(echo "$json" | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["dump_seconds"]+j["store_seconds"])')")
	stasis_parts+=("$(echo "$json" | python3 -c 'import json,sys; j=json.load(sys.stdin); print("dump %.3f s, store backlog %.3f s, commit %.3f s, %d MiB copied by stasis" % (j["dump_seconds"], j.get("store_backlog_seconds", 0), j.get("commit_seconds", 0), j.get("copied_pages_bytes", 0) >> 20))')")
	wait_counting "$dir/count"
	disk_floor+=("$(direct_write "$stored" "$dir/direct-write")")
}
by_hand_restore() {
	kill -9 "$pid"; wait_gone "$pid"
	cold
	local t
	t=$(now)
	"$criu_bin" restore -D "$dir/by-hand" -d -o restore.log
	hand_restore+=("$(since "$t")")
	wait_counting "$dir/count"
}
stasis_restore() {
	kill -9 "$pid"; wait_gone "$pid"
	cold
	local t
	t=$(now)
	"$stasis" restore "$id" >/dev/null
	stasis_restore+=("$(since "$t")")
	wait_counting "$dir/count"
	if ((!restore_variants)); then
		stasis_restore_stream+=(0); stasis_restore_vf+=(0)
		return
	fi
	kill -9 "$pid"; wait_gone "$pid"
	cold
	t=$(now)
	"$stasis" restore --pages stream "$id" >/dev/null
	stasis_restore_stream+=("$(since "$t")")
	wait_counting "$dir/count"
	kill -9 "$pid"; wait_gone "$pid"
	cold
	t=$(now)
	"$stasis" restore --verify-first "$id" >/dev/null
	stasis_restore_vf+=("$(since "$t")")
	wait_counting "$dir/count"
}

mkdir -p "$dir"
for size in "${sizes[@]}"; do
	rm -rf "$dir/by-hand" "$STASIS_HOME" "$dir/count"
	hand_dump=(); hand_sync=(); disk_floor=(); stasis_total=(); stasis_criu_pages=(); stasis_pause=(); hand_restore=(); stasis_restore=(); stasis_parts=(); stasis_restore_stream=(); stasis_restore_vf=()
	pid=$(sh -c "setsid python3 cli/testdata/memory.py '$dir/count' $size </dev/null >/dev/null 2>&1 & echo \$!")
	until [ -s "$dir/count" ]; do sleep 0.1; done
	wait_counting "$dir/count"
	for ((round = 0; round < rounds; round++)); do
		# Both checkpoints of a round image the same running process; the
		# restores then bring back the by-hand image and stasis's in turn.
		if ((round % 2 == 0)); then
			by_hand_checkpoint; stasis_checkpoint_criu_pages; stasis_checkpoint; by_hand_restore; stasis_restore
		else
			stasis_checkpoint_criu_pages; stasis_checkpoint; by_hand_checkpoint; stasis_restore; by_hand_restore
		fi
		echo "round $((round + 1)): by hand dump ${hand_dump[-1]} s (+ sync ${hand_sync[-1]} s), raw O_DIRECT write of the stored bytes ${disk_floor[-1]} s, restore ${hand_restore[-1]} s; stasis checkpoint ${stasis_total[-1]} s (${stasis_parts[-1]}), with --dump-pages criu ${stasis_criu_pages[-1]} s, restore ${stasis_restore[-1]} s (--pages stream ${stasis_restore_stream[-1]} s, --verify-first ${stasis_restore_vf[-1]} s)" >&2
	done
	kill -9 "$pid"; wait_gone "$pid"

	python3 - "$size" "$(best "${hand_dump[@]}")" "$(best "${hand_sync[@]}")" "$hand_bytes" "$(best "${stasis_total[@]}")" "$(best "${stasis_pause[@]}")" "$stored" "$(best "${hand_restore[@]}")" "$(best "${stasis_restore[@]}")" "$(best "${stasis_restore_stream[@]}")" "$(best "${stasis_restore_vf[@]}")" "$rounds" "$(best "${disk_floor[@]}")" "$(best "${stasis_criu_pages[@]}")" \
		"${hand_dump[*]}" "${stasis_total[*]}" "${stasis_criu_pages[*]}" "${hand_restore[*]}" "${stasis_restore[*]}" <<'PY'
import json, statistics, sys
size, hd, hs, hb, st, sp, sb, hr, sr, ss, svf, rounds, df, scr = sys.argv[1:15]
hd, hs, st, sp, hr, sr, ss, svf, df, scr = map(float, (hd, hs, st, sp, hr, sr, ss, svf, df, scr))
# Medians over the rounds, next to the best times: a ratio of medians
# says whether stasis wins round after round, not once.
mhd, mst, mscr, mhr, msr = (statistics.median(map(float, a.split())) for a in sys.argv[15:20])
hb, sb = int(hb), int(sb)
print(json.dumps({
    "memory_mib": int(size), "rounds": int(rounds),
    "by_hand_dump_s": round(hd, 3), "by_hand_sync_s": round(hs, 3), "by_hand_image_bytes": hb,
    "stasis_checkpoint_s": round(st, 3), "stasis_frozen_s": round(sp, 3), "stasis_stored_bytes": sb,
    "checkpoint_vs_by_hand_dump": round(st / hd, 3),
    "checkpoint_vs_by_hand_dump_sync": round(st / (hd + hs), 3),
    "stasis_checkpoint_criu_pages_s": round(scr, 3),
    "criu_pages_vs_by_hand_dump": round(scr / hd, 3),
    "stored_vs_by_hand_image": round(sb / hb, 3),
    "disk_floor_s": round(df, 3),
    "disk_floor_vs_by_hand_dump": round(df / hd, 3),
    "by_hand_restore_s": round(hr, 3), "stasis_restore_s": round(sr, 3),
    "restore_vs_by_hand": round(sr / hr, 3),
    "median": {
        "by_hand_dump_s": round(mhd, 3), "stasis_checkpoint_s": round(mst, 3),
        "stasis_checkpoint_criu_pages_s": round(mscr, 3),
        "checkpoint_vs_by_hand_dump": round(mst / mhd, 3),
        "criu_pages_vs_by_hand_dump": round(mscr / mhd, 3),
        "by_hand_restore_s": round(mhr, 3), "stasis_restore_s": round(msr, 3),
        "restore_vs_by_hand": round(msr / mhr, 3),
    },
    **({
        "stasis_restore_streamed_s": round(ss, 3),
        "restore_streamed_vs_by_hand": round(ss / hr, 3),
        "stasis_restore_verify_first_s": round(svf, 3),
        "restore_verify_first_vs_by_hand": round(svf / hr, 3),
    } if ss > 0 else {}),
}))
PY
done
rm -rf "$dir/by-hand" "$STASIS_HOME"
