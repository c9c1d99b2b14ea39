#!/bin/sh
# pipeline.sh OUT: a tree of three processes. A writer counts into a pipe; a
# reader appends what it reads to OUT through one descriptor (3) opened here.
exec 3>>"$1"
i=0
while :; do
	i=$((i + 1))
	echo "$i"
	sleep 0.02
done | while read -r n; do
	echo "$n" >&3
done
