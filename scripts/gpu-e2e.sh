#!/usr/bin/env bash
# GPU end-to-end checks of stasis, for a machine with an NVIDIA GPU, the
# driver's checkpoint API, PyTorch and CRIU (root). Each scenario prints
# PASS or FAIL with what it saw; the script exits non-zero if any failed.
#
#   scripts/gpu-e2e.sh [-g GIB] [-d DIR]
#
# A PyTorch process (cli/testdata/gpu_workload.py) holds GIB GiB of GPU
# memory with a known pattern and logs every 0.2 s whether it is intact.
set -uo pipefail
cd "$(dirname "$0")/.."

source scripts/gpu-lib.sh
gpu_setup /var/tmp/stasis-gpu-e2e "$@"

echo "== $(nvidia-smi -L | head -1); $gib GiB of GPU memory per workload"

# 1. Checkpoint with --leave-running: the job goes on with correct data.
log=$dir/leave.log; pid=$(start "$log")
out=$("$stasis" checkpoint --pid "$pid" --leave-running --json 2>&1)
if [ $? -eq 0 ] && healthy "$log"; then
	pass leave-running "$(echo "$out" | python3 -c 'import json,sys; j=json.load(sys.stdin); print("pause %.2f s (lock %.3f, cuda checkpoint %.2f, dump %.2f, store %.2f, cuda resume %.2f), stored %.2f GB of %.2f GB, %.2f GB of memory copied by stasis" % (j["pause_seconds"], j["gpu_lock_seconds"], j["gpu_checkpoint_seconds"], j["dump_seconds"], j["store_seconds"], j["gpu_resume_seconds"], j["record"]["stored_bytes"]/1e9, j["record"]["bytes"]/1e9, j.get("copied_pages_bytes", 0)/1e9))')"
else
	fail leave-running "$out; $(tail -2 "$log")"
fi
echo "   state after: $("$stasis" cuda state --pid "$pid" 2>&1)"

# 2. Checkpoint (the job ends), restore: the job goes on from there, data intact.
out=$("$stasis" checkpoint --pid "$pid" --job e2e --json 2>&1); rc=$?
id=$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["record"]["id"])' 2>/dev/null)
if [ $rc -eq 0 ] && gone "$pid"; then
	steps_at_dump=$(lines "$log")
	rout=$("$stasis" restore "$id" --json 2>&1); rc=$?
	if [ $rc -eq 0 ] && healthy "$log" && [ "$(lines "$log")" -gt "$steps_at_dump" ]; then
		pass checkpoint-restore "$(echo "$rout" | python3 -c 'import json,sys; j=json.load(sys.stdin); print("restored PID %d: unpack %.2f s, criu %.2f s, cuda restore+unlock %.2f s" % (j["pid"], j["unpack_seconds"], j["criu_seconds"], j["gpu_seconds"]))'); $(tail -1 "$log")"
	else
		fail checkpoint-restore "restore: $rout; $(tail -2 "$log")"
	fi
else
	fail checkpoint-restore "checkpoint: rc=$rc $out"
fi
stop "$pid"

# 2b. --fast: the job goes on, the checkpoint is durable afterwards and
#     restores with correct data.
log=$dir/fast.log; pid=$(start "$log")
out=$("$stasis" checkpoint --pid "$pid" --fast --job fast --json 2>&1); rc=$?
id=$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["record"]["id"])' 2>/dev/null)
if [ $rc -eq 0 ] && healthy "$log" && "$stasis" verify "$id" >/dev/null; then
	stop "$pid"
	if "$stasis" restore "$id" >/dev/null && healthy "$log"; then
		pass fast "$(echo "$out" | python3 -c 'import json,sys; j=json.load(sys.stdin); print("pause %.2f s, then stored in %.2f s" % (j["pause_seconds"], j["store_seconds"]))'); restored: $(tail -1 "$log")"
	else
		fail fast "restore failed; $(tail -2 "$log")"
	fi
else
	fail fast "rc=$rc $out; $(tail -2 "$log")"
fi
stop "$pid"

# 3. A lock timeout against a long-running kernel rolls back cleanly.
log=$dir/busy.log; pid=$(start "$log" busy)
sleep 1
out=$("$stasis" checkpoint --pid "$pid" --gpu-lock-timeout 500ms 2>&1); rc=$?
state=$("$stasis" cuda state --pid "$pid" 2>&1)
if [ $rc -eq 10 ] && [[ "$state" == running* ]] && healthy "$log"; then
	pass lock-timeout "exit 10, state $state; $out"
