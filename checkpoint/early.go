package checkpoint

import (
	"context"
	"fmt"
	"hash/maphash"
	"os"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/criu"
	"github.com/stasis-ckpt/stasis/gdswriter"
	"github.com/stasis-ckpt/stasis/internal/trace"
)

// With --dump-pages copy, stasis copies the memory CRIU leaves out (lazy
// pages) once CRIU's post-dump action runs, and the durable write of
// nearly all of the checkpoint starts only then. An early copy starts on
// the largest part of it at once, while CRIU freezes the tree and dumps
// the rest: criu.PredictLazyRun says which pages CRIU will list one after
// the other, and they are copied into a data file of their own, at a
// chunk boundary of its stream, with room reserved before them
// (gdswriter.Writer.Reserve). At post-dump the copy holds only if
//   - CRIU listed those pages, page for page, as predicted
//     (criu.PageCopy.Locate), with no more of the pages image before them
//     than the room reserved, and
//   - every chunk copied before the freeze still holds what was copied: it
//     is read again and compared (a 64-bit hash with a seed of this run).
// Then the reserved room gets the zeros of a gap and the start of the
// pages image, and the rest of the image follows the run. Otherwise the
// early data file is dropped and the image copied at post-dump as before;
// the checkpoint is the same either way.

// minEarlyChunks is the least number of whole chunks worth an early copy.
const minEarlyChunks = 2

type earlyCopy struct {
	pid   int
	name  string // the data file, data.NNNN
	path  string
	run   criu.LazyRun
	segAt []int64 // the run offset of each segment
	chunk int64
	room  int64 // stream bytes reserved before the run
	full  int64 // bytes of the run copied early: whole chunks
	mem   *criu.MemoryReader
	seed  maphash.Seed

	w      *gdswriter.Writer
	cancel context.CancelFunc
	done   chan struct{} // closed when the copy's FillParallel returns
	err    error         // what it returned

	// frozen is set at post-dump; a chunk copied before then has its
	// hash in sums, to be compared then.
	mu     sync.RWMutex
	frozen bool
	sums   []uint64
	copied []bool

	entry catalog.Entry // the pages image, once the copy held
}

// startEarlyCopy predicts the largest run of pid's lazy pages and starts
// copying it into the data file name of p. It returns nil when there is
// nothing worth copying early, or it could not start; why goes to trace.
func startEarlyCopy(ctx context.Context, p *catalog.Pending, pid int, name string, o gdswriter.WriterOptions) *earlyCopy {
	run, err := criu.PredictLazyRun(pid)
	if err != nil {
		trace.Mark(fmt.Sprintf("checkpoint: no early copy of PID %d: %v", pid, err))
		return nil
	}
	chunk := int64(o.ChunkSize)
	if chunk == 0 {
		chunk = gdswriter.DefaultChunkSize
	}
	full := run.Size / chunk * chunk
	if full < minEarlyChunks*chunk {
		return nil
	}
	e := &earlyCopy{pid: pid, name: name, path: p.Path(name), run: run, chunk: chunk, full: full,
		mem: criu.NewMemoryReader(pid), seed: maphash.MakeSeed(), done: make(chan struct{})}
	var at int64
	for _, s := range run.Segments {
		e.segAt = append(e.segAt, at)
		at += s.Len
	}
	// Room for the image's bytes before the run, as predicted, with a
	// margin for the memory the job maps before CRIU freezes it.
	e.room = (run.Before + run.Before/8 + 4<<20 + chunk - 1) / chunk * chunk
	e.sums = make([]uint64, full/chunk)
	e.copied = make([]bool, full/chunk)
	// A quarter of the cores: the disk sets the copy's pace, and the
	// rest stay free for CRIU (on the GPU machine, 4, 8 and 16 workers
	// gave 1 GiB checkpoints of 0.398, 0.390 and 0.416 s, medians of five
	// rounds: docs/benchmarks.md).
	o.Workers = max(2, gdswriter.DefaultWorkers()/4)
	wctx, cancel := context.WithCancel(ctx)
	w, err := gdswriter.Create(wctx, e.path, o)
	if err != nil {
		cancel()
		trace.Mark(fmt.Sprintf("checkpoint: no early copy of PID %d: %v", pid, err))
		return nil
	}
	e.w, e.cancel = w, cancel
	if _, err := w.Reserve(e.room); err != nil {
		close(e.done)
		e.drop()
		return nil
	}
	go func() {
		e.err = w.FillParallel(full, e.fill)
		close(e.done)
	}()
	trace.Mark(fmt.Sprintf("checkpoint: early copy of PID %d started: %d bytes", pid, full))
	return e
}

// fill copies the run's bytes from off into dst, a whole chunk; before the
// freeze it keeps their hash.
func (e *earlyCopy) fill(dst []byte, off int64) error {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if err := e.read(dst, off); err != nil {
		return err
	}
	if !e.frozen {
		e.sums[off/e.chunk] = maphash.Bytes(e.seed, dst)
		e.copied[off/e.chunk] = true
	}
	return nil
}

// read reads the run's bytes from offset off into dst.
func (e *earlyCopy) read(dst []byte, off int64) error {
	i := sort.Search(len(e.segAt), func(i int) bool { return e.segAt[i] > off }) - 1
	for len(dst) > 0 {
		s := e.run.Segments[i]
		skip := off - e.segAt[i]
		n := min(int64(len(dst)), s.Len-skip)
		if err := e.mem.ReadAt(dst[:n], s.Vaddr+uint64(skip)); err != nil {
			return err
		}
		dst, off, i = dst[n:], off+n, i+1
	}
	return nil
}

