#!/bin/sh
# signals.sh OUT: appends "ready", then the name of each SIGINT, SIGHUP and
# SIGUSR2 it gets to OUT; on SIGTERM appends TERM and exits with status 3.
for sig in INT HUP USR2; do
	trap "echo $sig >>'$1'" "$sig"
done
trap "echo TERM >>'$1'; exit 3" TERM
echo ready >>"$1"
while :; do
	sleep 0.05
done
