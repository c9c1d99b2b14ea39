package checkpoint

import (
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/stasis-ckpt/stasis/cuda"
)

// Recovered reports what Recover did to one process.
type Recovered struct {
	PID    int    `json:"pid"`
	Before string `json:"before"` // its GPU state as found
	Action string `json:"action"` // "none", "unlocked", "restored and unlocked", or the error
	OK     bool   `json:"ok"`
}

// Recover finds CUDA processes left locked or checkpointed (by a stasis
// that was killed, say) and restores and unlocks them. With no pids it
// looks at every process that has libcuda mapped. A process that CRIU is
// still dumping (it is being traced) is waited for, up to wait.
func Recover(drv *cuda.Driver, pids []int, wait time.Duration) []Recovered {
	if len(pids) == 0 {
		pids = allCUDAProcesses()
	}
	var out []Recovered
	for _, pid := range pids {
		out = append(out, recoverOne(drv, pid, wait))
	}
	return out
}

func recoverOne(drv *cuda.Driver, pid int, wait time.Duration) Recovered {
	r := Recovered{PID: pid}
	for deadline := time.Now().Add(wait); tracer(pid) != 0 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	if t := tracer(pid); t != 0 {
		r.Action = fmt.Sprintf("left alone: PID %d is traced by %d (a CRIU dump still running?)", pid, t)
		return r
	}
	st, err := drv.ProcessState(pid)
	if cuda.NotInitialized(err) {
		// libcuda mapped, CUDA never initialized: a process forked from
		// a CUDA process, with no GPU state to resume.
		r.Before, r.Action, r.OK = "not a CUDA process", "none", true
		return r
	}
	if err != nil {
		r.Before, r.Action = "unknown", err.Error()
		return r
	}
	r.Before = st.String()
	switch st {
	case cuda.Running:
		r.Action, r.OK = "none", true
	case cuda.Locked:
		if err := drv.Unlock(pid); err != nil {
			r.Action = err.Error()
		} else {
			r.Action, r.OK = "unlocked", true
		}
	case cuda.Checkpointed:
		if err := drv.Restore(pid, nil); err != nil {
			r.Action = err.Error()
		} else if err := drv.Unlock(pid); err != nil {
			r.Action = "restored, but " + err.Error()
		} else {
			r.Action, r.OK = "restored and unlocked", true
		}
	default:
		r.Action = "the driver reports a failed checkpoint state; nothing stasis can do"
	}
	return r
}

// tracer returns the PID tracing pid (0 when none).
func tracer(pid int) int {
	status, err := Status(pid)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(status["TracerPid"])
	return n
}

func allCUDAProcesses() []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err == nil && pid != os.Getpid() && cuda.UsesCUDA(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}
