#!/usr/bin/env bash
# A training job fed by a DataLoader with persistent worker processes,
# checkpointed mid-training and restored, against the same job run without
# a break: for each start method of the workers, the loss of every step
# must be the same, bit for bit (cli/testdata/dataloader_train.py). The
# methods named by -r may instead be refused, as long as the job runs on
# and its losses match too; any other refusal fails. Root, after make, with
# PyTorch.
#
#   scripts/gpu-dataloader.sh [-n STEPS] [-m "spawn forkserver fork"] [-r "fork"] [-D cuda|cpu] [-d DIR]
#
# On the GPU machine it runs on the GPU; `make test` runs it on the CPU
# with few steps (TestDataLoaderScript), where Debian's PyTorch is there.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-lib.sh # pass, fail, lines, gone

steps=150
methods="spawn forkserver fork"
may_refuse=
device=
dir=/var/tmp/stasis-dataloader
while getopts "n:m:r:D:d:" opt; do
	case $opt in
	n) steps=$OPTARG ;;
	m) methods=$OPTARG ;;
	r) may_refuse=$OPTARG ;;
	D) device=$OPTARG ;;
	d) dir=$OPTARG ;;
	*) echo "usage: $0 [-n STEPS] [-m METHODS] [-r METHODS] [-D DEVICE] [-d DIR]" >&2; exit 2 ;;
	esac
done
stasis=$PWD/bin/stasis
export STASIS_HOME=$dir/store
rm -rf "$dir"; mkdir -p "$dir"
# start LOG METHOD (gpu-lib.sh's start is for its own workload): the job's PID (setsid in a subshell: init reaps it)
start() {
	sh -c "setsid python3 cli/testdata/dataloader_train.py '$1' $steps $2 $device </dev/null >>'$1.err' 2>&1 & echo \$!"
}
# finish LOG: waits for the job to write its last step
finish() { for _ in $(seq 1200); do [ -e "$1.done" ] && return 0; sleep 0.1; done; return 1; }

echo "== $(python3 -c 'import torch; print("torch", torch.__version__, "on", torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")') ${device:+($device)}, $steps steps"
for method in $methods; do
	ref=$dir/$method.ref
	start "$ref" "$method" >/dev/null
	if ! finish "$ref"; then
		fail "$method" "the run without a break did not finish: $(tail -3 "$ref.err")"
		continue
	fi
	log=$dir/$method.log
	pid=$(start "$log" "$method")
	at=$((steps / 3))
	for _ in $(seq 1200); do [ "$(lines "$log")" -ge "$at" ] && break; sleep 0.05; done
	out=$("$stasis" checkpoint --pid "$pid" --json 2>&1); rc=$?
	if [ $rc -eq 0 ]; then
		id=$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["record"]["id"])')
		done_at=$(lines "$log")
		if ! gone "$pid"; then
			fail "$method" "the job still runs after the checkpoint"
			continue
		fi
		rout=$("$stasis" restore "$id" --json 2>&1); rrc=$?
		if [ $rrc -ne 0 ]; then
			fail "$method" "checkpoint at step $done_at, restore exit $rrc: $rout"
			continue
		fi
		what="checkpointed at step $done_at ($(echo "$out" | python3 -c 'import json,sys; j=json.load(sys.stdin); print("%.2f GB stored, dump_pages %s, paused %.2f s" % (j["record"]["stored_bytes"]/1e9, j["dump_pages"], j["pause_seconds"]))')), restored ($(echo "$rout" | python3 -c 'import json,sys; j=json.load(sys.stdin); print("%.2f s, %d MB checked" % (j["total_seconds"], j["checked_bytes"]/1e6))'))"
	else
		# Refused: nothing may have been touched.
		if [[ " $may_refuse " != *" $method "* ]]; then
			fail "$method" "checkpoint refused (exit $rc): $out"
			tail -n 25 "$(ls -t "$STASIS_HOME"/logs/*-dump.log 2>/dev/null | head -1)" 2>/dev/null | sed 's/^/   | /'
			kill -9 -- -"$pid" 2>/dev/null
			continue
		fi
		if ! [ -d /proc/$pid ]; then
			fail "$method" "checkpoint exit $rc and the job is gone: $out"
			continue
		fi
		what="refused (exit $rc: $out), the job ran on"
	fi
	if ! finish "$log"; then
		fail "$method" "$what; the job did not finish: $(tail -3 "$log.err")"
	elif cmp -s "$ref" "$log"; then
		pass "$method" "$what; all $steps losses identical to the run without a break (last: $(tail -1 "$log"))"
	else
		fail "$method" "$what; losses differ: $(diff "$ref" "$log" | head -4 | tr '\n' ' ')"
	fi
done
echo "== $failures failed"
exit $((failures > 0))
