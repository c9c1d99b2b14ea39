#!/usr/bin/env bash
# Builds SeaweedFS's `weed`, the real S3 server the object-store tests run
# against (internal/s3test), once, into a cache outside the repository, and
# reuses it afterwards. Run by `make` (deps). Safe to run again.
#
# The version is pinned to one module version the Go module proxy serves.
# `go install` refuses the module's replace directives, so the module
# directory is copied somewhere writable and `go build ./weed` runs inside
# it: about 7 minutes on 2 cores, 233 MB of binary.
#
# STASIS_WEED_CACHE overrides the cache directory (default
# /var/cache/stasis, or ~/.cache/stasis where that is not writable). The
# tests look for weed in $STASIS_WEED, then at the cached path, then on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

SEAWEEDFS_MODULE=github.com/seaweedfs/seaweedfs
SEAWEEDFS_VERSION=v0.0.0-20261109003541-7506e5f91cd6

say() { echo "install-seaweedfs: $*"; }

cache=${STASIS_WEED_CACHE:-}
if [ -z "$cache" ]; then
	cache=/var/cache/stasis
	if ! mkdir -p "$cache" 2>/dev/null || [ ! -w "$cache" ]; then
		cache=${XDG_CACHE_HOME:-$HOME/.cache}/stasis
	fi
fi
dest=$cache/seaweedfs-$SEAWEEDFS_VERSION
weed=$dest/weed

if [ -x "$weed" ] && "$weed" version >/dev/null 2>&1; then
	say "$weed is there: nothing to do"
	exit 0
fi

if ! command -v go >/dev/null 2>&1; then
	if [ -x /usr/local/go/bin/go ]; then
		export PATH=$PATH:/usr/local/go/bin
	else
		say "no Go toolchain: install Go and run make again" >&2
		exit 1
	fi
fi

mkdir -p "$dest"
# One build at a time into this cache (two makes at once wait here; the
# second then finds the binary).
exec 9>"$dest/.lock"
flock 9
if [ -x "$weed" ] && "$weed" version >/dev/null 2>&1; then
	say "$weed is there: nothing to do"
	exit 0
fi
say "downloading $SEAWEEDFS_MODULE@$SEAWEEDFS_VERSION"
moddir=$(go mod download -json "$SEAWEEDFS_MODULE@$SEAWEEDFS_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
if [ -z "$moddir" ] || [ ! -d "$moddir" ]; then
	say "go mod download gave no module directory" >&2
	exit 1
fi

# The module cache is read-only; build in a writable copy, then keep only
# the binary.
src=$dest/src
rm -rf "$src"
cp -r "$moddir" "$src"
chmod -R u+w "$src"
say "building weed (several minutes; the log is $dest/build.log)"
start=$(date +%s)
if ! (cd "$src" && go build -o "$weed.tmp" ./weed) >"$dest/build.log" 2>&1; then
	tail -n 20 "$dest/build.log" >&2
	say "building weed failed; the object-store tests will skip" >&2
	exit 1
fi
mv "$weed.tmp" "$weed"
rm -rf "$src"
say "built $weed in $(( $(date +%s) - start )) s"
