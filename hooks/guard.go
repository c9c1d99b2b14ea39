package hooks

import (
	"strconv"
	"syscall"
	"time"

	"github.com/stasis-ckpt/stasis/checkpoint"
)

// GuardArg, as the first argument of the stasis binary, runs the guard of
// a job's tree (RunGuard) instead of the CLI.
const GuardArg = "__stasis_run_guard"

// startGuard starts the sentinel that ends the job's session if stasis run
// dies: PR_SET_PDEATHSIG kills the job's root, the guard the rest of its
// session. stasis run releases it with ok when it ends normally.
func startGuard(session int) (*checkpoint.Sentinel, error) {
	return checkpoint.StartSentinel("the job's guard", GuardArg, strconv.Itoa(session))
}

// RunGuard is the guard process: args are the job's session. If stasis run
// dies before it releases the guard, the guard kills every process left in
// the session. It returns the process's exit code.
func RunGuard(args []string) int {
	if len(args) != 1 {
		return 2
	}
	session, err := strconv.Atoi(args[0])
	if err != nil || session <= 1 {
		return 2
	}
	if checkpoint.SentinelReleased() {
		return 0
	}
	// Processes may still be forking: go on until the session is empty.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		left := sessionMembers(session)
		if len(left) == 0 {
			return 0
		}
		for _, pid := range left {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return 1
}
