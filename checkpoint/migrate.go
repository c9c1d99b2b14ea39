package checkpoint

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/cuda"
)

// MigrateOptions configure Migrate.
type MigrateOptions struct {
	PID int
	// GPUMap says which GPU of this machine takes over which
	// (cuda.ParseGPUMap); the pairs are completed one-to-one.
	GPUMap cuda.GPUMap
	// ToGPU, instead of GPUMap, names the GPU (index or UUID) that takes
	// over the one GPU the job uses (found through NVML).
	ToGPU string
	// LockTimeout bounds the wait for the job's submitted GPU work;
	// DefaultLockTimeout when zero.
	LockTimeout time.Duration
	// LogPath is where the watchdog reports if stasis dies mid-way.
	LogPath string
}

// Move is one GPU whose state moved to another.
type Move struct {
	From cuda.Device `json:"from"`
	To   cuda.Device `json:"to"`
}

// MigrateResult reports a migration.
type MigrateResult struct {
	PIDs  []int // the job's CUDA processes
	Moves []Move
	// How long each step took: the lock, the CUDA checkpoint, the CUDA
	// restore onto the new GPUs, the unlock.
	Lock, Checkpoint, Restore, Unlock, Total time.Duration
}

// Migrate moves the GPU state of a running job onto other GPUs of this
// machine, in place: no CRIU, no files. It locks the tree's CUDA
// processes (waiting up to the lock timeout), checkpoints them (the
// driver moves their GPU memory into host memory), restores them with GPU
// pairs that send each GPU to its new one, and unlocks them. Any failure
// rolls back: processes already moved are moved back, the rest restored
// onto their old GPUs, all unlocked; a watchdog does the same if stasis is
// killed mid-way. A job already where the map sends it is left alone
// (no Moves).
func Migrate(o MigrateOptions) (*MigrateResult, error) {
	start := time.Now()
	tree, err := Tree(o.PID)
	if err != nil {
		return nil, err
	}
	mapped := libcudaPIDs(tree)
	if len(mapped) == 0 {
		return nil, fmt.Errorf("%w: no process of the tree of PID %d uses CUDA", catalog.ErrInvalid, o.PID)
	}
	drv, err := cuda.Load()
	if err != nil {
		return nil, fmt.Errorf("PID %d uses CUDA: %w", mapped[0], err)
	}
	// Processes that never initialized CUDA (forked from a CUDA
	// process) have no GPU state to move.
	pids, _, err := cudaProcesses(drv, mapped)
	if err != nil {
		return nil, err
	}
	if len(pids) == 0 {
		return nil, fmt.Errorf("%w: no process of the tree of PID %d initialized CUDA (those with libcuda mapped were forked from a CUDA process)", catalog.ErrInvalid, o.PID)
	}
	here, err := drv.Devices()
	if err != nil {
		return nil, err
	}
	gpuMap := o.GPUMap
	if o.ToGPU != "" {
		if gpuMap, err = toGPUMap(pids, here, o.ToGPU); err != nil {
			return nil, err
		}
	}
	pairs, err := cuda.PlanPairs(here, here, gpuMap)
	if err != nil {
		return nil, err
	}
	res := &MigrateResult{PIDs: pids}
	for _, d := range here {
		if to, ok := cuda.Target(pairs, d, here); ok && to.UUID != d.UUID {
			if to.Name != d.Name {
				return nil, fmt.Errorf("%w: GPU %d is a %s, GPU %d a %s; the driver restores GPU state only onto the same model", cuda.ErrNoGPU, d.Index, d.Name, to.Index, to.Name)
			}
			res.Moves = append(res.Moves, Move{From: d, To: to})
		}
	}
	if pairs == nil {
		res.Total = time.Since(start)
		return res, nil
	}
	if err := drv.CanRemap(); err != nil {
		return nil, err
	}

	// If stasis dies from here on, the watchdog restores the job onto
	// its old GPUs and unlocks it: the processes already moved (it is
	// told of each) are moved back, unless all had moved.
	dog, err := startWatchdog(pids, o.LogPath, reversePairs(pairs))
	if err != nil {
		return nil, err
	}
	g := &gpuSession{drv: drv, pids: pids, dog: dog}
	defer func() { dog.Release(!g.stuck) }()
	err = g.lockAndCheckpoint(o.LockTimeout)
	res.Lock, res.Checkpoint = g.lockTime, g.checkpointTime
	if err != nil {
		return nil, g.rollback("migration", err)
	}
	t := time.Now()
	if err := g.restoreOnto(pairs); err != nil {
		return nil, g.rollback("migration", err)
	}
	res.Restore = time.Since(t)
	t = time.Now()
	if err := g.resume(); err != nil {
		return nil, fmt.Errorf("the job's GPU state is on its new GPUs, but: %w", err)
	}
	res.Unlock = time.Since(t)
	res.Total = time.Since(start)
	return res, nil
}

