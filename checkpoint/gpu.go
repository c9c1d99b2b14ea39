package checkpoint

import (
	"errors"
	"fmt"
	"time"

	"github.com/stasis-ckpt/stasis/cuda"
)

// DefaultLockTimeout bounds how long a GPU lock waits for the work a
// process already submitted.
const DefaultLockTimeout = 10 * time.Second

// ErrRolledBack wraps the error of a GPU checkpoint or migration that
// failed after the lock: every process was restored (onto its old GPUs)
// and unlocked again, and runs on.
var ErrRolledBack = errors.New("rolled back; the job runs on")

// GPUMeta is what a process checkpoint records about the GPUs.
type GPUMeta struct {
	PIDs          []int         `json:"pids"`           // the processes that use CUDA
	DriverVersion int           `json:"driver_version"` // CUDA version the driver supports, e.g. 13000
	Devices       []cuda.Device `json:"devices"`
	// Backend made the CUDA calls: "api" (libcuda's) or
	// "cuda-checkpoint" (cuda.Backend); absent in older checkpoints.
	Backend string `json:"backend,omitempty"`
}

// gpuSession is the CUDA side of one checkpoint: which processes it
// locked and which it checkpointed, so that a rollback undoes exactly that.
type gpuSession struct {
	drv          *cuda.Driver
	pids         []int
	locked       []int
	checkpointed []int
	// How long the locks and the checkpoints took.
	lockTime, checkpointTime time.Duration
	// stuck is set when a resume failed: the job may be left locked.
	stuck bool
	// dog, for a migration, is told which processes have moved.
	dog *Sentinel
}

// lockAndCheckpoint locks every CUDA process (waiting up to timeout for
// each; DefaultLockTimeout when zero), then checkpoints each. On error the
// caller rolls back.
func (g *gpuSession) lockAndCheckpoint(timeout time.Duration) error {
	if timeout <= 0 {
		timeout = DefaultLockTimeout
	}
	start := time.Now()
	defer func() { g.checkpointTime = time.Since(start) - g.lockTime }()
	for _, pid := range g.pids {
		if err := g.drv.Lock(pid, timeout); err != nil {
			if cuda.TimedOut(err) {
				return fmt.Errorf("GPU work of PID %d did not finish within the lock timeout of %s (raise --gpu-lock-timeout): %w", pid, timeout, err)
			}
			return err
		}
		g.locked = append(g.locked, pid)
	}
	g.lockTime = time.Since(start)
	for _, pid := range g.pids {
		if err := g.drv.Checkpoint(pid); err != nil {
			return err
		}
		g.checkpointed = append(g.checkpointed, pid)
	}
	return nil
}

// resume brings every process this session touched back to running:
// CUDA restore for those it checkpointed, then unlock for those it locked.
// It goes on past errors and returns them all.
func (g *gpuSession) resume() error {
	var errs []error
	for i := len(g.checkpointed) - 1; i >= 0; i-- {
		if err := g.drv.Restore(g.checkpointed[i], nil); err != nil {
			errs = append(errs, err)
		}
	}
	g.checkpointed = nil
	for i := len(g.locked) - 1; i >= 0; i-- {
		if err := g.drv.Unlock(g.locked[i]); err != nil {
			errs = append(errs, err)
		}
	}
	g.locked = nil
	g.stuck = len(errs) > 0
	if len(errs) > 0 {
		return fmt.Errorf("could not resume the GPU side (run `stasis recover`): %w", errors.Join(errs...))
	}
	return nil
}

// rollback resumes the GPU side after a failure of what ("checkpoint",
// "migration") and says so in the error.
func (g *gpuSession) rollback(what string, cause error) error {
	if err := g.resume(); err != nil {
		return errors.Join(cause, err)
	}
	return fmt.Errorf("the %s failed and was %w: %w", what, ErrRolledBack, cause)
}

// cudaPIDs returns the processes of the tree that use CUDA.
func cudaPIDs(tree []Process) []int {
	var pids []int
	for _, p := range tree {
		if cuda.UsesCUDA(p.PID) {
			pids = append(pids, p.PID)
		}
	}
	return pids
}
