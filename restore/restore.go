// Package restore is the whole-process restore state machine: it checks the
// checkpoint and the machine first (kind; the files the tree maps, its
// mounts, the driver and GPU models, each mismatch named; the kernel and
// CRIU versions, warned about; the tree's PIDs free), unpacks the small
// images into a scratch directory (in RAM when they fit) verifying every
// chunk, and has CRIU restore the tree detached, so that it outlives
// stasis. The memory images take one of three ways (Options.Pages): by
// default CRIU restores only the pages of file mappings and the like,
// and stasis writes the private anonymous memory into the rebuilt tree
// on every core before it runs (fill.go); or they are streamed to CRIU
// as they are verified; or unpacked and verified before CRIU runs. When
// the tree's PIDs are taken it can restore it into a new PID namespace
// instead (Options.PIDNS), whose init is a copy of stasis that runs CRIU
// in there.
package restore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/checkpoint"
	"github.com/stasis-ckpt/stasis/criu"
	"github.com/stasis-ckpt/stasis/cuda"
	"github.com/stasis-ckpt/stasis/fileset"
	"github.com/stasis-ckpt/stasis/gdswriter"
	"golang.org/x/sys/unix"
)

// ErrPIDInUse is returned when a PID the tree must get back is taken.
var ErrPIDInUse = errors.New("a PID the checkpoint needs is in use")

// pidTakenDuringRestore gives a CRIU restore that failed because a PID was
// taken after stasis checked it the same plain message and way out as a
// PID taken before.
func pidTakenDuringRestore(err error) error {
	if line, taken := criu.PIDTaken(err); taken {
		return fmt.Errorf("%w: %s (taken while CRIU restored the tree); retry, or restore into a new PID namespace (--new-pidns): %v", ErrPIDInUse, line, err)
	}
	return err
}

// Options configure a restore.
type Options struct {
	CRIU criu.Options
	// PIDWait is how long to wait for the tree's PIDs to become free (a
	// just-killed process stays a zombie until its parent reaps it); in
	// PIDNSAuto, only while zombies hold them.
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
	// PIDNS says when to restore into a new PID namespace, where the tree
	// gets its own PIDs whatever holds them here: never (the default),
	// when one of them is taken, or always.
	PIDNS PIDNSMode
	// Supervised makes the init of a new PID namespace the restoring
	// process's to wait for: it dies with it (PR_SET_PDEATHSIG, which
	// takes the whole namespace along), and once the tree's root has
	// ended it stops what else runs in there (SIGTERM, SIGKILL after
	// KillAfter) and exits with the root's status as a shell reports it
	// (128 + n for signal n). Otherwise it stays as long as the tree runs.
	Supervised bool
	KillAfter  time.Duration
	// Pages is how the memory images reach the tree (PagesFill when
	// empty). In every way, no byte that fails its checks reaches a
	// process that runs: CRIU undoes the restore.
	Pages PagesMode
}

// PagesMode is how a restore brings back the tree's memory.
type PagesMode string

const (
	// PagesFill has CRIU restore only the pages that are not private
	// anonymous writable memory, and stasis write the rest into the
	// rebuilt tree, from several goroutines, before it runs (fill.go).
	PagesFill PagesMode = "fill"
	// PagesStream streams the whole memory images to CRIU as they are
	// read and verified (criu restore --stream).
	PagesStream PagesMode = "stream"
	// PagesUnpack reads and verifies every image into a scratch
	// directory before CRIU runs, as CRIU by hand needs them
	// (--verify-first).
	PagesUnpack PagesMode = "unpack"
)

// ParsePagesMode reads "fill", "stream" or "unpack".
func ParsePagesMode(s string) (PagesMode, error) {
	switch m := PagesMode(s); m {
	case PagesFill, PagesStream, PagesUnpack:
		return m, nil
	}
	return "", fmt.Errorf("%q: use fill, stream or unpack", s)
}

// PIDNSMode is when a restore goes into a new PID namespace.
type PIDNSMode string

const (
	PIDNSNever  PIDNSMode = "never"
	PIDNSAuto   PIDNSMode = "auto" // when a PID of the tree is taken
	PIDNSAlways PIDNSMode = "always"
)

// ParsePIDNSMode reads "never", "auto" or "always".
func ParsePIDNSMode(s string) (PIDNSMode, error) {
	switch m := PIDNSMode(s); m {
	case PIDNSNever, PIDNSAuto, PIDNSAlways:
		return m, nil
	}
	return "", fmt.Errorf("%q: use auto, always or never", s)
}

