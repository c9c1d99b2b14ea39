// Package checkpoint is the whole-process checkpoint state machine: it finds
// the process tree and has CRIU dump it, taking its images as CRIU hands
// them over (a streamed dump: the memory images go through pipes straight
// into the store, the small images into a scratch directory in RAM), and,
// while the tree is still frozen, finishes storing them (compressed,
// checksummed, durable) and commits them. Only then does CRIU kill the
// tree (or resume it, with LeaveRunning). By default (Options.DumpPages),
// unless the tree uses CUDA, runs in a PID namespace of its own, or has
// more memory than CRIU's page pipes can hold, and not in Fast mode, CRIU
// leaves the private anonymous memory out (lazy pages) and stasis copies
// it from the processes before the commit, starting as CRIU starts. If
// anything fails before the commit, including stasis being killed, CRIU
// resumes the tree: a failed checkpoint never leaves the job stopped or
// dead. A tree in a PID
// namespace of its own is dumped by CRIU run inside that namespace, into
// the scratch directory, which the store follows as it grows.
package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/criu"
	"github.com/stasis-ckpt/stasis/fileset"
	"github.com/stasis-ckpt/stasis/gdswriter"
	"github.com/stasis-ckpt/stasis/internal/trace"
	"golang.org/x/sys/unix"
)

// Options configure a checkpoint.
type Options struct {
	PID  int
	Job  string // "" means the process's name
	Step int64
	Tags map[string]string
	// LeaveRunning keeps the tree running after the checkpoint; otherwise
	// it is gone once the checkpoint is committed.
	LeaveRunning bool
	// Fast keeps the pause short: the images go to RAM while the job is
	// paused, the job resumes at once, and compression, checksums and the
	// durable commit follow while it runs. The checkpoint is listed only
	// once it is durable; if storing fails, there is no checkpoint and the
	// job runs on. Fast implies LeaveRunning.
	Fast bool
	// DumpPages says how the memory gets into the checkpoint; the zero
	// value is DumpPagesAuto.
	DumpPages DumpPages
	// NoEarlyCopy, where stasis copies the memory, has it start copying
	// only once CRIU has dumped the tree, not on the largest part of the
	// memory at once while CRIU dumps (early.go).
	NoEarlyCopy bool
	CRIU        criu.Options
	Writer      gdswriter.WriterOptions
	// LockTimeout bounds the wait for a GPU process's submitted work when
	// it is locked; DefaultLockTimeout when zero.
	LockTimeout time.Duration
	// Progress, when set, receives raw byte counts as images are stored.
	Progress func(int64)
}

// Meta is what a process checkpoint records in its manifest's meta, and what
// a restore needs to know.
type Meta struct {
	PID          int       `json:"pid"`
	Processes    []Process `json:"processes"`
	CRIUVersion  string    `json:"criu_version"`
	Kernel       string    `json:"kernel"`
	LeaveRunning bool      `json:"leave_running"`
	// CRIU options the restore must repeat.
	ShellJob       bool `json:"shell_job,omitempty"`
	TCPEstablished bool `json:"tcp_established,omitempty"`
	ExtUnixSockets bool `json:"ext_unix_sk,omitempty"`
	FileLocks      bool `json:"file_locks,omitempty"`
	// CRIU options of the dump alone (its restore does not repeat
	// them): what the preflight chose.
	LinkRemap  bool  `json:"link_remap,omitempty"`
	GhostLimit int64 `json:"ghost_limit,omitempty"`
	// Preflight is what the preflight found and chose (preflight.go):
	// the CUDA processes, those with libcuda mapped that are not, and
	// each CRIU option beyond stasis's own with the reason.
	Preflight *Plan `json:"preflight,omitempty"`
	// GPU is set when processes of the tree use CUDA.
	GPU *GPUMeta `json:"gpu,omitempty"`
	// MappedFiles are the files the tree runs and maps, and Mounts the
	// mounts it uses, when it was frozen: a restore checks that they
	// are the same.
	MappedFiles []MappedFile `json:"mapped_files,omitempty"`
	Mounts      []Mount      `json:"mounts,omitempty"`
}

// DumpPages is how the memory gets into a process checkpoint.
type DumpPages int

