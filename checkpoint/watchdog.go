package checkpoint

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/stasis-ckpt/stasis/cuda"
)

// WatchdogArg, as the first argument of the stasis binary, runs the
// watchdog (RunWatchdog) instead of the CLI.
const WatchdogArg = "__stasis_watchdog"

// startWatchdog starts a sentinel (a detached copy of this binary) that
// rescues pids (restores and unlocks them) if this process dies before it
// releases it with ok. Its report goes to logPath. For a migration, back
// are the pairs that undo it: the watchdog moves back the processes it was
// told had moved (movedPrefix), unless all of them had.
func startWatchdog(pids []int, logPath string, back []cuda.GPUPair) (*Sentinel, error) {
	args := []string{WatchdogArg, logPath}
	if len(back) > 0 {
		var ps []string
		for _, p := range back {
			ps = append(ps, cuda.FormatUUID(p.Old)+">"+cuda.FormatUUID(p.New))
		}
		args = append(args, backPrefix+strings.Join(ps, ","))
	}
	for _, p := range pids {
		args = append(args, strconv.Itoa(p))
	}
	return StartSentinel("the watchdog", args...)
}

const (
	backPrefix   = "back="  // the watchdog argument with the pairs undoing a migration
	movedPrefix  = "moved " // told to the watchdog: a process now on its new GPUs
	undonePrefix = "back "  // told to the watchdog: a process moved back by the orchestrator
)

func parsePairs(s string) ([]cuda.GPUPair, error) {
	var pairs []cuda.GPUPair
	for _, p := range strings.Split(s, ",") {
		o, n, ok := strings.Cut(p, ">")
		from, err1 := cuda.ParseUUID(o)
		to, err2 := cuda.ParseUUID(n)
		if !ok || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("bad GPU pair %q", p)
		}
		pairs = append(pairs, cuda.GPUPair{Old: from, New: to})
	}
	return pairs, nil
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
	released, told := WatchSentinel()
	if released {
		return 0
	}
	var pids []int
	var back []cuda.GPUPair
	var badPairs error
	for _, a := range args[1:] {
		if p, err := strconv.Atoi(a); err == nil {
			pids = append(pids, p)
		} else if s, ok := strings.CutPrefix(a, backPrefix); ok {
			back, badPairs = parsePairs(s)
		}
	}
	moved := map[int]bool{}
	for _, line := range told {
		if s, ok := strings.CutPrefix(line, movedPrefix); ok {
			if p, err := strconv.Atoi(s); err == nil {
				moved[p] = true
			}
		} else if s, ok := strings.CutPrefix(line, undonePrefix); ok {
			if p, err := strconv.Atoi(s); err == nil {
				delete(moved, p)
			}
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
	// A migration that had moved some processes but not all is undone:
	// those go back to their old GPUs (the others, not moved yet, are
	// restored there below). One that had moved them all is completed.
	var movedBack []Recovered
	if len(moved) > 0 && len(moved) < len(pids) {
		if badPairs != nil || back == nil {
			report(map[string]string{"error": fmt.Sprintf("cannot move processes %v back: %v", moved, badPairs)})
			return 1
		}
		for _, pid := range pids {
			if moved[pid] {
				movedBack = append(movedBack, moveBack(drv, pid, back))
			}
		}
	}
	// A CRIU dump still running on the job (stasis died during it) keeps
	// it traced; it may take long for large jobs, so wait for it as long
	// as it runs.
	done := Recover(drv, pids, 24*time.Hour)
	entry := map[string]any{"time": time.Now().UTC(), "orchestrator": "died mid-checkpoint", "recovered": done}
	if back != nil {
		entry["orchestrator"] = "died mid-migration"
		if len(movedBack) > 0 {
			entry["moved_back"] = movedBack
		}
	}
	report(entry)
	for _, r := range append(done, movedBack...) {
		if !r.OK {
			return 1
		}
	}
	return 0
}

// moveBack returns a process already restored onto its new GPUs to its
// old ones (back are the pairs undoing the move), leaving it locked for
// Recover to unlock.
func moveBack(drv *cuda.Driver, pid int, back []cuda.GPUPair) Recovered {
	r := Recovered{PID: pid}
	st, err := drv.ProcessState(pid)
	if err != nil {
		r.Before, r.Action = "unknown", err.Error()
		return r
	}
	r.Before = st.String()
	if st == cuda.Running {
		if err := drv.Lock(pid, DefaultLockTimeout); err != nil {
			r.Action = "stays on its new GPUs: " + err.Error()
			return r
		}
	}
	if err := drv.Checkpoint(pid); err != nil {
		r.Action = "stays on its new GPUs: " + err.Error()
		return r
	}
	if err := drv.Restore(pid, back); err != nil {
		r.Action = "checkpointed, but not restored onto its old GPUs: " + err.Error()
		return r
	}
	r.Action, r.OK = "moved back to its old GPUs", true
	return r
}