else
	fail lock-timeout "rc=$rc state=$state: $out; $(tail -2 "$log")"
fi
stop "$pid"

# 4. stasis killed with SIGKILL between the lock and the dump: its
#    watchdog restores and unlocks the job, with nobody calling recover.
log=$dir/kill.log; pid=$(start "$log")
"$stasis" checkpoint --pid "$pid" --job killed >/dev/null 2>&1 & spid=$!
for _ in $(seq 200); do
	st=$("$stasis" cuda state --pid "$pid" 2>/dev/null)
	[[ "$st" == locked* || "$st" == checkpointed* ]] && break
	sleep 0.02
done
kill -9 "$spid"; wait "$spid" 2>/dev/null
before=$st
for _ in $(seq 300); do
	st=$("$stasis" cuda state --pid "$pid" 2>/dev/null)
	[[ "$st" == running* ]] && break
	sleep 0.2
done
if [[ "$st" == running* ]] && healthy "$log"; then
	pass kill-then-watchdog "state when killed: $before; the watchdog brought it back: $(cat "$STASIS_HOME"/logs/*-watchdog.log 2>/dev/null | tail -1)"
else
	fail kill-then-watchdog "state when killed: $before; now: $st; $(tail -2 "$log")"
fi
"$stasis" gc >/dev/null

# 5. A job left locked and checkpointed by hand: `stasis recover` brings it
#    back.
"$stasis" cuda lock --pid "$pid" >/dev/null && "$stasis" cuda checkpoint --pid "$pid" >/dev/null
rec=$("$stasis" recover --pid "$pid" 2>&1); rc=$?
if [ $rc -eq 0 ] && healthy "$log"; then
	pass recover "$rec"
else
	fail recover "rc=$rc: $rec; $(tail -2 "$log")"
fi
stop "$pid"

# 6. The job ended and another process took its PID: the restore is
#    refused (exit 9) and works with --new-pidns, data intact.
log=$dir/pidns.log; pid=$(start "$log")
id=$("$stasis" checkpoint --pid "$pid" --job pidns 2>/dev/null)
gone "$pid"
echo $((pid - 1)) >/proc/sys/kernel/ns_last_pid
sh -c 'exec sleep 600' & holder=$!
if [ "$holder" != "$pid" ]; then
	fail new-pidns "could not take PID $pid for the test (got $holder)"
else
	"$stasis" restore "$id" --pid-wait 100ms >/dev/null 2>&1; rc=$?
	copy=$("$stasis" restore "$id" --new-pidns 2>&1 | tail -1)
	if [ $rc -eq 9 ] && [[ "$copy" =~ ^[0-9]+$ ]] && healthy "$log"; then
		pass new-pidns "PID $pid taken (exit 9), restored as $copy ($(grep NSpid /proc/$copy/status | tr -s '\t' ' ')); $(tail -1 "$log")"
	else
		fail new-pidns "plain restore rc=$rc; --new-pidns: $copy; $(tail -2 "$log")"
	fi
	[[ "$copy" =~ ^[0-9]+$ ]] && stop "$copy"
fi
kill "$holder" 2>/dev/null

# 7. A job with an NCCL process group (it holds an io_uring, and the
#    driver's checkpoint does not support NCCL): refused before anything is
#    locked (exit 16), and it runs on, its all-reduces right.
log=$dir/nccl.log
pid=$(sh -c "setsid python3 cli/testdata/nccl_job.py '$log' </dev/null >>'$log.err' 2>&1 & echo \$!")
for _ in $(seq 300); do [ -s "$log" ] && break; sleep 0.2; done
t0=$EPOCHREALTIME
out=$("$stasis" checkpoint --pid "$pid" 2>&1); rc=$?
took=$(awk "BEGIN { printf \"%.3f\", $EPOCHREALTIME - $t0 }")
state=$("$stasis" cuda state --pid "$pid" 2>&1)
if [ $rc -eq 16 ] && [[ "$state" == running* ]] && healthy "$log"; then
	pass nccl-refused "exit 16 in ${took} s, state $state; $out; $(tail -1 "$log")"
else
	fail nccl-refused "rc=$rc state=$state: $out; $(tail -2 "$log") $(tail -2 "$log.err")"
fi
stop "$pid"

echo "== $failures failed"
exit $((failures > 0))
