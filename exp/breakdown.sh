#!/usr/bin/env bash
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p $O
export STASIS_CRIU=$PWD/.carry/criu STASIS_HOME=/var/tmp/exp/store
mkdir -p /var/tmp/exp
cold() { sync; echo 3 >/proc/sys/vm/drop_caches; }
pid=$(sh -c "setsid python3 cli/testdata/memory.py /var/tmp/exp/count 8192 </dev/null >/dev/null 2>&1 & echo \$!")
until [ -s /var/tmp/exp/count ]; do sleep 0.1; done; sleep 1
for r in 1 2 3; do
  cold
  ./bin/stasis checkpoint --pid $pid --leave-running --job exp --json > $O/j$r.json 2>>$O/log.txt
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print({k: round(v,3) for k,v in j.items() if k.endswith("seconds")})' $O/j$r.json | tee -a $O/res.txt
  ./bin/stasis rm $(./bin/stasis ls --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["id"])') >/dev/null
done
kill -9 $pid; rm -rf /var/tmp/exp