const (
	// DumpPagesAuto is DumpPagesCopy, but DumpPagesCRIU for a tree with
	// CUDA processes: their checkpoints took longer with copy on the GPU
	// machine (docs/benchmarks.md).
	DumpPagesAuto DumpPages = iota
	// DumpPagesCRIU has CRIU write all of the memory itself, on one
	// thread, streamed into the store as it comes.
	DumpPagesCRIU
	// DumpPagesCopy has CRIU write only the pages it must (stacks,
	// changed pages of file mappings) and, once CRIU has dumped the tree,
	// with the tree frozen, stasis copies its private anonymous memory
	// from the processes on every core (criu.Options.LazyPages), its
	// largest run from the moment CRIU starts (early.go). Fast mode, a
	// tree in a PID namespace of its own, and an open-file limit too low
	// for CRIU's page pipes (criu.LazyPagesFit) always have CRIU write it.
	DumpPagesCopy
)

// copies says whether stasis copies the memory of a tree, which uses CUDA
// or not, rather than CRIU writing it (before the limits of
// DumpPagesCopy).
func (d DumpPages) copies(usesCUDA bool) bool {
	return d == DumpPagesCopy || d == DumpPagesAuto && !usesCUDA
}

// ParseDumpPages reads "auto", "criu" or "copy".
func ParseDumpPages(s string) (DumpPages, error) {
	switch s {
	case "auto":
		return DumpPagesAuto, nil
	case "criu":
		return DumpPagesCRIU, nil
	case "copy":
		return DumpPagesCopy, nil
	}
	return 0, fmt.Errorf("%q: want auto, criu or copy", s)
}

// Result reports a checkpoint.
type Result struct {
	Record *catalog.Record
	// GPULock and GPUCheckpoint are the CUDA lock and checkpoint; Dump is
	// CRIU's time from the start of the dump to the images being complete;
	// Hash is describing the files the tree maps (hashes, from the cache
	// where it has them) before it is frozen;
	// Store is the rest of the storing and the commit; GPUResume is the
	// CUDA restore and unlock of --leave-running. Pause is how long the
	// job was stopped (from the lock, or the dump, to its resumption), for
	// a job that goes on; Total is the whole checkpoint.
	Hash, GPULock, GPUCheckpoint, Dump, Store, GPUResume, Pause, Total time.Duration
	ImagesInRAM                                                        bool
	// Backlog and Commit divide Store (when not Fast): storing what
	// was left of the memory images when CRIU had dumped them all, then
	// the copy of the memory CRIU left out (CopiedPages), the small
	// images, the data file's flush and the catalog's commit.
	Backlog, Commit time.Duration
	// CopiedPages is how many bytes of the tree's memory stasis copied
	// itself rather than CRIU (Options.DumpPages); EarlyCopied, how many
	// of them it copied while CRIU dumped (early.go). EarlyDropped says
	// why an early copy did not hold, for each that did not.
	CopiedPages, EarlyCopied int64
	EarlyDropped             []string
	// Plan is what the preflight found and chose.
	Plan *Plan
	// PagesCopied says whether stasis copied the memory (a dump with lazy
	// pages) rather than CRIU writing it: what Options.DumpPages and its
	// limits came to.
	PagesCopied bool
}