// toGPUMap makes --to-gpu's map: the one GPU the job uses goes to name.
func toGPUMap(pids []int, here []cuda.Device, name string) (cuda.GPUMap, error) {
	to, ok := cuda.FindGPU(here, name)
	if !ok {
		return nil, fmt.Errorf("%w: --to-gpu %s is not a GPU of this machine (it has %d)", cuda.ErrNoGPU, name, len(here))
	}
	nvml, err := cuda.LoadNVML()
	if err != nil {
		return nil, fmt.Errorf("--to-gpu needs NVML to find the job's GPU (or give --gpu-map): %w", err)
	}
	used := map[string]bool{}
	for _, pid := range pids {
		uuids, err := nvml.ProcessGPUs(pid)
		if err != nil {
			return nil, err
		}
		for _, u := range uuids {
			used[strings.ToLower(u)] = true
		}
	}
	if len(used) != 1 {
		var names []string
		for u := range used {
			names = append(names, u)
		}
		return nil, fmt.Errorf("%w: --to-gpu moves a job that uses one GPU; NVML says PID %d uses %d (%s): give --gpu-map", catalog.ErrInvalid, pids[0], len(used), strings.Join(names, ", "))
	}
	for u := range used {
		return cuda.GPUMap{u: strings.ToLower(to.UUID)}, nil
	}
	return nil, nil
}

// restoreOnto restores every checkpointed process onto the GPUs pairs
// name. If one fails, those already moved are moved back (checkpointed
// again and restored with the pairs reversed), so that the rollback finds
// every process on its old GPUs, or checkpointed.
// reversePairs returns the pairs that undo pairs.
func reversePairs(pairs []cuda.GPUPair) []cuda.GPUPair {
	back := make([]cuda.GPUPair, len(pairs))
	for i, p := range pairs {
		back[i] = cuda.GPUPair{Old: p.New, New: p.Old}
	}
	return back
}

func (g *gpuSession) restoreOnto(pairs []cuda.GPUPair) error {
	back := reversePairs(pairs)
	var moved []int
	for len(g.checkpointed) > 0 {
		pid := g.checkpointed[0]
		if err := g.drv.Restore(pid, pairs); err != nil {
			var errs []error
			for _, m := range moved {
				if err := g.drv.Checkpoint(m); err != nil {
					errs = append(errs, fmt.Errorf("PID %d stays on its new GPUs: %w", m, err))
					continue
				}
				if err := g.drv.Restore(m, back); err != nil {
					g.checkpointed = append(g.checkpointed, m) // the rollback restores it where it was checkpointed
					errs = append(errs, fmt.Errorf("PID %d stays on its new GPUs: %w", m, err))
					continue
				}
				g.dog.Tell(undonePrefix + strconv.Itoa(m))
			}
			return errors.Join(append([]error{err}, errs...)...)
		}
		g.checkpointed = g.checkpointed[1:]
		moved = append(moved, pid)
		g.dog.Tell(movedPrefix + strconv.Itoa(pid))
	}
	return nil
}
