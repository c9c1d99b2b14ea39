package checkpoint

import (
	"errors"
	"fmt"
	"time"

	"github.com/stasis-ckpt/stasis/catalog"
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

// libcudaPIDs returns the processes of the tree that have libcuda
// mapped: CUDA processes, or processes forked from one (cudaProcesses
// tells them apart).
func libcudaPIDs(tree []Process) []int {
	var pids []int
	for _, p := range tree {
		if cuda.UsesCUDA(p.PID) {
			pids = append(pids, p.PID)
		}
	}
	return pids
}

// cudaProcesses asks the driver about each of pids (processes with libcuda
// mapped) and divides them into the CUDA processes, all running on the GPU
// side, and those that never initialized CUDA (CUDA_ERROR_NOT_INITIALIZED:
// a process forked from a CUDA process, such as a DataLoader worker), which
// are CPU processes. A process that a checkpoint or migration left locked
// or checkpointed, or one the driver cannot say anything about, is an
// error: nothing has been touched.
func cudaProcesses(drv *cuda.Driver, pids []int) (cudaPIDs, notInitialized []int, err error) {
	for _, pid := range pids {
		st, err := drv.ProcessState(pid)
		switch {
		case cuda.NotInitialized(err):
			notInitialized = append(notInitialized, pid)
		case err != nil:
			return nil, nil, fmt.Errorf("cannot ask the driver for the GPU state of PID %d: %w", pid, err)
		case st == cuda.Locked || st == cuda.Checkpointed:
			return nil, nil, fmt.Errorf("%w: PID %d is %v on the GPU side (a checkpoint or migration that did not finish left it so); `stasis recover --pid %d` resumes it", catalog.ErrInvalid, pid, st, pid)
		case st != cuda.Running:
			return nil, nil, fmt.Errorf("%w: the driver reports PID %d in a %v checkpoint state, from which nothing brings it back", catalog.ErrInvalid, pid, st)
		default:
			cudaPIDs = append(cudaPIDs, pid)
		}
	}
	return cudaPIDs, notInitialized, nil
}
