// Package restore is the whole-process restore state machine: it checks the
// checkpoint and the machine first (kind; the files the tree maps, its
// mounts, the driver and GPU models, each mismatch named; the kernel and
// CRIU versions, warned about; the tree's PIDs free), unpacks the images into a scratch directory (in RAM when they fit)
// verifying every chunk before CRIU runs, and has CRIU restore the tree
// detached, so that it outlives stasis.
package restore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/checkpoint"
	"github.com/stasis-ckpt/stasis/criu"
	"github.com/stasis-ckpt/stasis/cuda"
	"github.com/stasis-ckpt/stasis/fileset"
)

// ErrPIDInUse is returned when a PID the tree must get back is taken.
var ErrPIDInUse = errors.New("a PID the checkpoint needs is in use")

// Options configure a restore.
type Options struct {
	CRIU criu.Options
	// PIDWait is how long to wait for the tree's PIDs to become free (a
	// just-killed process stays a zombie until its parent reaps it).
	PIDWait time.Duration
	Read    catalog.ReadOptions
	// GPUMap maps GPUs of the checkpoint to GPUs of this machine
	// (cuda.ParseGPUMap); by default the same GPUs, or the same index when
	// they are not here.
	GPUMap cuda.GPUMap
	// Force restores even when this machine does not match the
	// checkpoint (a MismatchError without it); the mismatches become
	// warnings.
	Force bool
	// NewPIDNS restores into a new PID namespace, where the tree gets its
	// own PIDs whatever holds them here.
	NewPIDNS bool
}

// Result reports a restore.
type Result struct {
	PID int // as this machine's (host) PID namespace sees it
	// PIDInside is the root's PID inside its new namespace (NewPIDNS).
	PIDInside int
	Manifest  *catalog.Manifest
	// Unpack is reading and verifying the images; CRIU its restore; GPU
	// the CUDA restore and unlock.
	Unpack, CRIU, GPU, Total time.Duration
	ImagesInRAM              bool
	GPUPairs                 []cuda.GPUPair // the GPU remapping used, if any
	// Warnings are the ways this machine differs from the checkpoint
	// that did not stop the restore, one line each.
	Warnings []string
}

// Run restores the process checkpoint id.
func Run(ctx context.Context, s *catalog.Store, id string, o Options) (*Result, error) {
	start := time.Now()
	m, err := s.ReadManifest(id)
	if err != nil {
		return nil, err
	}
	if m.Kind != catalog.KindProcess {
		return nil, fmt.Errorf("%w: checkpoint %s is of kind %s; `stasis restore` restores process checkpoints (use `stasis load` for files)", catalog.ErrInvalid, id, m.Kind)
	}
	var meta checkpoint.Meta
	if err := json.Unmarshal(m.Meta, &meta); err != nil || len(meta.Processes) == 0 {
		return nil, fmt.Errorf("%w: checkpoint %s has no process description", catalog.ErrBadManifest, id)
	}
	criuPath, criuVersion, err := criu.Resolve(o.CRIU.Path)
	if err != nil {
		return nil, err
	}
	co := o.CRIU
	co.Path = criuPath
	co.ShellJob, co.TCPEstablished, co.ExtUnixSockets, co.FileLocks = meta.ShellJob, meta.TCPEstablished, meta.ExtUnixSockets, meta.FileLocks
	// Everything this machine must match is checked, and every mismatch
	// named, before anything runs.
	var drv *cuda.Driver
	var pairs []cuda.GPUPair
	var mismatches []string
	if meta.GPU != nil {
		if drv, err = cuda.Load(); err != nil {
			return nil, fmt.Errorf("checkpoint %s holds GPU state: %w", id, err)
		}
		if pairs, mismatches, err = gpuPlan(meta.GPU, drv, o.GPUMap); err != nil {
			return nil, err
		}
	}
	refuse, warnings := checkMachine(meta, checkpoint.NewHasher(s.CacheDir("sha256")), criu.FormatVersion(criuVersion))
	mismatches = append(mismatches, refuse...)
	if len(mismatches) > 0 && !o.Force {
		return nil, &MismatchError{ID: id, Mismatches: mismatches, Warnings: warnings}
	}
	for _, m := range mismatches {
		warnings = append(warnings, m+" (restoring anyway: --force)")
	}
	if !o.NewPIDNS {
		if err := waitForPIDs(ctx, meta, o.PIDWait); err != nil {
			return nil, err
		}
	}

	scratch, err := s.NewScratch("restore", m.Bytes+m.Bytes/4+256<<20)
	if err != nil {
		return nil, err
	}
	defer scratch.Remove()
	images, work, err := criu.MakeDirs(scratch.Dir)
	if err != nil {
		return nil, err
	}
	// Every chunk is verified here, before CRIU sees any image.
	if err := fileset.Unpack(ctx, s, m, images, fileset.LoadOptions{Read: o.Read}); err != nil {
		return nil, err
	}
	unpacked := time.Now()
	var pid, inside int
	if o.NewPIDNS {
		pid, inside, err = restoreInNewPIDNS(co, images, work)
	} else {
		// A PID may have been taken while we unpacked.
		if err := waitForPIDs(ctx, meta, 0); err != nil {
			return nil, err
		}
		pid, err = criu.Restore(co, images, work, criu.Hooks{})
	}
	if err != nil {
		criu.KeepLog(err, s.KeepLog)
		return nil, err
	}
	res := &Result{PID: pid, PIDInside: inside, Manifest: m, ImagesInRAM: scratch.InRAM(), Unpack: unpacked.Sub(start), CRIU: time.Since(unpacked), GPUPairs: pairs, Warnings: warnings}
	if meta.GPU != nil {
		t := time.Now()
		gpuPIDs := meta.GPU.PIDs
		if o.NewPIDNS {
			// The driver works with PIDs as this namespace sees them.
			gpuPIDs = nil
			for _, p := range meta.GPU.PIDs {
				host, ok := hostPIDOf(pid, p)
				if p == inside {
					host, ok = pid, true
				}
				if !ok {
					return nil, fmt.Errorf("restored as PID %d, but CUDA process %d of the tree is not found", pid, p)
				}
				gpuPIDs = append(gpuPIDs, host)
			}
		}
		if err := resumeGPU(drv, gpuPIDs, pairs); err != nil {
			return nil, fmt.Errorf("restored as PID %d, but: %w", pid, err)
		}
		res.GPU = time.Since(t)
	}
	res.Total = time.Since(start)
	return res, nil
}

// waitForPIDs waits up to wait for every thread ID of the tree to be free.
func waitForPIDs(ctx context.Context, meta checkpoint.Meta, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		pid, holder := takenPID(meta)
		if holder == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: PID %d is held by %s; CRIU restores the exact PIDs, so wait for it to go (retry with --pid-wait 30s), end it, or restore into a new PID namespace (--new-pidns)", ErrPIDInUse, pid, holder)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func takenPID(meta checkpoint.Meta) (int, string) {
	for _, p := range meta.Processes {
		ids := p.Threads
		if len(ids) == 0 {
			ids = []int{p.PID}
		}
		for _, id := range ids {
			if h := checkpoint.PIDHolder(id); h != "" {
				return id, h
			}
		}
	}
	return 0, ""
}