// Run checkpoints the process tree rooted at o.PID into s.
func Run(ctx context.Context, s *catalog.Store, o Options) (*Result, error) {
	start := time.Now()
	if o.PID == os.Getpid() {
		return nil, fmt.Errorf("%w: stasis cannot checkpoint itself", catalog.ErrInvalid)
	}
	// CRIU's answer to --version (a cold start of CRIU: tens of
	// milliseconds) comes while stasis looks at the tree and hashes its
	// files; it is awaited before the GPU side is looked at and before
	// anything is locked, frozen or begun in the store.
	type found struct {
		path    string
		version int
		err     error
	}
	resolved := make(chan found, 1)
	go func(path string) {
		path, version, err := criu.ResolveCached(path, s.CacheDir("criu"))
		resolved <- found{path, version, err}
	}(o.CRIU.Path)
	tree, err := Tree(o.PID)
	if err != nil {
		return nil, err
	}
	trace.Mark("checkpoint: tree read")
	for _, p := range tree {
		if p.PID == os.Getpid() {
			return nil, fmt.Errorf("%w: PID %d is an ancestor of stasis itself", catalog.ErrInvalid, o.PID)
		}
	}
	// A tree in a PID namespace of its own (restored there by stasis, as
	// `restore --new-pidns` and `stasis run` do) is dumped by CRIU run
	// inside its PID and mount namespaces: from outside, CRIU would need
	// the namespace's init in the dump. The images, and the checkpoint's
	// description, hold the PIDs the tree has in there.
	dumpPID := o.PID
	nested, err := ownPIDNS(o.PID)
	if err != nil {
		return nil, err
	}
	if nested {
		if !ownProcMounted(o.PID) {
			return nil, fmt.Errorf("%w: PID %d runs in a PID namespace of its own whose /proc is not mounted in its mount namespace; CRIU can dump it only from inside, with that /proc", catalog.ErrInvalid, o.PID)
		}
		o.CRIU.NamespacesOf, dumpPID = o.PID, NSPID(o.PID)
	}
	// The preflight: which processes are CUDA processes, the CRIU
	// options the tree needs, or why it cannot be checkpointed; nothing
	// is touched before it has answered.
	plan, criuOpts, err := Preflight(tree, o.CRIU)
	if err != nil {
		return nil, err
	}
	o.CRIU = criuOpts
	trace.Mark("checkpoint: preflight done")
	if o.Fast {
		o.LeaveRunning = true
	}
	o.CRIU.LeaveRunning = o.LeaveRunning
	if o.Job == "" {
		o.Job = tree[0].Comm
	}
	// The images hold the tree's memory, and the ghost files CRIU
	// copies whole.
	rss := plan.GhostBytes
	for _, p := range tree {
		rss += p.RSSBytes
	}
	// Hashing the files the tree maps (a PyTorch job maps gigabytes of
	// libraries) happens here, while the job runs: once frozen, the same
	// files are found in the cache at the cost of a stat each.
	hasher := NewHasher(s.CacheDir("sha256"))
	hashStart := time.Now()
	mapped, _, _ := usedFiles(tree)
	hasher.Describe(mapped)
	hashTime := time.Since(hashStart)
	trace.Mark("checkpoint: mapped files hashed")
	criuFound := <-resolved
	if criuFound.err != nil {
		return nil, criuFound.err
	}
	trace.Mark("checkpoint: CRIU's version known")
	o.CRIU.Path, o.CRIU.Version = criuFound.path, criuFound.version
	var gpu *gpuSession
	var gpuMeta *GPUMeta
	if pids := plan.CUDAPIDs; len(pids) > 0 {
		drv := plan.drv
		gpu = &gpuSession{drv: drv, pids: pids}
		gpuMeta = &GPUMeta{PIDs: pids, Backend: drv.Backend().Kind}
		if gpuMeta.DriverVersion, err = drv.DriverVersion(); err != nil {
			return nil, err
		}
		if gpuMeta.Devices, err = drv.Devices(); err != nil {
			return nil, err
		}
	}

	pending, err := s.Begin(catalog.KindProcess, o.Job, o.Step, o.Tags)
	if err != nil {
		return nil, err
	}
	trace.Mark("checkpoint: begun in the store")
	committed := false
	defer func() {
		if !committed {
			pending.Abort()
		}
	}()
	res := &Result{Hash: hashTime, Plan: plan}
	pauseStart := time.Now()
	// gpuOK tells the watchdog, at the end, whether the job's GPU side runs
	// again; if not, it tries again once stasis is gone.
	gpuOK := true
	if gpu != nil {
		// If stasis dies from here on, the watchdog resumes the job.
		dog, err := startWatchdog(gpu.pids, s.LogPath("watchdog.log"), nil)
		if err != nil {
			return nil, err
		}
		defer func() { dog.Release(gpuOK) }()
		err = gpu.lockAndCheckpoint(o.LockTimeout)
		res.GPULock, res.GPUCheckpoint = gpu.lockTime, gpu.checkpointTime
		if err != nil {
			err = gpu.rollback("checkpoint", err)
			gpuOK = !gpu.stuck
			return nil, err
		}
		// The CUDA checkpoint moved GPU memory into host memory: the
		// images will be that much larger.
		rss = treeRSS(tree) + plan.GhostBytes
	}
	// fail rolls the GPU side back after a failure past its checkpoint.
	fail := func(err error) (*Result, error) {
		if gpu != nil {
			err = gpu.rollback("checkpoint", err)
			gpuOK = !gpu.stuck
		}
		return nil, err
	}

	// Images go to RAM when the tree's resident memory (about the image
	// size), with a margin, fits there.
	scratch, err := s.NewScratch("dump", rss+rss/4+256<<20)
	if err != nil {
		return fail(err)
	}
	defer scratch.Remove()
	images, work, err := criu.MakeDirs(scratch.Dir)
	if err != nil {
		return fail(err)
	}
	res.ImagesInRAM = scratch.InRAM()
	meta := Meta{
		PID: dumpPID, Processes: tree, CRIUVersion: criu.FormatVersion(o.CRIU.Version), Kernel: KernelRelease(),
		LeaveRunning: o.LeaveRunning, ShellJob: o.CRIU.ShellJob, TCPEstablished: o.CRIU.TCPEstablished,
		ExtUnixSockets: o.CRIU.ExtUnixSockets, FileLocks: o.CRIU.FileLocks, LinkRemap: o.CRIU.LinkRemap,
		GhostLimit: o.CRIU.GhostLimit, GPU: gpuMeta, Preflight: plan,
	}
	if nested {
		meta.Processes = insideView(tree)
		if gpuMeta != nil {
			inside := *gpuMeta
			inside.PIDs = nil
			for _, pid := range gpuMeta.PIDs {
				inside.PIDs = append(inside.PIDs, NSPID(pid))
			}
			meta.GPU = &inside
		}
	}
	// Whether stasis copies the memory pages itself, after CRIU's dump,
	// with the tree frozen (then nothing comes through CRIU's pipes that
	// a backlog would help with).
	copyPages := o.DumpPages.copies(gpu != nil) && !o.Fast && !nested && criu.LazyPagesFit(rss)
	res.PagesCopied = copyPages
	w := o.Writer
	w.Progress = o.Progress
	if w.Backlog == 0 && !copyPages {
		// The memory images come in faster than the disk takes what
		// does not compress: let them run ahead into memory (a quarter
		// of what is available, at most maxBacklog) while the disk
		// catches up on what follows, zeros that compress to nothing.
		if avail := catalog.MemAvailable(); avail > 0 {
			w.Backlog = min(avail/4, maxBacklog)
		}
	}
	packer, err := fileset.NewPacker(ctx, pending, w)
	if err != nil {
		return fail(err)
	}
	// Unless in fast mode, the memory images (pages-N.img, nearly all of
	// the bytes) go into the store while CRIU dumps them. CRIU hands them
	// over through pipes (a streamed dump: no copy of the memory in the
	// scratch directory), except when it dumps from inside the tree's
	// namespaces, where it writes them into the scratch directory and
	// the store follows the files as they grow, freeing what it took.
	// drain waits until the memory images are all in the store; release
	// ends the streaming once CRIU is gone.
	drain, release := func() error { return nil }, func() error { return nil }
	switch {
	case o.Fast:
	case !nested:
		o.CRIU.Stream = true
		o.CRIU.LazyPages = copyPages
		var packing sync.Mutex
		capture, err := criu.CaptureImages(images, func(name string, r io.Reader) error {
			// One memory image at a time goes straight into the data
			// file; the other images (and a second memory image CRIU
			// writes at the same time, if it ever does) go to files. When
			// stasis copies the pages, CRIU's memory images are small and
			// go to files too, to be completed (copyLazyPages).
			if IsPagesImage(name) && !copyPages && packing.TryLock() {
				defer packing.Unlock()
				return packer.Stream(name, r)
			}
			return saveImage(filepath.Join(images, name), r)
		})
		if err != nil {
			packer.Abort()
			return fail(err)
		}
		drain = capture.Drain
		release = func() error {
			capture.Close()
			return capture.Err()
		}
	default:
		stop := make(chan struct{})
		followed := make(chan error, 1)
		go func() { followed <- packer.Follow(images, IsPagesImage, stop, true) }()
		var once sync.Once
		var followErr error
		drain = func() error {
			once.Do(func() {
				close(stop)
				followErr = <-followed
			})
			return followErr
		}
		release = drain
	}

	early := &earlyCopies{}
	defer func() { early.dropAll() }()
	var imagesDone time.Time
	var frozenFiles []string
	var frozenShared map[string]bool
	hooks := criu.Hooks{
		// The tree is frozen and its images complete: store and commit
		// them now (in fast mode: after the job resumes). An error here
		// makes CRIU resume the tree.
		PostDump: func() error {
			imagesDone = time.Now()
			trace.Mark("checkpoint: post-dump")
			// What the tree uses as it was dumped; their hashes come
			// with the commit, from the cache filled before the freeze.
			frozenFiles, frozenShared, meta.Mounts = usedFiles(tree)
			if err := confirmCRIU(o.CRIU, s.CacheDir("criu"), work, &meta); err != nil {
				return err
			}
			if o.Fast {
				return nil
			}
			// The tree waits, frozen, for what is left to be stored: the
			// last chunks take a faster codec (once the copy of the
			// memory is under way, with those of its chunks that are
			// encoded last).
			if !copyPages {
				packer.Hurry()
			}
			meta.MappedFiles = hasher.Describe(frozenFiles)
			MarkSharedWritable(meta.MappedFiles, frozenShared)
			t := time.Now()
			if err := drain(); err != nil {
				return err
			}
			res.Backlog = time.Since(t)
			trace.Mark("checkpoint: memory images stored")
			t = time.Now()
			if copyPages {
				copies, err := copyLazyPages(packer, images, early.wait(), res)
				defer func() {
					for _, c := range copies {
						c.Close()
					}
				}()
				if err != nil {
					return err
				}
				for _, c := range copies {
					res.CopiedPages += c.Lazy()
				}
				trace.Mark("checkpoint: copies of the memory queued")
				packer.Hurry()
			}
			rec, err := commit(pending, packer, images, work, meta, early.held())
			res.Commit = time.Since(t)
			if err != nil {
				return err
			}
			committed = true
			res.Record = rec
			return nil
		},
	}
	// The largest part of the memory stasis will copy: copied from now
	// on, while CRIU dumps (early.go).
	if copyPages && !o.NoEarlyCopy {
		early = startEarlyCopies(ctx, pending, tree, w)
	}
	dumpStart := time.Now()
	trace.Mark("checkpoint: CRIU starts")
	dumpErr := criu.Dump(o.CRIU, dumpPID, images, work, hooks)
	trace.Mark("checkpoint: CRIU done")
	// When storing failed (or was interrupted), CRIU failed because of it
	// (its writes into the image pipes broke): the store's error is the
	// cause.
	if storeErr := release(); storeErr != nil && !committed {
		if dumpErr == nil {
			dumpErr = storeErr
		} else {
			dumpErr = fmt.Errorf("%w; then %w", storeErr, dumpErr)
		}
	}
	if !committed && (dumpErr != nil || !o.Fast) {
		packer.Abort()
	}
	if dumpErr == nil && !committed && !o.Fast {
		dumpErr = errors.New("criu dump returned without running the post-dump step")
	}
	if dumpErr != nil {
		criu.KeepLog(dumpErr, s.KeepLog)
		if !committed {
			return fail(dumpErr)
		}
		// CRIU failed after the commit. The checkpoint is complete and
		// stays, whether CRIU ended the tree or resumed it; a resumed
		// tree gets its GPU side back.
		state := "has ended"
		if running(o.PID) {
			state = "runs on"
			if gpu != nil {
				if err := gpu.resume(); err != nil {
					gpuOK = false
					dumpErr = errors.Join(dumpErr, err)
				}
			}
		}
		return nil, fmt.Errorf("checkpoint %s is stored, but CRIU reported an error after the commit (the job %s): %w", res.Record.ID, state, dumpErr)
	}
	resumed := time.Now()
	var resumeErr error
	if gpu != nil && o.LeaveRunning {
		if resumeErr = gpu.resume(); resumeErr != nil {
			gpuOK = false
		}
		res.GPUResume = time.Since(resumed)
	}
	if o.LeaveRunning {
		res.Pause = time.Since(pauseStart)
	}
	res.Dump = imagesDone.Sub(dumpStart)
	if o.Fast {
		// The job runs again: now compress, checksum and commit (the
		// images are complete even if the GPU side could not resume).
		storeStart := time.Now()
		meta.MappedFiles = hasher.Describe(frozenFiles)
		MarkSharedWritable(meta.MappedFiles, frozenShared)
		rec, err := commit(pending, packer, images, work, meta, nil)
		if err != nil {
			packer.Abort()
			return nil, errors.Join(fmt.Errorf("the job runs on, but its checkpoint could not be stored: %w", err), resumeErr)
		}
		committed = true
		res.Record = rec
		res.Store = time.Since(storeStart)
	} else {
		res.Store = resumed.Sub(imagesDone)
	}
	if resumeErr != nil {
		return nil, fmt.Errorf("checkpoint %s is stored, but the job's GPU side could not be resumed (the watchdog tries again; so does `stasis recover`): %w", res.Record.ID, resumeErr)
	}
	res.Total = time.Since(start)
	return res, nil
}

