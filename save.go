package stasis

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"sync/atomic"
	"time"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/gdswriter"
	"github.com/stasis-ckpt/stasis/tensors"
)

// Checkpoint collects the buffers of one checkpoint until it is committed.
// It is used by one goroutine.
type Checkpoint struct {
	store   *Store
	job     string
	step    int64
	tags    map[string]string
	tensors []Tensor
	names   map[string]bool
	state   json.RawMessage
	method  gdswriter.Method // "" for the store's
	io      string           // "" for the store's
	used    bool
	// part, when set, makes this checkpoint one rank's part of a job
	// checkpoint (SetPart).
	part *PartOptions
}

// maxState bounds the state description: it lives in the manifest, which
// readers take up to 256 MiB, indented.
const maxState = 16 << 20

// Begin starts a checkpoint of job at step.
func (s *Store) Begin(job string, step int64) *Checkpoint {
	return &Checkpoint{store: s, job: job, step: step, names: map[string]bool{}}
}

// Add adds buffers, all of them or, on error, none. Their memory must stay
// valid until Commit returns, or until CommitAsync returns (the snapshot
// is taken by then). The caller orders its own GPU work before the copies:
// they wait for work on the legacy default stream only, so work on other
// streams must be synchronized first.
func (c *Checkpoint) Add(ts ...Tensor) error {
	added := map[string]bool{}
	for _, t := range ts {
		if c.names[t.Name] || added[t.Name] {
			return fmt.Errorf("%w: two tensors are named %s", ErrMismatch, t.Name)
		}
		if err := tensors.Check(t); err != nil {
			return err
		}
		added[t.Name] = true
	}
	for _, t := range ts {
		c.names[t.Name] = true
	}
	c.tensors = append(c.tensors, ts...)
	return nil
}

// SetState records the caller's description of the state the tensors
// belong to (any JSON value, up to 16 MiB); Describe returns it.
func (c *Checkpoint) SetState(state json.RawMessage) error {
	if len(state) > maxState {
		return fmt.Errorf("%w: the state description is %d bytes, more than %d: keep large data in tensors or arrays, not in lists", catalog.ErrInvalid, len(state), maxState)
	}
	if !json.Valid(state) {
		return fmt.Errorf("%w: the state description is not valid JSON", catalog.ErrInvalid)
	}
	c.state = append(json.RawMessage(nil), state...)
	return nil
}

// SetCompress chooses the codec method of this checkpoint ("auto", "none",
// "zstd", "s2") instead of the store's.
func (c *Checkpoint) SetCompress(method string) error {
	m, err := gdswriter.ParseMethod(method)
	if err != nil {
		return fmt.Errorf("%w: %v", catalog.ErrInvalid, err)
	}
	c.method = m
	return nil
}

// SetIO chooses the I/O path of this checkpoint's GPU buffers ("auto",
// "cufile", "pinned") instead of the store's, for Commit; CommitAsync
// copies them into a host snapshot, written through stasis's own
// pipeline whatever the path.
func (c *Checkpoint) SetIO(io string) error {
	if _, err := tensors.ParseIO(io); err != nil {
		return err
	}
	c.io = io
	return nil
}

// Tag adds a tag to the checkpoint's record.
func (c *Checkpoint) Tag(key, value string) {
	if c.tags == nil {
		c.tags = map[string]string{}
	}
	c.tags[key] = value
}

func (c *Checkpoint) options(meta tensors.Meta) tensors.SaveOptions {
	meta.State = c.state
	method := c.method
	if method == "" {
		method = c.store.method
	}
	io := c.io
	if io == "" {
		io = c.store.io
	}
	tags := maps.Clone(c.tags)
	if c.part != nil {
		tags = c.part.info().Tags(tags)
	}
	return tensors.SaveOptions{
		Job: c.job, Step: c.step, Tags: tags, Meta: meta, IO: io,
		Writer: gdswriter.WriterOptions{Method: method, Workers: c.store.workers},
	}
}

