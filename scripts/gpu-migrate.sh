#!/usr/bin/env bash
# GPU checks of moving a job between GPUs, for a machine with two NVIDIA
# GPUs of one model, the driver's checkpoint API, PyTorch and CRIU (root).
# Each scenario prints PASS or FAIL with what it saw; the script exits
# non-zero if any failed.
#
#   scripts/gpu-migrate.sh [-g GIB] [-d DIR]
#
# The workload is gpu-e2e.sh's: a PyTorch process (cli/testdata/
# gpu_workload.py) holding GIB GiB of GPU memory with a known pattern,
# logging every 0.2 s whether it is intact. GPUs are named by UUID, as
# nvidia-smi reports them, so that nvidia-smi's and CUDA's orders cannot be
# confused; where a process runs is read from nvidia-smi.
#
#   a. migrate: the job is moved to the other GPU in place (stasis migrate
#      --to-gpu), and back (--gpu-map); data intact, each step timed.
#   a2. a migration whose lock times out (a long kernel) is rolled back:
#      exit 10, the job stays on its GPU, data intact.
#   b. restore onto another GPU: the job is checkpointed on its GPU (after
#      a --leave-running checkpoint, so that the second one finds the
#      library hashes cached), exported and imported into a second store
#      (another "node"), and restored from there with --gpu-map onto the
#      other GPU; data intact.
set -uo pipefail
cd "$(dirname "$0")/.."

source scripts/gpu-lib.sh
gpu_setup /var/tmp/stasis-gpu-migrate "$@"

# gpu_of PID: the UUID of the GPU the process has memory on ("" if none).
gpu_of() { nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv,noheader | awk -F', ' -v p="$1" '$1 == p { print $2 }' | paste -sd, -; }
# mib_on PID: the GPU memory the process holds, in MiB.
mib_on() { nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -F', ' -v p="$1" '$1 == p { print $2 }' | paste -sd, -; }
other_than() { nvidia-smi --query-gpu=uuid --format=csv,noheader | grep -v "^$1\$" | head -1; }

echo "== $(nvidia-smi -L | paste -sd';' -); $gib GiB of GPU memory per workload"
if [ "$(nvidia-smi -L | wc -l)" -lt 2 ]; then
	echo "FAIL setup: these scenarios need two GPUs"; exit 1
fi

# a. Migrate there and back.
log=$dir/migrate.log; pid=$(start "$log")
from=$(gpu_of "$pid"); to=$(other_than "$from")
out=$("$stasis" migrate --pid "$pid" --to-gpu "$to" --json 2>"$dir/stderr"); rc=$?
now=$(gpu_of "$pid")
if [ $rc -eq 0 ] && [ "$now" = "$to" ] && healthy "$log"; then
	pass migrate "from $from to $to ($(mib_on "$pid") MiB there now): $(echo "$out" | field '"lock %.3f s, checkpoint %.2f s, restore %.2f s, unlock %.3f s, total %.2f s" % (j["lock_seconds"], j["checkpoint_seconds"], j["restore_seconds"], j["unlock_seconds"], j["total_seconds"])'); $(tail -1 "$log")"
else
	fail migrate "rc=$rc, on $now (from $from, to $to): $out $(cat "$dir/stderr"); $(tail -2 "$log"); $(tail -2 "$log.err")"
fi
out=$("$stasis" migrate --pid "$pid" --gpu-map "$to=$from" 2>&1); rc=$?
now=$(gpu_of "$pid")
if [ $rc -eq 0 ] && [ "$now" = "$from" ] && healthy "$log"; then
	pass migrate-back "$out; $(tail -1 "$log")"
else
	fail migrate-back "rc=$rc, on $now: $out; $(tail -2 "$log")"
fi
stop "$pid"

# a2. A lock that times out against a long kernel: rolled back.
log=$dir/busy.log; pid=$(start "$log" busy)
sleep 1
from=$(gpu_of "$pid"); to=$(other_than "$from")
out=$("$stasis" migrate --pid "$pid" --to-gpu "$to" --gpu-lock-timeout 500ms 2>&1); rc=$?
state=$("$stasis" cuda state --pid "$pid" 2>&1); now=$(gpu_of "$pid")
if [ $rc -eq 10 ] && [[ "$state" == running* ]] && [ "$now" = "$from" ] && healthy "$log"; then
	pass migrate-lock-timeout "exit 10, state $state, still on $now; $out"
else
	fail migrate-lock-timeout "rc=$rc state=$state on $now (was $from): $out; $(tail -2 "$log")"
fi
stop "$pid"

# b. Checkpoint on one GPU, export, import into another store, restore
#    onto the other GPU.
log=$dir/restore.log; pid=$(start "$log")
from=$(gpu_of "$pid"); to=$(other_than "$from")
first=$("$stasis" checkpoint --pid "$pid" --leave-running --json 2>"$dir/stderr"); rc1=$?
out=$("$stasis" checkpoint --pid "$pid" --job moved --json 2>>"$dir/stderr"); rc=$?
id=$(echo "$out" | field 'j["record"]["id"]' 2>/dev/null)
if [ $rc1 -ne 0 ] || [ $rc -ne 0 ] || ! gone "$pid"; then
	fail restore-other-gpu "checkpoints: rc=$rc1 $first; rc=$rc $out; $(cat "$dir/stderr")"
else
	hashes="library hashes $(echo "$first" | field '"%.2f s cold (pause %.2f s)" % (j["hash_seconds"], j["pause_seconds"])'), $(echo "$out" | field '"%.3f s cached" % j["hash_seconds"]')"
	t0=$(date +%s.%N)
	"$stasis" export "$id" 2>"$dir/export.err" | STASIS_HOME=$dir/store-b "$stasis" import - >/dev/null 2>"$dir/import.err"; rc=$?
	moved=$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.2f", a - b }')
	steps=$(lines "$log")
	rout=$(STASIS_HOME=$dir/store-b "$stasis" restore "$id" --gpu-map "$from=$to" --json 2>"$dir/stderr"); rrc=$?
	new=$(echo "$rout" | field 'j["pid"]' 2>/dev/null)
	now=$(gpu_of "$new")
	if [ $rc -eq 0 ] && [ $rrc -eq 0 ] && [ "$now" = "$to" ] && healthy "$log" && [ "$(lines "$log")" -gt "$steps" ]; then
		pass restore-other-gpu "checkpointed on $from, export|import $moved s, restored as PID $new on $now: $(echo "$rout" | field '"unpack %.2f s, criu %.2f s, cuda restore+unlock %.2f s, remapped %s" % (j["unpack_seconds"], j["criu_seconds"], j["gpu_seconds"], j["gpu_remapped"])'); $hashes; $(tail -1 "$log")"
	else
		fail restore-other-gpu "export|import rc=$rc $(cat "$dir/export.err" "$dir/import.err"); restore rc=$rrc: $rout $(cat "$dir/stderr"); on $now (want $to); $(tail -2 "$log")"
	fi
	[[ "$new" =~ ^[0-9]+$ ]] && stop "$new"
fi
stop "$pid"

echo "== $failures failed"
exit $((failures > 0))
