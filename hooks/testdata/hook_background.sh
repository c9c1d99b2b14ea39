#!/bin/sh
# hook_background.sh: a hook that leaves a child in the background, holding
# its stdout and stderr, records the child's PID in $HOOK_OUT/child.pid and
# exits 0.
sleep 5 &
echo $! >"$HOOK_OUT/child.pid"
echo "upload started" >&2
exit 0
