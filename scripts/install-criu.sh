#!/usr/bin/env bash
# Makes a CRIU >= 4.0 available to stasis. Run by `make`.
#
# Kernels from 6.13 on split the vvar area, and CRIU before 4.1 fails there
# ("vdso: Unexpected rt vDSO area bounds"), so Debian bookworm's 3.17 is not
# enough. In order of preference:
#   1. a criu >= 4.0 already on PATH (or bin/criu built earlier): nothing to do;
#   2. the distribution's criu package, if its candidate is >= 4.0;
#   3. CRIU 4.1.1 built from Debian trixie's source tarball (its SHA-256 is
#      pinned below and matches trixie's signed Sources index) into bin/criu.
# stasis looks for criu in $STASIS_CRIU, then next to its own binary
# (bin/criu), then on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

CRIU_VERSION=4.1.1
CRIU_TARBALL=criu_${CRIU_VERSION}.orig.tar.xz
CRIU_SHA256=f80a66cb3726bb2116266d4759ce3bcbfab7abdb6b6d430bf20dd41911717afe
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

mkdir -p "$BUILD_DIR"
tarball="$BUILD_DIR/$CRIU_TARBALL"
if ! echo "$CRIU_SHA256  $tarball" | sha256sum -c --status 2>/dev/null; then
	# Fetch the tarball with apt from trixie's source index, through a
	# private source list: the system's apt configuration is not touched.
	apt_dir=$(mktemp -d)
	trap 'rm -rf "$apt_dir"' EXIT
	mkdir -p "$apt_dir/lists/partial" "$apt_dir/parts"
	echo "deb-src http://deb.debian.org/debian trixie main" >"$apt_dir/sources.list"
	apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o "Dir::Etc::SourceParts=$apt_dir/parts"
		-o "Dir::State::Lists=$apt_dir/lists")
	apt-get "${apt_opts[@]}" update -qq
	# The .dsc is sometimes missing from the mirror while the tarball is
	# there; apt then fails after fetching what it could.
	(cd "$BUILD_DIR" && apt-get "${apt_opts[@]}" source --download-only criu >/dev/null 2>&1) || true
	if ! echo "$CRIU_SHA256  $tarball" | sha256sum -c --status; then
		say "could not fetch $CRIU_TARBALL with the expected SHA-256" >&2
		exit 1
	fi
fi

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
