#!/bin/sh
# ignore_notice.sh PIDS: a job that takes no notice of preemption and
# ignores SIGTERM, as does the child it starts; writes "ITS_PID CHILD_PID"
# to PIDS.
trap '' TERM
sleep 1000 &
echo "$$ $!" >"$1.tmp"
mv "$1.tmp" "$1"
while :; do
	sleep 0.05
done
