package checkpoint

import (
	"encoding/json"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/stasis-ckpt/stasis/cuda"
)

// WatchdogArg, as the first argument of the stasis binary, runs the
// watchdog (RunWatchdog) instead of the CLI.
const WatchdogArg = "__stasis_watchdog"

// startWatchdog starts a sentinel (a detached copy of this binary) that
// rescues pids (restores and unlocks them) if this process dies before it
// releases it with ok. Its report goes to logPath.
func startWatchdog(pids []int, logPath string) (*Sentinel, error) {
	args := []string{WatchdogArg, logPath}
	for _, p := range pids {
		args = append(args, strconv.Itoa(p))
	}
	return StartSentinel("the watchdog", args...)
}

// RunWatchdog is the watchdog process: args are the log path and the PIDs.
// It waits for the orchestrator on fd 3; if the pipe ends without
// "done", the orchestrator died mid-checkpoint, and the watchdog waits for
// CRIU to let go of the processes, then restores and unlocks their GPU
// side. It returns the process's exit code.
func RunWatchdog(args []string) int {
	if len(args) < 2 {
		return 2
	}
	if SentinelReleased() {
		return 0
	}
	var pids []int
	for _, a := range args[1:] {
		if p, err := strconv.Atoi(a); err == nil {
			pids = append(pids, p)
		}
	}
	log, err := os.OpenFile(args[0], os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		log = nil
	}
	report := func(v any) {
		if log != nil {
			json.NewEncoder(io.Writer(log)).Encode(v)
		}
	}
	drv, err := cuda.Load()
	if err != nil {
		report(map[string]string{"error": err.Error()})
		return 1
	}
	// A CRIU dump still running on the job (stasis died during it) keeps
	// it traced; it may take long for large jobs, so wait for it as long
	// as it runs.
	done := Recover(drv, pids, 24*time.Hour)
	report(map[string]any{"time": time.Now().UTC(), "orchestrator": "died mid-checkpoint", "recovered": done})
	for _, r := range done {
		if !r.OK {
			return 1
		}
	}
	return 0
}
