#!/bin/sh
# hook_hang.sh: a hook script that starts a child and never ends; it writes
# the child's PID to $HOOK_OUT/child.pid.
sleep 1000 &
echo $! >"$HOOK_OUT/child.pid"
wait
