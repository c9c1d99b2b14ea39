// Package checkpoint is the whole-process checkpoint state machine: it finds
// the process tree, has CRIU dump it into a scratch directory (in RAM when
// it fits), and, while the tree is still frozen, packs the images into the
// store (compressed, checksummed, durable) and commits them. Only then does
// CRIU kill the tree (or resume it, with LeaveRunning). If anything fails
// before the commit, including stasis being killed, CRIU resumes the tree:
// a failed checkpoint never leaves the job stopped or dead.
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
	"time"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/criu"
	"github.com/stasis-ckpt/stasis/fileset"
	"github.com/stasis-ckpt/stasis/gdswriter"
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
	CRIU         criu.Options
	Writer       gdswriter.WriterOptions
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
}

// Result reports a checkpoint.
type Result struct {
	Record *catalog.Record
	// Dump is CRIU's time from the start of the dump to the images being
	// complete; Store is packing and committing them; the tree is frozen
	// for about Dump+Store.
	Dump, Store, Total time.Duration
	ImagesInRAM        bool
}

// Run checkpoints the process tree rooted at o.PID into s.
func Run(ctx context.Context, s *catalog.Store, o Options) (*Result, error) {
	start := time.Now()
	if o.PID == os.Getpid() {
		return nil, fmt.Errorf("%w: stasis cannot checkpoint itself", catalog.ErrInvalid)
	}
	tree, err := Tree(o.PID)
	if err != nil {
		return nil, err
	}
	for _, p := range tree {
		if p.PID == os.Getpid() {
			return nil, fmt.Errorf("%w: PID %d is an ancestor of stasis itself", catalog.ErrInvalid, o.PID)
		}
	}
	criuPath, criuVersion, err := criu.Resolve(o.CRIU.Path)
	if err != nil {
		return nil, err
	}
	o.CRIU.Path = criuPath
	o.CRIU.LeaveRunning = o.LeaveRunning
	if o.Job == "" {
		o.Job = tree[0].Comm
	}
	var rss int64
	for _, p := range tree {
		rss += p.RSSBytes
	}

	pending, err := s.Begin(catalog.KindProcess, o.Job, o.Step, o.Tags)
	if err != nil {
		return nil, err
	}
	committed := false
	defer func() {
		if !committed {
			pending.Abort()
		}
	}()
	// Images go to RAM when the tree's resident memory (about the image
	// size), with a margin, fits there.
	scratch, err := s.NewScratch("dump", rss+rss/4+256<<20)
	if err != nil {
		return nil, err
	}
	defer scratch.Remove()
	images, work := filepath.Join(scratch.Dir, "images"), filepath.Join(scratch.Dir, "work")
	for _, d := range []string{images, work} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return nil, err
		}
	}

	meta := Meta{
		PID: o.PID, Processes: tree, CRIUVersion: criu.FormatVersion(criuVersion), Kernel: kernelRelease(),
		LeaveRunning: o.LeaveRunning, ShellJob: o.CRIU.ShellJob, TCPEstablished: o.CRIU.TCPEstablished,
		ExtUnixSockets: o.CRIU.ExtUnixSockets, FileLocks: o.CRIU.FileLocks,
	}
	res := &Result{ImagesInRAM: scratch.InRAM()}
	w := o.Writer
	w.Progress = o.Progress
	packer, err := fileset.NewPacker(ctx, pending, w)
	if err != nil {
		return nil, err
	}
	// The memory images (pages-N.img, nearly all of the bytes) are
	// streamed into the store while CRIU writes them.
	stopFollowing := make(chan struct{})
	followed := make(chan error, 1)
	go func() { followed <- packer.Follow(images, isPagesImage, stopFollowing) }()
	finishFollowing := func() error {
		select {
		case <-stopFollowing:
			return nil
		default:
		}
		close(stopFollowing)
		return <-followed
	}

	var imagesDone time.Time
	hooks := criu.Hooks{
		// The tree is frozen and its images complete: store and commit
		// them now. An error here makes CRIU resume the tree.
		PostDump: func() error {
			imagesDone = time.Now()
			if err := finishFollowing(); err != nil {
				return err
			}
			rec, err := commit(pending, packer, images, work, meta)
			if err != nil {
				return err
			}
			committed = true
			res.Record = rec
			return nil
		},
	}
	dumpStart := time.Now()
	dumpErr := criu.Dump(o.CRIU, o.PID, images, work, hooks)
	if followErr := finishFollowing(); followErr != nil && dumpErr == nil && !committed {
		dumpErr = followErr
	}
	if !committed {
		packer.Abort()
	}
	if dumpErr != nil {
		criu.KeepLog(dumpErr, s.KeepLog)
		if committed {
			// CRIU failed after the commit, so the tree was resumed: a
			// checkpoint of a job that went on is not the job's state.
			if err := s.Remove(res.Record.ID); err != nil {
				return nil, errors.Join(dumpErr, err)
			}
		}
		return nil, dumpErr
	}
	if !committed {
		return nil, errors.New("criu dump returned without running the post-dump step")
	}
	res.Dump = imagesDone.Sub(dumpStart)
	res.Store = time.Since(imagesDone)
	res.Total = time.Since(start)
	return res, nil
}

// commit adds the rest of the images (with the dump log so far) to what
// the packer streamed, and commits the checkpoint.
func commit(p *catalog.Pending, packer *fileset.Packer, images, work string, meta Meta) (*catalog.Record, error) {
	if err := copyLog(filepath.Join(work, criu.DumpLog), filepath.Join(images, criu.DumpLog)); err != nil {
		return nil, err
	}
	if err := packer.AddDir(images); err != nil {
		return nil, err
	}
	if err := packer.Close(); err != nil {
		return nil, err
	}
	raw, err := json.Marshal(meta)
	if err != nil {
		return nil, err
	}
	p.Manifest.Meta = raw
	return p.Commit()
}

// isPagesImage matches CRIU's memory images, pages-N.img.
func isPagesImage(name string) bool {
	return strings.HasPrefix(name, "pages-") && strings.HasSuffix(name, ".img")
}

// copyLog copies what CRIU has logged so far, so the checkpoint keeps it.
func copyLog(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}
