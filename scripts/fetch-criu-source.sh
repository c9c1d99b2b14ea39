#!/usr/bin/env bash
# Usage: fetch-criu-source.sh DIR [FROM...]
#
# Makes DIR/criu_4.1.1.orig.tar.xz, CRIU's upstream source tarball as Debian
# trixie ships it, present and checked against the SHA-256 pinned below (it
# matches trixie's signed Sources index), and prints its path. A tarball
# already there with that hash is kept, one in a FROM directory with that
# hash is copied; otherwise apt fetches it from
# trixie's source index through a private source list (the system's apt
# configuration is not touched). Used by install-criu.sh (to build CRIU) and
# zdtm-build.sh (CRIU's own test suite, needed even when CRIU is not built).
set -euo pipefail

CRIU_VERSION=4.1.1
CRIU_TARBALL=criu_${CRIU_VERSION}.orig.tar.xz
CRIU_SHA256=f80a66cb3726bb2116266d4759ce3bcbfab7abdb6b6d430bf20dd41911717afe

say() { echo "fetch-criu-source: $*" >&2; }

if [ $# -lt 1 ]; then
	say "usage: $0 DIR [FROM...]"
	exit 2
fi
dir=$1
shift
tarball="$dir/$CRIU_TARBALL"
ok() { echo "$CRIU_SHA256  $1" | sha256sum -c --status 2>/dev/null; }

if ! ok "$tarball"; then
	for from in "$@"; do
		if ok "$from/$CRIU_TARBALL"; then
			mkdir -p "$dir"
			cp "$from/$CRIU_TARBALL" "$tarball.partial"
			mv "$tarball.partial" "$tarball"
			break
		fi
	done
fi
if ! ok "$tarball"; then
	mkdir -p "$dir"
	apt_dir=$(mktemp -d)
	trap 'rm -rf "$apt_dir"' EXIT
	mkdir -p "$apt_dir/lists/partial" "$apt_dir/parts"
	echo "deb-src http://deb.debian.org/debian trixie main" >"$apt_dir/sources.list"
	apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o "Dir::Etc::SourceParts=$apt_dir/parts"
		-o "Dir::State::Lists=$apt_dir/lists")
	say "fetching $CRIU_TARBALL from Debian trixie's sources"
	apt-get "${apt_opts[@]}" update -qq
	# The .dsc is sometimes missing from the mirror while the tarball is
	# there; apt then fails after fetching what it could.
	(cd "$dir" && apt-get "${apt_opts[@]}" source --download-only criu >/dev/null 2>&1) || true
	if ! ok "$tarball"; then
		say "could not fetch $CRIU_TARBALL with the expected SHA-256 into $dir"
		exit 1
	fi
fi
echo "$tarball"
