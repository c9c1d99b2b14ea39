# Shared by the GPU scripts (gpu-e2e.sh, gpu-migrate.sh, bench-gpu.sh,
# gpu-dataloader.sh):
# their options, and the self-checking PyTorch workload
# (cli/testdata/gpu_workload.py) they run. Source it from the repository
# root.

# gpu_setup DEFAULT_DIR "$@": reads -g GIB (default 8) and -d DIR into
# $gib and $dir, empties DIR, and points $stasis at bin/stasis and
# STASIS_HOME at DIR/store.
gpu_setup() {
	dir=$1; shift
	gib=8
	local opt OPTIND=1
	while getopts "g:d:" opt; do
		case $opt in
		g) gib=$OPTARG ;;
		d) dir=$OPTARG ;;
		*) echo "usage: $0 [-g GIB] [-d DIR]" >&2; exit 2 ;;
		esac
	done
	stasis=$PWD/bin/stasis
	export STASIS_HOME=$dir/store
	rm -rf "$dir"; mkdir -p "$dir"
}

failures=0
pass() { echo "PASS $1: $2"; }
fail() { echo "FAIL $1: $2"; failures=$((failures + 1)); }
lines() { if [ -e "$1" ]; then wc -l <"$1"; else echo 0; fi; }
# healthy LOG: the workload logs new steps, all ok.
healthy() {
	local n; n=$(lines "$1")
	for _ in $(seq 150); do
		[ "$(lines "$1")" -gt "$((n + 2))" ] && break
		sleep 0.2
	done
	[ "$(lines "$1")" -gt "$((n + 2))" ] && ! grep -q "ok=False" "$1"
}
start() { # start LOG [busy|weights]: prints the PID once the workload is checking
	local pid
	pid=$(sh -c "setsid python3 cli/testdata/gpu_workload.py '$1' $gib ${2:-} </dev/null >>'$1.err' 2>&1 & echo \$!")
	for _ in $(seq 600); do [ -s "$1" ] && break; sleep 0.2; done
	echo "$pid"
}
gone() { for _ in $(seq 300); do [ -d /proc/$1 ] || return 0; sleep 0.1; done; return 1; }
stop() { kill -9 "$1" 2>/dev/null; gone "$1"; }
field() { python3 -c "import json,sys; j=json.load(sys.stdin); print($1)"; }