// Result reports a restore.
type Result struct {
	PID int // as this machine's (host) PID namespace sees it
	// PIDInside is the root's PID inside its new namespace, and Init that
	// namespace's init (as this machine sees it), when the tree went into
	// one.
	PIDInside, Init int
	// PIDTaken says why it did in PIDNSAuto: which PID was held by what.
	PIDTaken string
	Manifest *catalog.Manifest
	// Unpack is reading and verifying the images (only the small ones
	// and the pages left to CRIU, unless PagesUnpack); CRIU its restore
	// (Fill, the memory stasis wrote into the tree, included); GPU the
	// CUDA restore and unlock.
	Unpack, CRIU, Fill, GPU, Total time.Duration
	ImagesInRAM                    bool
	// Pages is the way the memory was restored.
	Pages PagesMode
	// Filled and FilledZero count the bytes of memory stasis wrote into
	// the tree and the bytes it left out as all zeros (PagesFill);
	// KeptForCRIU the bytes of pages CRIU restored itself.
	Filled, FilledZero, KeptForCRIU int64
	// Checked counts the bytes of memory read back from the restored tree
	// and found as checkpointed, in Check (PagesFill; part of CRIU);
	// UncheckedShared the bytes of shared memory no process maps or
	// holds open, which could not be read back.
	Checked, UncheckedShared int64
	Check                    time.Duration
	// StreamWrite (PagesStream) is the time spent writing the memory
	// images into CRIU's pipes (mostly waiting for CRIU to read them):
	// close to CRIU means CRIU set the pace, far below it the store did.
	StreamWrite time.Duration
	GPUPairs    []cuda.GPUPair // the GPU remapping used, if any
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
	criuPath, criuVersion, err := criu.ResolveCached(o.CRIU.Path, s.CacheDir("criu"))
	if err != nil {
		return nil, err
	}
	co := o.CRIU
	co.Path, co.Version = criuPath, criuVersion
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
	newNS, taken, err := needNewPIDNS(ctx, meta, o.PIDNS, o.PIDWait)
	if err != nil {
		return nil, err
	}

	mode := o.Pages
	if mode == "" {
		mode = PagesFill
	}
	// Unless unpacked, the memory images are not unpacked before CRIU
	// runs.
	unpackOpts := fileset.LoadOptions{Read: o.Read}
	unpackBytes := m.Bytes
	if mode != PagesUnpack {
		unpackOpts.Skip = memoryImage
		unpackBytes = 0
		for _, e := range m.Entries {
			if e.Type == catalog.EntryFile && !memoryImage(e) {
				unpackBytes += e.Size
			}
		}
	}
	scratch, err := s.NewScratch("restore", unpackBytes+unpackBytes/4+256<<20)
	if err != nil {
		return nil, err
	}
	defer scratch.Remove()
	images, work, err := criu.MakeDirs(scratch.Dir)
	if err != nil {
		return nil, err
	}
	// Every chunk is verified here, before CRIU sees any image, or, for
	// the memory images of a streamed restore, before CRIU reads it.
	if err := fileset.Unpack(ctx, s, m, images, unpackOpts); err != nil {
		return nil, err
	}
	res := &Result{Manifest: m, ImagesInRAM: scratch.InRAM(), Pages: mode, GPUPairs: pairs, Warnings: warnings}
	var server *criu.ImageServer
	var plan *fillPlan
	switch mode {
	case PagesStream:
		if server, err = serveImages(ctx, s, m, images, o.Read); err != nil {
			return nil, err
		}
		defer server.Close()
		co.Stream = true
	case PagesFill:
		if plan, err = planFill(m, images); err != nil {
			return nil, err
		}
		defer plan.close()
		// The scratch directory was sized for the small images; the
		// pages left to CRIU (changed pages of file mappings, read-only
		// memory) are few in a training job, but need not be.
		var st unix.Statfs_t
		if err := unix.Statfs(images, &st); err == nil && int64(st.Bavail)*int64(st.Bsize) < plan.KeepBytes {
			return nil, fmt.Errorf("the %d bytes of memory CRIU restores itself do not fit in %s (%d bytes free): restore with --pages stream", plan.KeepBytes, scratch.Dir, int64(st.Bavail)*int64(st.Bsize))
		}
		if err := plan.writeKept(ctx, s, m, o.Read); err != nil {
			return nil, err
		}
		res.KeptForCRIU = plan.KeepBytes
	}
	// postRestore writes the memory into the tree CRIU has rebuilt and
	// not yet let run; init is the new PID namespace's, if any. An error
	// makes CRIU undo the restore.
	var fillErr error
	var postRestore func(init int) error
	if plan != nil {
		postRestore = func(init int) error {
			t := time.Now()
			st, err := plan.writeFilled(ctx, s, m, o.Read, imagePIDs(init))
			res.Fill, res.Filled, res.FilledZero, fillErr = time.Since(t), st.Written, st.Zero, err
			if err != nil {
				return err
			}
			t = time.Now()
			ck, err := checkMemory(ctx, plan.memory, plan.digests, imagePIDs(init))
			res.Check, res.Checked, res.UncheckedShared, fillErr = time.Since(t), ck.Bytes, ck.UnmappedShared, err
			return err
		}
	}
	unpacked := time.Now()
	res.Unpack = unpacked.Sub(start)
	if !newNS {
		// A PID may have been taken while we unpacked.
		if newNS, taken, err = needNewPIDNS(ctx, meta, o.PIDNS, 0); err != nil {
			return nil, err
		}
	}
	res.PIDTaken = taken
	if !newNS {
		var hooks criu.Hooks
		if postRestore != nil {
			hooks.PostRestore = func(int) error { return postRestore(0) }
		}
		res.PID, err = criu.Restore(co, images, work, hooks)
		criu.ConfirmVersion(co.Path, s.CacheDir("criu"), filepath.Join(work, criu.RestoreLog), co.Version)
		// Another process may take a PID between the check and CRIU's
		// fork: CRIU has undone its work, and auto goes into a new
		// namespace after all.
		if line, taken := criu.PIDTaken(err); taken && o.PIDNS == PIDNSAuto {
			newNS, res.PIDTaken = true, "a PID was taken during the restore: criu says "+line
			// What CRIU logs next is the namespace's restore.
			os.Remove(filepath.Join(work, criu.RestoreLog))
		}
	}
	if newNS {
		res.PID, res.PIDInside, res.Init, err = restoreInNewPIDNS(co, images, work, o.Supervised, o.KillAfter, postRestore)
	}
	if err != nil && fillErr != nil {
		criu.KeepLog(err, s.KeepLog)
		return nil, fmt.Errorf("%w (CRIU undid the restore; nothing of the tree runs)", fillErr)
	}
	if server != nil {
		// Every image CRIU asked for has been sent by now, or CRIU has
		// gone and the senders fail at once.
		server.Close()
		res.StreamWrite = server.WriteTime()
		if err != nil {
			if serr := server.Err(); errors.Is(serr, gdswriter.ErrCorrupt) || errors.Is(serr, context.Canceled) {
				criu.KeepLog(err, s.KeepLog)
				return nil, fmt.Errorf("%w (CRIU stopped the restore there; nothing of the tree runs; %v)", serr, err)
			}
		}
	}
	if err != nil {
		criu.KeepLog(err, s.KeepLog)
		if !newNS {
			err = pidTakenDuringRestore(err)
		}
		return nil, err
	}
	res.CRIU = time.Since(unpacked)
	pid, inside := res.PID, res.PIDInside
	if meta.GPU != nil {
		t := time.Now()
		gpuPIDs := meta.GPU.PIDs
		if newNS {
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

// needNewPIDNS says whether the tree goes into a new PID namespace, and in
// PIDNSAuto which PID taken made it so. Without one, it waits up to wait for
// every thread ID of the tree to be free; in PIDNSAuto it waits only while
// the PIDs are held by zombies (a just-ended process its parent has not
// reaped yet), and goes into a new namespace at once for a PID a running
// process holds, or after wait.
func needNewPIDNS(ctx context.Context, meta checkpoint.Meta, mode PIDNSMode, wait time.Duration) (bool, string, error) {
	if mode == PIDNSAlways {
		return true, "", nil
	}
	deadline := time.Now().Add(wait)
	for {
		pid, holder, zombie := takenPID(meta)
		if holder == "" {
			return false, "", nil
		}
		if mode == PIDNSAuto && (!zombie || time.Now().After(deadline)) {
			return true, fmt.Sprintf("PID %d is held by %s", pid, holder), nil
		}
		if time.Now().After(deadline) {
			return false, "", fmt.Errorf("%w: PID %d is held by %s; CRIU restores the exact PIDs, so wait for it to go (retry with --pid-wait 30s), end it, or restore into a new PID namespace (--new-pidns)", ErrPIDInUse, pid, holder)
		}
		select {
		case <-ctx.Done():
			return false, "", ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func takenPID(meta checkpoint.Meta) (pid int, holder string, zombie bool) {
	for _, p := range meta.Processes {
		ids := p.Threads
		if len(ids) == 0 {
			ids = []int{p.PID}
		}
		for _, id := range ids {
			if h, z := checkpoint.PIDHolder(id); h != "" {
				return id, h, z
			}
		}
	}
	return 0, "", false
}
