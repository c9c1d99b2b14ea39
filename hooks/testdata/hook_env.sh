#!/bin/sh
# hook_env.sh: a hook script that records the STASIS_ variables it was given
# in $HOOK_OUT/$STASIS_HOOK.env, one per line, sorted.
env | grep '^STASIS_' | sort >"$HOOK_OUT/$STASIS_HOOK.env"
