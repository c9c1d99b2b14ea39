#!/usr/bin/env bash
# Experiment: what slows CRIU's dump while stasis streams the images into the store.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p $O
export STASIS_CRIU=$PWD/.carry/criu STASIS_HOME=/var/tmp/exp/store
mkdir -p /var/tmp/exp
cold() { sync; echo 3 >/proc/sys/vm/drop_caches; }
now() { date +%s.%N; }
pid=$(sh -c "setsid python3 cli/testdata/memory.py /var/tmp/exp/count 8192 </dev/null >/dev/null 2>&1 & echo \$!")
until [ -s /var/tmp/exp/count ]; do sleep 0.1; done; sleep 1
ck() { # name, env...
  local name=$1; shift
  cold
  env "$@" ./bin/stasis-exp checkpoint --pid $pid --leave-running --job exp --json > $O/j.json 2>>$O/log.txt
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(sys.argv[2], "dump %.3f store %.3f total %.3f stored %d" % (j["dump_seconds"], j["store_seconds"], j["total_seconds"], j["record"]["stored_bytes"]))' $O/j.json "$name" | tee -a $O/res.txt
  ./bin/stasis-exp rm $(./bin/stasis-exp ls --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["id"])') >/dev/null
}
for r in 1 2; do
  rm -rf /var/tmp/exp/hand; mkdir -p /var/tmp/exp/hand; cold
  t=$(now); $STASIS_CRIU dump -t $pid -D /var/tmp/exp/hand --leave-running -o d.log; echo "by-hand $(awk -v a=$(now) -v b=$t 'BEGIN{printf "%.3f", a-b}')" | tee -a $O/res.txt
  rm -rf /var/tmp/exp/hand
  ck default
  ck gomaxprocs12 GOMAXPROCS=12
  ck gomaxprocs8 GOMAXPROCS=8
  ck nopunch EXP_NOPUNCH=1
  ck punch64 EXP_PUNCH_MIB=64
  ck punch256 EXP_PUNCH_MIB=256
done
kill -9 $pid; rm -rf /var/tmp/exp
