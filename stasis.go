// Package stasis is the library a training loop calls: it saves named GPU
// or host buffers as one checkpoint of kind "tensors", either blocking or in
// the background after a snapshot, and loads them back into buffers the
// caller provides. It is the Go API; the C ABI (capi) and the Python
// package (python/stasis) are built on it.
//
//	s, _ := stasis.Open(stasis.Options{})
//	c := s.Begin("llama", 1200)
//	c.Add(stasis.Tensor{Name: "w", DType: "bf16", Shape: []int64{4096, 4096}, Device: ptr, Bytes: 32 << 20})
//	save, _ := c.CommitAsync(ctx) // returns once the GPU data is copied out
//	// ... the training step may change the buffers now ...
//	rec, err := save.Wait()
package stasis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/gdswriter"
	"github.com/stasis-ckpt/stasis/tensors"
)

// Tensor is a named buffer: a device pointer or host memory, its dtype and
// shape. See tensors.Tensor.
type Tensor = tensors.Tensor

// DType is an element type ("bf16", "fp32", ...).
type DType = tensors.DType

// Record is what the catalog keeps about a checkpoint.
type Record = catalog.Record

// ErrMismatch is wrapped by errors about buffers that do not match what
// they describe or what a checkpoint holds.
var ErrMismatch = tensors.ErrMismatch

// ErrSaveInFlight is returned by a save asked not to wait while another is in
// flight.
var ErrSaveInFlight = errors.New("a save is in flight")

// Options configure a Store.
type Options struct {
	// Home is the store's directory: $STASIS_HOME when empty, else the
	// default of catalog.DefaultHome.
	Home string
	// LockTimeout bounds the wait for the catalog's lock (10 s when zero).
	LockTimeout time.Duration
	// Compress is the codec method: "auto" (the default), "none", "zstd"
	// or "s2".
	Compress string
	// Workers is the number of compression and I/O workers (0: the
	// writer's default).
	Workers int
	// IO is the I/O path of GPU memory in blocking saves and in loads:
	// "auto", "cufile" or "pinned" (tensors.IOAuto, ...); "" is
	// $STASIS_IO, else auto.
	IO string
}

// Store is an open checkpoint store. Its methods may be called from several
// goroutines; saves are serialized (one in flight at a time).
type Store struct {
	cat     *catalog.Store
	method  gdswriter.Method
	workers int
	io      string // "" for $STASIS_IO

	saveMu   sync.Mutex // held while a save is begun: one snapshot at a time
	inflight *Save      // the latest asynchronous save
	arena    snapshotArena
	closed   bool // under saveMu
}

// errClosed is returned by the saving calls of a closed Store.
var errClosed = fmt.Errorf("%w: the store was closed", catalog.ErrInvalid)

// Open opens (creating if needed) the store.
func Open(o Options) (*Store, error) {
	home := o.Home
	if home == "" {
		home = os.Getenv("STASIS_HOME")
	}
	if home == "" {
		var err error
		if home, err = catalog.DefaultHome(); err != nil {
			return nil, err
		}
	}
	method := gdswriter.MethodAuto
	if o.Compress != "" {
		var err error
		if method, err = gdswriter.ParseMethod(o.Compress); err != nil {
			return nil, fmt.Errorf("%w: %v", catalog.ErrInvalid, err)
		}
	}
	if o.IO != "" {
		if _, err := tensors.ParseIO(o.IO); err != nil {
			return nil, err
		}
	}
	cat, err := catalog.Open(home, catalog.Options{LockTimeout: o.LockTimeout})
	if err != nil {
		return nil, err
	}
	return &Store{cat: cat, method: method, workers: o.Workers, io: o.IO}, nil
}

// Home is the store's directory.
func (s *Store) Home() string { return s.cat.Root }

// Close waits for a save in flight and frees the snapshot memory. The
// Store must not be used afterwards.
func (s *Store) Close() error {
	s.saveMu.Lock()
	defer s.saveMu.Unlock()
	if s.closed {
		return errClosed
	}
	s.closed = true
	var err error
	if s.inflight != nil {
		_, err = s.inflight.Wait()
	}
	s.arena.release()
	return err
}

// List returns the complete checkpoints of job ("" for all jobs), oldest
// step first.
func (s *Store) List(job string) ([]Record, error) {
	return s.cat.List(catalog.Filter{Job: job})
}

// Find returns job's tensors checkpoint at step, or its latest one when
// step < 0. Among checkpoints of the same step the newest wins; checkpoints
// of other kinds (a process checkpoint of the same job) are passed over.
func (s *Store) Find(job string, step int64) (Record, error) {
	recs, err := s.jobRecords(job)
	if err != nil {
		return Record{}, err
	}
	for i := len(recs) - 1; i >= 0; i-- {
		if recs[i].Kind == catalog.KindTensors && (step < 0 || recs[i].Step == step) {
			return recs[i], nil
		}
	}
	if step < 0 {
		return Record{}, fmt.Errorf("%w: job %q has no complete tensors checkpoint", catalog.ErrNotFound, job)
	}
	return Record{}, fmt.Errorf("%w: job %q has no complete tensors checkpoint at step %d", catalog.ErrNotFound, job, step)
}

