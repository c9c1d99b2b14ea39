#!/usr/bin/env bash
# Makes a CRIU >= 4.0 available to stasis. Run by `make`.
#
# Kernels from 6.13 on split the vvar area, and CRIU before 4.1 fails there
# ("vdso: Unexpected rt vDSO area bounds"), so Debian bookworm's 3.17 is not
# enough. In order of preference:
#   1. a criu >= 4.0 already on PATH (or bin/criu built earlier): nothing to do;
#   2. the distribution's criu package, if its candidate is >= 4.0;
#   3. CRIU 4.1.1 built from Debian trixie's source tarball (fetched and
#      checked against its pinned SHA-256 by fetch-criu-source.sh) into
#      bin/criu.
# stasis looks for criu in $STASIS_CRIU, then next to its own binary
# (bin/criu), then on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

CRIU_VERSION=4.1.1 # the version fetch-criu-source.sh pins
BUILD_DIR=build/criu
DEST=bin/criu

say() { echo "install-criu: $*"; }

version_of() { "$1" --version 2>/dev/null | sed -n 's/^Version: *//p' | head -n1; }
at_least_4() { local major=${1%%.*}; [[ "$major" =~ ^[0-9]+$ ]] && [ "$major" -ge 4 ]; }

for candidate in "$DEST" "$(command -v criu || true)"; do
	[ -n "$candidate" ] && [ -x "$candidate" ] || continue
	v=$(version_of "$candidate")
	if at_least_4 "$v"; then
		say "$candidate is CRIU $v: nothing to do"
		exit 0
	fi
	say "$candidate is CRIU ${v:-of unknown version}: too old for kernels >= 6.13"
done

if [ "$(id -u)" -ne 0 ]; then
	say "building CRIU needs Debian packages; run make as root (or install CRIU >= 4.0 yourself)" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive

candidate=$(apt-cache policy criu 2>/dev/null | sed -n 's/^ *Candidate: *//p')
if at_least_4 "${candidate#*:}"; then
	say "installing the distribution's criu $candidate"
	apt-get install -y -qq criu >/dev/null
	exit 0
fi

say "building CRIU $CRIU_VERSION from source (the distribution offers ${candidate:-none})"
deps=(build-essential libbsd-dev libcap-dev libgnutls28-dev libnet1-dev libnftables-dev
	libnl-3-dev libprotobuf-c-dev libprotobuf-dev pkgconf protobuf-c-compiler
	protobuf-compiler uuid-dev python3-protobuf xz-utils iproute2)
missing=()
for p in "${deps[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	say "installing build dependencies: ${missing[*]}"
	apt-get update -qq
	apt-get install -y -qq "${missing[@]}" >/dev/null
fi

tarball=$(./scripts/fetch-criu-source.sh "$BUILD_DIR")

src="$BUILD_DIR/criu-$CRIU_VERSION"
rm -rf "$src"
tar -C "$BUILD_DIR" -xf "$tarball"
say "compiling (about a minute on 2 cores)"
make -C "$src" -j"$(nproc)" criu >"$BUILD_DIR/build.log" 2>&1 || {
	tail -n 30 "$BUILD_DIR/build.log" >&2
	say "build failed; the full log is $BUILD_DIR/build.log" >&2
	exit 1
}
mkdir -p bin
install -m 0755 "$src/criu/criu" "$DEST"
say "installed $DEST: CRIU $(version_of "$DEST")"
