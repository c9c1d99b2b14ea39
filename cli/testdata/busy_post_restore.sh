#!/bin/sh
# busy_post_restore.sh: a post_restore hook that leaves 40 short-lived
# orphans to stasis run (each one's end is a SIGCHLD to it), then sends its
# parent, stasis run, the preemption signal (recording the time, in seconds,
# to $HOOK_OUT/sent) and takes 3 more seconds before it ends.
i=0
while [ $i -lt 40 ]; do
	(true &)
	i=$((i + 1))
done
sleep 0.5
date +%s >"$HOOK_OUT/sent"
kill -USR1 "$PPID"
sleep 3
