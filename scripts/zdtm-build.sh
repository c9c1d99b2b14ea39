#!/usr/bin/env bash
# Usage: zdtm-build.sh          build CRIU's zdtm static tests (once; cached)
#        zdtm-build.sh --dir    print their directory, or fail if not built
#
# CRIU's own test suite, test/zdtm/static of the CRIU 4.1.1 source, run
# through stasis by internal/zdtm (`make test`: a subset; `make zdtm`: all of
# it). The source is fetched by fetch-criu-source.sh whether or not CRIU
# itself was built here, and the build is cached outside the repository, in
# $STASIS_ZDTM_CACHE, else /var/cache/stasis/zdtm-4.1.1 for root, else
# ${XDG_CACHE_HOME:-~/.cache}/stasis/zdtm-4.1.1; a finished build there is
# reused (delete the directory to rebuild). Run by `make`; the -dev packages
# the tests link with are installed by install-deps.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

CRIU_VERSION=4.1.1 # the version fetch-criu-source.sh pins
if [ -n "${STASIS_ZDTM_CACHE:-}" ]; then
	cache=$STASIS_ZDTM_CACHE
elif [ "$(id -u)" -eq 0 ]; then
	cache=/var/cache/stasis/zdtm-$CRIU_VERSION
else
	cache=${XDG_CACHE_HOME:-$HOME/.cache}/stasis/zdtm-$CRIU_VERSION
fi
src=$cache/criu-$CRIU_VERSION
static=$src/test/zdtm/static
stamp=$cache/built

say() { echo "zdtm-build: $*" >&2; }

if [ "${1:-}" = --dir ]; then
	if [ ! -e "$stamp" ]; then
		say "CRIU's zdtm tests are not built in $cache (run make, or scripts/zdtm-build.sh)"
		exit 1
	fi
	echo "$static"
	exit 0
fi

mkdir -p "$cache"
# One build at a time (several worktrees may run make at once).
exec 9>"$cache/lock"
flock 9
if [ -e "$stamp" ]; then
	say "built in $static: nothing to do"
	exit 0
fi

# CRIU's own build may have fetched the tarball already.
tarball=$(./scripts/fetch-criu-source.sh "$cache" build/criu)
rm -rf "$src"
tar -C "$cache" -xf "$tarball"
say "compiling CRIU's zdtm static tests into $static (a few minutes on 2 cores)"
log=$cache/build.log
if ! { make -C "$src/test/zdtm/lib" -j"$(nproc)" && make -C "$static" -j"$(nproc)"; } >"$log" 2>&1; then
	tail -n 30 "$log" >&2
	say "build failed; the full log is $log"
	exit 1
fi
date -u +%FT%TZ >"$stamp"
say "built $(find "$static" -maxdepth 1 -type f -perm -u+x ! -name '*.*' | wc -l) tests"
