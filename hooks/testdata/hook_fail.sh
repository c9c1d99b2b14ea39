#!/bin/sh
# hook_fail.sh: a hook script that fails, saying why on stderr.
echo "checking the job's data" >&2
echo "cannot quiesce the job: the data loader is busy" >&2
exit 3
