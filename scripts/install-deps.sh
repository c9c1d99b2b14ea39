#!/usr/bin/env bash
# Installs what building and testing stasis needs on a Debian or Ubuntu
# machine, then downloads the Go modules. Safe to run again: it installs only
# what is missing. Run by `make`.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "install-deps: $*"; }

# Go: the module's go line names the version; a Go >= 1.21 fetches it itself
# (GOTOOLCHAIN=auto) through the module proxy.
if ! command -v go >/dev/null 2>&1; then
	if [ -x /usr/local/go/bin/go ]; then
		say "Go is at /usr/local/go/bin; add it to PATH"
		export PATH=$PATH:/usr/local/go/bin
	else
		say "no Go toolchain: install Go >= 1.21 (https://go.dev/dl) and run make again" >&2
		exit 1
	fi
fi

# Debian packages the tests use: gcc (the C ABI's test program, shared
# libraries for doctor's tests), util-linux (flock, script), e2fsprogs
# (mkfs.ext4 for the disk-full test), diffutils, and Python 3 with NumPy
# and PyTorch (the Python package's tests; Debian's, used as
# /usr/bin/python3).
need=()
for tool in gcc:gcc flock:util-linux script:bsdutils mkfs.ext4:e2fsprogs diff:diffutils losetup:mount; do
	command -v "${tool%%:*}" >/dev/null 2>&1 || need+=("${tool#*:}")
done
if ! /usr/bin/python3 -c 'import numpy' >/dev/null 2>&1; then
	need+=(python3 python3-numpy)
fi
# PyTorch (Debian's 1.13, CPU only) for the DataLoader job checkpointed
# through stasis (scripts/gpu-dataloader.sh on the CPU).
if ! /usr/bin/python3 -c 'import torch' >/dev/null 2>&1; then
	need+=(python3-torch)
fi
# SLURM (Debian's slurm-wlm: slurmctld, slurmd and the commands) and munge,
# for the test that runs a real one-node SLURM (internal/slurmtest,
# cli/slurm_test.go). Nothing is configured or started here: the test
# writes its own configuration and starts the daemons itself.
command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 || need+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || need+=(munge)
# CRIU's own tests (zdtm-build.sh builds them, internal/zdtm runs them):
# make, a C compiler, xz for the source tarball, and the libraries they link
# (libaio for aio00, libnl-route for netns_sub_veth, protobuf-c for
# criu-rtc.so), needed even where CRIU itself comes from the distribution.
for p in make gcc pkgconf xz-utils libaio-dev libcap-dev libnl-3-dev libnl-route-3-dev libprotobuf-c-dev protobuf-c-compiler; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" -ne 0 ]; then
		say "missing packages: ${need[*]}; install them as root (apt-get install ${need[*]})" >&2
		exit 1
	fi
	say "installing ${need[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq "${need[@]}" >/dev/null
fi

say "downloading Go modules"
go mod download
say "done"