// maxBacklog bounds the memory a checkpoint's images may take while they
// wait for the disk.
const maxBacklog = 8 << 30

// commit adds the rest of the images (with the dump log so far) to what
// the packer streamed, and commits the checkpoint.
func commit(p *catalog.Pending, packer *fileset.Packer, images, work string, meta Meta, early []*earlyCopy) (*catalog.Record, error) {
	if err := copyLog(filepath.Join(work, criu.DumpLog), filepath.Join(images, criu.DumpLog)); err != nil {
		return nil, err
	}
	if err := packer.AddDir(images); err != nil {
		return nil, err
	}
	trace.Mark("checkpoint: small images added")
	if err := packer.Close(); err != nil {
		return nil, err
	}
	for _, e := range early {
		if err := e.close(p); err != nil {
			return nil, err
		}
	}
	trace.Mark("checkpoint: data files durable")
	raw, err := json.Marshal(meta)
	if err != nil {
		return nil, err
	}
	p.Manifest.Meta = raw
	return p.Commit()
}

// confirmCRIU holds the checkpoint to the version CRIU logged (the one
// stasis went by may come from its cache, which ConfirmVersion corrects):
// the checkpoint records it, and a CRIU older than criu.MinVersion fails
// the dump before anything is committed.
func confirmCRIU(o criu.Options, cacheDir, work string, meta *Meta) error {
	v := criu.ConfirmVersion(o.Path, cacheDir, filepath.Join(work, criu.DumpLog), o.Version)
	meta.CRIUVersion = criu.FormatVersion(v)
	return criu.CheckVersion(o.Path, v)
}

