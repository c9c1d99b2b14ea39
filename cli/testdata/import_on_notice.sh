#!/bin/sh
# import_on_notice.sh EXPORT: a job that answers the preemption notice with
# an old checkpoint of its job: it imports EXPORT (an export of a
# checkpoint created before the notice), then runs on.
while [ ! -e "$STASIS_PREEMPT_FILE" ]; do
	sleep 0.02
done
"$STASIS_BIN" import "$1" >/dev/null || exit 1
while :; do
	sleep 0.05
done