// finish is called at post-dump, the tree frozen, with the complete pages
// image of the process: it checks the early copy against it and, when it
// holds, queues the rest of the image after it. An error says why it does
// not hold; the caller then drops it and copies the image as usual.
func (e *earlyCopy) finish(c *criu.PageCopy) error {
	e.mu.Lock()
	e.frozen = true
	e.mu.Unlock()
	at, err := c.Locate(e.run, e.full)
	if err != nil {
		return err
	}
	if at > e.room {
		return fmt.Errorf("PID %d: %d bytes of its pages image come before the run copied early; %d were reserved", e.pid, at, e.room)
	}
	if err := e.verify(); err != nil {
		return err
	}
	<-e.done
	if e.err != nil {
		return e.err
	}
	gap := e.room - at
	err = e.w.FillReserved(0, func(dst []byte, off int64) error {
		if zeros := min(max(gap-off, 0), int64(len(dst))); zeros > 0 {
			clear(dst[:zeros])
			dst, off = dst[zeros:], off+zeros
		}
		if len(dst) == 0 {
			return nil
		}
		return c.ReadAt(dst, off-gap)
	})
	if err != nil {
		return err
	}
	tail := at + e.full
	if err := e.w.FillParallel(c.Size()-tail, func(dst []byte, off int64) error { return c.ReadAt(dst, tail+off) }); err != nil {
		return err
	}
	mtime := time.Now().UTC()
	e.entry = catalog.Entry{Path: c.Name, Type: catalog.EntryFile, Mode: 0o600, Offset: gap, Size: c.Size(), MTime: &mtime}
	trace.Mark(fmt.Sprintf("checkpoint: early copy of PID %d holds", e.pid))
	return nil
}

// verify reads again, on every core, each chunk copied before the freeze,
// and compares it with what was copied.
func (e *earlyCopy) verify() error {
	var todo []int
	for i, copied := range e.copied {
		if copied {
			todo = append(todo, i)
		}
	}
	errs := make([]error, min(runtime.GOMAXPROCS(0), len(todo)))
	var next atomic.Int64
	var failed atomic.Bool
	var wg sync.WaitGroup
	for w := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, e.chunk)
			for k := next.Add(1) - 1; k < int64(len(todo)) && !failed.Load(); k = next.Add(1) - 1 {
				i := todo[k]
				err := e.read(buf, int64(i)*e.chunk)
				if err == nil && maphash.Bytes(e.seed, buf) != e.sums[i] {
					err = fmt.Errorf("PID %d: chunk %d of the run copied early changed before the freeze", e.pid, i)
				}
				if err != nil {
					errs[w] = err
					failed.Store(true)
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// drop stops the copy and removes its data file.
func (e *earlyCopy) drop() {
	if e.w == nil {
		return
	}
	e.cancel() // FillParallel, if still under way, returns
	<-e.done
	e.w.Abort()
	e.release()
	os.Remove(e.path)
}

// release lets go of the writer, its context and the process's memory.
func (e *earlyCopy) release() {
	e.w = nil
	e.cancel()
	e.mem.Close()
}

// close makes the data file durable and adds it, with the pages image's
// entry, to the manifest.
func (e *earlyCopy) close(p *catalog.Pending) error {
	res, err := e.w.Close()
	e.release()
	if err != nil {
		return err
	}
	p.Manifest.Files = append(p.Manifest.Files, catalog.NewDataFile(e.name, res))
	e.entry.File = len(p.Manifest.Files) - 1
	p.Manifest.Entries = append(p.Manifest.Entries, e.entry)
	return nil
}

// earlyCopies are the early copies of a tree's processes, started at
// once, each predicting its run on a goroutine of its own.
type earlyCopies struct {
	started chan *earlyCopy
	n       int
	copies  map[int]*earlyCopy
}

// startEarlyCopies starts an early copy of each process of the tree with
// enough memory for one, into data files data.0001 on.
func startEarlyCopies(ctx context.Context, p *catalog.Pending, tree []Process, o gdswriter.WriterOptions) *earlyCopies {
	ec := &earlyCopies{started: make(chan *earlyCopy, len(tree))}
	for _, proc := range tree {
		if proc.RSSBytes < minEarlyChunks*gdswriter.DefaultChunkSize {
			continue
		}
		ec.n++
		go func(pid int, name string) { ec.started <- startEarlyCopy(ctx, p, pid, name, o) }(proc.PID, fmt.Sprintf("data.%04d", ec.n))
	}
	return ec
}

// wait returns the copies under way, by PID, once all have started.
func (ec *earlyCopies) wait() map[int]*earlyCopy {
	if ec.copies == nil {
		ec.copies = map[int]*earlyCopy{}
		for range ec.n {
			if e := <-ec.started; e != nil {
				ec.copies[e.pid] = e
			}
		}
	}
	return ec.copies
}

// held returns the copies that held at post-dump, in PID order.
func (ec *earlyCopies) held() []*earlyCopy {
	var out []*earlyCopy
	for _, e := range ec.wait() {
		if e.entry.Path != "" {
			out = append(out, e)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].pid < out[j].pid })
	return out
}

// dropAll drops every copy not yet closed.
func (ec *earlyCopies) dropAll() {
	for _, e := range ec.wait() {
		e.drop()
	}
}