// copyLazyPages stores the complete memory image of each process CRIU
// dumped with lazy pages (criu.CopyLazyPages; the processes of its
// pstree.img, as restore's fill plan finds them, PIDs as this namespace
// sees them), the writer's workers copying its memory, and removes CRIU's
// own memory images (the pages it wrote are among the stored ones). The
// tree must stay frozen until the packer is closed; then the caller
// closes the copies.
func copyLazyPages(packer *fileset.Packer, images string, early map[int]*earlyCopy, res *Result) ([]*criu.PageCopy, error) {
	pids, err := criu.ReadPstree(filepath.Join(images, "pstree.img"))
	if err != nil {
		return nil, err
	}
	var copies []*criu.PageCopy
	for _, pid := range pids {
		if _, err := os.Stat(filepath.Join(images, fmt.Sprintf("pagemap-%d.img", pid))); errors.Is(err, os.ErrNotExist) {
			continue // a zombie has no memory
		}
		c, err := criu.CopyLazyPages(images, pid)
		if err != nil {
			return copies, err
		}
		copies = append(copies, c)
		stored := false
		if e := early[pid]; e != nil {
			if err := e.finish(c); err != nil {
				trace.Mark("checkpoint: early copy dropped: " + err.Error())
				res.EarlyDropped = append(res.EarlyDropped, err.Error())
				e.drop()
			} else {
				res.EarlyCopied += e.full
				stored = true
			}
		}
		if !stored {
			if err := packer.StreamFill(c.Name, c.Size(), c.ReadAt); err != nil {
				return copies, err
			}
		}
		if err := os.Remove(c.Written); err != nil {
			return copies, err
		}
	}
	return copies, nil
}

// saveImage writes an image CRIU hands over (or the log) to a new file.
func saveImage(path string, r io.Reader) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// IsPagesImage matches CRIU's memory images, pages-N.img.
func IsPagesImage(name string) bool {
	return strings.HasPrefix(name, "pages-") && strings.HasSuffix(name, ".img")
}

// copyLog copies what CRIU has logged so far, so the checkpoint keeps it.
func copyLog(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	return saveImage(to, src)
}

// KernelRelease is this machine's kernel release (uname -r).
func KernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}
