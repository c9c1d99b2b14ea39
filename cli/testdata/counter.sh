#!/bin/sh
# counter.sh OUT: appends 1, 2, 3, ... to OUT, one line every 20 ms.
i=0
while :; do
	i=$((i + 1))
	echo "$i" >>"$1"
	sleep 0.02
done
