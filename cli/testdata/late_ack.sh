#!/bin/sh
# late_ack.sh: a job that takes up the preemption notice late: once the
# fallback's pre_checkpoint hook (fallback_pre_hook.sh) has created
# $HOOK_OUT/go, it acknowledges the notice, creates $HOOK_OUT/acked, saves
# a checkpoint of its job with `stasis save` and exits 0.
echo data >"$HOOK_OUT/data"
while [ ! -e "$HOOK_OUT/go" ]; do
	sleep 0.02
done
touch "$STASIS_PREEMPT_FILE.ack" "$HOOK_OUT/acked"
exec "$STASIS_BIN" save --job "$STASIS_JOB" --step 7 "$HOOK_OUT/data"
