#!/bin/sh
# fallback_pre_hook.sh: a pre_checkpoint hook that, for a process
# checkpoint (STASIS_KIND=process: the fallback's), lets late_ack.sh go on
# and waits for its acknowledgement (10s at most).
[ "$STASIS_KIND" = process ] || exit 0
touch "$HOOK_OUT/go"
i=0
while [ ! -e "$HOOK_OUT/acked" ] && [ $i -lt 500 ]; do
	sleep 0.02
	i=$((i + 1))
done
