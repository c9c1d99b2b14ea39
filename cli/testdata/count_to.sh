#!/bin/sh
# count_to.sh OUT LIMIT: appends 1, 2, ... LIMIT to OUT, one line every
# 20 ms, printing each on stdout too, then exits with status 7.
i=0
while [ "$i" -lt "$2" ]; do
	i=$((i + 1))
	echo "$i" >>"$1"
	echo "count $i"
	sleep 0.02
done
exit 7