// check reports what would keep the checkpoint from being committed.
func (c *Checkpoint) check() error {
	if c.used {
		return fmt.Errorf("%w: this checkpoint was already committed", catalog.ErrInvalid)
	}
	if c.step < 0 {
		return fmt.Errorf("%w: step %d: steps are 0 or more", catalog.ErrInvalid, c.step)
	}
	if err := catalog.ValidateJob(c.job); err != nil {
		return err
	}
	for k := range c.tags {
		if strings.HasPrefix(k, "stasis.") {
			return fmt.Errorf("%w: tag %q: the stasis. prefix is reserved", catalog.ErrInvalid, k)
		}
	}
	return catalog.ValidateTags(c.tags)
}

// PartOptions make a checkpoint one rank's part of a job checkpoint.
type PartOptions struct {
	Rank, WorldSize int
	// Attempt is the key every rank of this run of the job shares.
	Attempt string
	// Timeout bounds the coordinator's wait for the other ranks' parts
	// (DefaultPartTimeout when zero).
	Timeout time.Duration
	// NoCommit leaves the job checkpoint to a later Store.CommitJob:
	// rank 0's part is committed like any other's (the DCP backend
	// commits the job checkpoint with DCP's metadata once every rank has
	// written).
	NoCommit bool
}

func (p *PartOptions) info() catalog.PartInfo {
	return catalog.PartInfo{Attempt: p.Attempt, Rank: p.Rank, WorldSize: p.WorldSize}
}

// SetPart makes the checkpoint rank's part of the job checkpoint of its
// job and step: each rank's process saves its own part, and rank 0 (the
// coordinator), once its part is committed, waits up to p.Timeout for
// every other rank's and commits the job checkpoint (unless p.NoCommit);
// its Commit (or Save) returns the job checkpoint's record, the other
// ranks' that of their part. Nothing is listed until the job checkpoint
// is complete (docs/format.md).
func (c *Checkpoint) SetPart(p PartOptions) error {
	if err := p.info().Validate(); err != nil {
		return err
	}
	if p.Timeout <= 0 {
		p.Timeout = DefaultPartTimeout
	}
	c.part = &p
	return nil
}

// DefaultPartTimeout is how long the coordinator of a job checkpoint
// waits for the other ranks' parts by default.
const DefaultPartTimeout = 10 * time.Minute

// finish completes a committed checkpoint: for the coordinator of a job
// checkpoint, the job checkpoint.
func (c *Checkpoint) finish(ctx context.Context, rec *catalog.Record) (*catalog.Record, error) {
	if c.part == nil || c.part.Rank != 0 || c.part.NoCommit {
		return rec, nil
	}
	return c.store.cat.CommitJob(ctx, c.job, c.step, c.part.info(), c.part.Timeout, nil)
}

// CommitJob commits the job checkpoint of job at step once every rank's
// part in p.Attempt is committed (waiting up to p.Timeout), recording app
// (a JSON value, or nil) for its readers; for parts saved with NoCommit.
func (s *Store) CommitJob(ctx context.Context, job string, step int64, p PartOptions, app json.RawMessage) (Record, error) {
	if p.Timeout <= 0 {
		p.Timeout = DefaultPartTimeout
	}
	rec, err := s.cat.CommitJob(ctx, job, step, p.info(), p.Timeout, app)
	if err != nil {
		return Record{}, err
	}
	return *rec, nil
}

// Job reads job's complete job checkpoint at step (its latest when step
// < 0): its record and its parts, each checked against it.
func (s *Store) Job(job string, step int64) (Record, *catalog.JobMeta, error) {
	recs, err := s.jobRecords(job)
	if err != nil {
		return Record{}, nil, err
	}
	for i := len(recs) - 1; i >= 0; i-- {
		if recs[i].Kind == catalog.KindJob && (step < 0 || recs[i].Step == step) {
			_, jm, err := s.cat.JobParts(recs[i].ID)
			return recs[i], jm, err
		}
	}
	return Record{}, nil, fmt.Errorf("%w: job %q has no complete job checkpoint%s", catalog.ErrNotFound, job, map[bool]string{true: "", false: fmt.Sprintf(" at step %d", step)}[step < 0])
}