// FindForRank returns what rank of a job of worldSize ranks loads of job
// at step (its latest when step < 0): its part of a job checkpoint, or a
// tensors checkpoint one process saved (which every rank loads whole).
// worldSize 0 takes the job checkpoint's; another than it is refused, as
// is rank < 0 for a job checkpoint.
func (s *Store) FindForRank(job string, step int64, rank, worldSize int) (Record, error) {
	recs, err := s.jobRecords(job)
	if err != nil {
		return Record{}, err
	}
	for i := len(recs) - 1; i >= 0; i-- {
		r := recs[i]
		if step >= 0 && r.Step != step {
			continue
		}
		switch r.Kind {
		case catalog.KindTensors:
			return r, nil
		case catalog.KindJob:
			if rank < 0 {
				return Record{}, fmt.Errorf("%w: checkpoint %s of job %q step %d is a job checkpoint of several ranks: load a rank's part (rank=, or $RANK)", catalog.ErrInvalid, r.ID, job, r.Step)
			}
			id, jm, err := s.cat.Part(r.ID, rank)
			if err == nil && worldSize > 0 && worldSize != jm.WorldSize {
				err = fmt.Errorf("%w: job checkpoint %s was saved by %d ranks, this job has %d: load it with the same world size, or through a resharding loader (DCP)", ErrMismatch, r.ID, jm.WorldSize, worldSize)
			}
			if err != nil {
				return Record{}, err
			}
			return s.cat.Resolve(id)
		}
	}
	if step < 0 {
		return Record{}, fmt.Errorf("%w: job %q has no complete tensors or job checkpoint", catalog.ErrNotFound, job)
	}
	return Record{}, fmt.Errorf("%w: job %q has no complete tensors or job checkpoint at step %d", catalog.ErrNotFound, job, step)
}

// jobRecords lists job's complete checkpoints, oldest step first.
func (s *Store) jobRecords(job string) ([]Record, error) {
	if err := catalog.ValidateJob(job); err != nil {
		return nil, err
	}
	return s.cat.List(catalog.Filter{Job: job})
}

// Info describes a tensors checkpoint: its record, its tensors (without
// buffers), and what the saver recorded about its state.
type Info struct {
	Record
	Tensors []Tensor        `json:"tensors"`
	State   json.RawMessage `json:"state,omitempty"`
	// IOPath is the path the saved bytes took (pinned, cufile,
	// cufile-compat, host, snapshot), and IOWhy why.
	IOPath string `json:"io_path"`
	IOWhy  string `json:"io_why,omitempty"`
}

// Describe reads the manifest of the checkpoint whose ID starts with id.
func (s *Store) Describe(id string) (*Info, error) {
	rec, err := s.cat.Resolve(id)
	if err != nil {
		return nil, err
	}
	m, err := s.cat.ReadManifest(rec.ID)
	if err != nil {
		return nil, err
	}
	ts, err := tensors.Describe(m)
	if err != nil {
		return nil, err
	}
	info := &Info{Record: rec, Tensors: ts}
	if len(m.Meta) > 0 {
		var meta tensors.Meta
		if err := json.Unmarshal(m.Meta, &meta); err != nil {
			return nil, fmt.Errorf("%w: checkpoint %s: meta: %v", catalog.ErrBadManifest, rec.ID, err)
		}
		info.State, info.IOPath, info.IOWhy = meta.State, meta.IOPath, meta.Why
	}
	return info, nil
}

// Load reads the checkpoint whose ID starts with id into the buffers of
// into, matched by name: every tensor it holds needs a buffer of the same
// dtype and size, and every buffer a tensor (the first mismatch is named).
// Every chunk is verified before its bytes reach a buffer, or, read by
// cuFile, in the GPU buffer it lands in (tensors.Load).
func (s *Store) Load(ctx context.Context, id string, into []Tensor) (Record, error) {
	return s.LoadWith(ctx, id, into, LoadOptions{})
}

// LoadOptions configure LoadWith.
type LoadOptions struct {
	// IO is the I/O path of GPU buffers, as Options.IO; "" is the store's.
	IO string
}

// LoadWith is Load with options.
func (s *Store) LoadWith(ctx context.Context, id string, into []Tensor, o LoadOptions) (Record, error) {
	io := o.IO
	if io == "" {
		io = s.io
	}
	rec, err := s.cat.Resolve(id)
	if err != nil {
		return Record{}, err
	}
	_, err = tensors.Load(ctx, s.cat, rec.ID, into, tensors.LoadOptions{Read: catalog.ReadOptions{Workers: s.workers}, IO: io})
	return rec, err
}