// Commit writes the checkpoint and returns once it is durable and listed.
// GPU memory is copied chunk by chunk into pinned buffers as the writer
// needs it, so the buffers must not change until Commit returns. A save in
// flight is waited for first.
func (c *Checkpoint) Commit(ctx context.Context) (Record, error) {
	if err := c.check(); err != nil {
		return Record{}, err
	}
	s := c.store
	if err := s.idle(false); err != nil {
		return Record{}, err
	}
	defer s.saveMu.Unlock()
	c.used = true
	rec, err := tensors.Save(ctx, s.cat, c.tensors, c.options(tensors.Meta{}))
	if err == nil {
		rec, err = c.finish(ctx, rec)
	}
	if err != nil {
		return Record{}, err
	}
	return *rec, nil
}

// Prepare readies the snapshot memory for asynchronous saves of buffers
// like ts (the same sizes; their contents are not read): it is allocated
// now and, for GPU buffers, pinned in the background, so that even the
// first CommitAsync copies at the bus's speed. A training loop calls it
// once, before its first save; without it, the first save pays for
// allocating the memory. A save in flight is waited for first.
func (s *Store) Prepare(ts []Tensor) error {
	for _, t := range ts {
		if err := tensors.Check(t); err != nil {
			return err
		}
	}
	if err := s.idle(false); err != nil {
		return err
	}
	defer s.saveMu.Unlock()
	return s.arena.prepare(ts)
}

// idle takes saveMu on an open store once no save is in flight: it waits
// for one, or with failIfBusy returns ErrSaveInFlight. On error saveMu is
// not held.
func (s *Store) idle(failIfBusy bool) error {
	s.saveMu.Lock()
	if s.closed {
		s.saveMu.Unlock()
		return errClosed
	}
	if prev := s.inflight; prev != nil && !prev.Done() {
		if failIfBusy {
			s.saveMu.Unlock()
			return fmt.Errorf("%w: the save of step %d has not finished", ErrSaveInFlight, prev.step)
		}
		prev.Wait()
	}
	return nil
}

// AsyncOptions configure CommitAsync.
type AsyncOptions struct {
	// FailIfBusy makes CommitAsync return ErrSaveInFlight instead of waiting when
	// an earlier save is still in flight.
	FailIfBusy bool
}

// Save is an asynchronous save: the snapshot is taken, the write runs in
// the background.
type Save struct {
	step int64 // set before the save starts, read by later commits
	done atomic.Bool
	ch   chan struct{}
	rec  Record
	err  error
	// Waited is how long CommitAsync waited for the save before it;
	// Snapshot is how long it took to copy the buffers out. Their sum is
	// the training loop's stall.
	Waited, Snapshot time.Duration
}

// Wait blocks until the checkpoint is durable and listed (or failed).
func (v *Save) Wait() (Record, error) {
	<-v.ch
	return v.rec, v.err
}

// Done reports whether the save has finished (successfully or not).
func (v *Save) Done() bool { return v.done.Load() }

const whySnapshot = "buffers copied into a pinned host snapshot before the save returned (GPU memory by the driver), then checksummed, compressed and written with O_DIRECT in the background"

// CommitAsync copies every buffer into the store's snapshot memory (pinned
// host memory, kept for later saves) and returns; compression, writing and
// the commit run in the background. Once it returns the caller may change
// or free the buffers. A save still in flight is waited for first, unless
// o.FailIfBusy (the checkpoint may then be committed later). An error
// during the snapshot is returned at once, and nothing is listed.
// Cancelling ctx aborts the background save.
func (c *Checkpoint) CommitAsync(ctx context.Context, o AsyncOptions) (*Save, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	s := c.store
	start := time.Now()
	if err := s.idle(o.FailIfBusy); err != nil {
		return nil, err
	}
	defer s.saveMu.Unlock()
	c.used = true
	waited := time.Now()
	views, err := s.arena.snapshot(c.tensors)
	if err != nil {
		return nil, err
	}
	v := &Save{step: c.step, ch: make(chan struct{}), Waited: waited.Sub(start), Snapshot: time.Since(waited)}
	opts := c.options(tensors.Meta{IOPath: "snapshot", Why: whySnapshot})
	s.inflight = v
	go func() {
		defer close(v.ch)
		defer v.done.Store(true)
		rec, err := tensors.Save(ctx, s.cat, views, opts)
		if err == nil {
			rec, err = c.finish(ctx, rec)
		}
		if err != nil {
			v.err = err
			return
		}
		v.rec = *rec
	}()
	return v, nil
}
