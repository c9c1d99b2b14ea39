package gdswriter

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/stasis-ckpt/stasis/internal/trace"
)

// WriterOptions configure a Writer. The zero value is usable.
type WriterOptions struct {
	// ChunkSize is the raw size of each chunk: a multiple of Alignment,
	// DefaultChunkSize when zero.
	ChunkSize int
	// Method is the compression asked for; MethodNone when empty.
	Method Method
	// ElemSize hints the width of the data's elements (2 for bf16, 4 for
	// fp32, 0 when unknown) to the byte-plane codecs.
	ElemSize int
	// Workers is the number of goroutines encoding and writing chunks;
	// DefaultWorkers() when zero.
	Workers int
	// NoDirect turns O_DIRECT off.
	NoDirect bool
	// Progress, when set, is called with the raw byte count of each chunk
	// once it is written, from several goroutines at once.
	Progress func(rawBytes int64)
	// Backlog is how many bytes of chunks, beyond the 2*Workers+1 chunk
	// buffers it always has, the Writer may hold while they wait to be
	// encoded and written. That memory is allocated only when data comes
	// faster than it goes: a source that outruns the disk for a while
	// (random bytes) and then leaves it idle (zeros, which compress to
	// nothing) is then held back by neither. Not with Pin.
	Backlog int64
	// Pin, when set, registers each chunk buffer with a device driver when
	// the Writer is created (and undoes it when it is done), so that Fill
	// can copy device memory straight into them.
	Pin Pinning
}

func (o *WriterOptions) fill() error {
	if o.ChunkSize == 0 {
		o.ChunkSize = DefaultChunkSize
	}
	if o.ChunkSize < 0 || o.ChunkSize%Alignment != 0 || o.ChunkSize > MaxChunkSize {
		return fmt.Errorf("chunk size %d is not a positive multiple of %d up to %d", o.ChunkSize, Alignment, MaxChunkSize)
	}
	if o.Method == "" {
		o.Method = MethodNone
	}
	if _, err := ParseMethod(string(o.Method)); err != nil {
		return err
	}
	if o.Workers <= 0 {
		o.Workers = DefaultWorkers()
	}
	return nil
}

// Result describes the data file a Writer produced.
type Result struct {
	Size      int64   // bytes on disk
	RawSize   int64   // bytes written to the Writer
	ChunkSize int64   // raw bytes per chunk
	Chunks    []Chunk // in stream order
	Direct    bool    // whether the file was written with O_DIRECT
	// DeviceChunks is how many chunks went straight from device memory
	// into the file (FillDevice), not through host memory.
	DeviceChunks int
}

// Writer turns a byte stream into a data file of independently encoded
// chunks. Writes fill a chunk buffer; each full buffer goes to a worker that
// encodes it, checksums it, reserves the next free aligned extent of the
// file and writes it there, so extents lie in completion order while the
// chunk table keeps stream order. Memory is bounded by a fixed pool of chunk
// buffers. A Writer is not safe for concurrent use; its workers are internal.
type Writer struct {
	ctx  context.Context
	path string
	opts WriterOptions
	file *directFile

	pool    *bufferPool
	cur     *alignedBuffer
	curLen  int
	next    int
	rawSize int64

	jobs    chan writeJob
	workers sync.WaitGroup
	fileEnd atomic.Int64
	hurry   atomic.Bool // set by Hurry

	dev          DeviceFile // set by UseDevice
	deviceChunks atomic.Int64

	mu       sync.Mutex
	chunks   []Chunk
	err      error
	done     bool
	reserved map[int]int // Reserve's runs not yet filled: first chunk -> chunk count
}

// writeJob is one chunk for a worker: a pool buffer holding n bytes (or
// to be filled with them by fill, from FillParallel), a full chunk of
// caller memory passed to WriteShared, or a full chunk of device memory
// passed to FillDevice.
type writeJob struct {
	index  int
	buf    *alignedBuffer
	shared []byte
	device *DeviceSpan
	n      int
	fill   func(dst []byte) error
}

func (j writeJob) raw() []byte {
	if j.buf == nil {
		return j.shared
	}
	return j.buf.mem[:j.n]
}

// Create makes a new data file at path (it must not exist) and starts the
// workers. Cancelling ctx makes further writes fail; Abort or Close must
// still be called.
func Create(ctx context.Context, path string, o WriterOptions) (*Writer, error) {
	if err := o.fill(); err != nil {
		return nil, err
	}
	f, err := openDirect(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, o.NoDirect)
	if err != nil {
		return nil, err
	}
	pool, err := newPinnedPool(2*o.Workers+1, o.ChunkSize, o.Pin)
	if err != nil {
		f.close()
		return nil, err
	}
	queue := o.Workers
	if o.Backlog > 0 && o.Pin == nil {
		extra := int(o.Backlog / int64(o.ChunkSize))
		pool.grow(2*o.Workers + 1 + extra)
		queue += extra
	}
	w := &Writer{ctx: ctx, path: path, opts: o, file: f, pool: pool, jobs: make(chan writeJob, queue)}
	for i := 0; i < o.Workers; i++ {
		w.workers.Add(1)
		go w.work()
	}
	return w, nil
}

// Hurry tells the Writer that its caller now waits for Close (a process
// frozen until its checkpoint is durable): a chunk whose encoding starts
// from now on, while no more chunks wait than there are workers, takes s2
// where zstd would have been used (Encoder.EncodeHurried): faster, for
// some compression lost. Those are the last few chunks, which would
// otherwise be encoded one per core while the caller waits; a longer queue
// means the disk, not the encoding, sets the pace, and its chunks keep
// their codec. Safe to call from any goroutine.
func (w *Writer) Hurry() { w.hurry.Store(true) }

// Offset is the number of bytes written to the stream so far: the stream
// offset at which the next byte will land.
func (w *Writer) Offset() int64 { return w.rawSize }

// Direct reports whether the file is written with O_DIRECT.
func (w *Writer) Direct() bool { return w.file.Direct() }

func (w *Writer) failure() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil && w.ctx.Err() != nil {
		w.err = w.ctx.Err()
	}
	return w.err
}

func (w *Writer) fail(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
}

// Write copies p into the stream.
func (w *Writer) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		if err := w.fillBuffer(); err != nil {
			return written, err
		}
		n := copy(w.cur.mem[w.curLen:w.opts.ChunkSize], p)
		w.curLen += n
		w.rawSize += int64(n)
		written += n
		p = p[n:]
		w.dispatchIfFull()
	}
	return written, nil
}

// Fill adds n bytes to the stream that fill writes straight into the chunk
// buffers, a piece at a time (each piece at most a chunk): the way to copy
// device memory into the stream without a staging copy. fill gets the
// offset of the piece within the n bytes.
func (w *Writer) Fill(n int64, fill func(dst []byte, off int64) error) error {
	for off := int64(0); off < n; {
		if err := w.fillBuffer(); err != nil {
			return err
		}
		piece := min(int64(w.opts.ChunkSize-w.curLen), n-off)
		if err := fill(w.cur.mem[w.curLen:w.curLen+int(piece)], off); err != nil {
			return err
		}
		w.curLen += int(piece)
		w.rawSize += piece
		off += piece
		w.dispatchIfFull()
	}
	return nil
}

// FillParallel adds n bytes to the stream, as Fill does, but the workers
// fill the whole chunks among them, each its own, at the same time: the
// way to copy a large source many cores can read at once (another
// process's memory) without one goroutine setting the pace. fill must be
// safe for concurrent use; it gets the offset of its piece within the n
// bytes. A piece that completes a chunk already begun, and the last piece
// when it does not fill a chunk, are filled before FillParallel returns;
// the other pieces may still be filling then: Close waits for them, and
// reports fill's first error.
func (w *Writer) FillParallel(n int64, fill func(dst []byte, off int64) error) error {
	return w.fillChunks(n, fill, func(off int64) (writeJob, error) {
		if err := w.fillBuffer(); err != nil {
			return writeJob{}, err
		}
		buf := w.cur
		w.cur = nil
		return writeJob{buf: buf, fill: func(dst []byte) error { return fill(dst, off) }}, nil
	})
}

// fillChunks adds n bytes to the stream: each whole chunk among them that
// starts on a chunk boundary of the stream is the job that whole makes for
// it (given the chunk's offset within the n bytes), queued for a worker;
// the rest (a piece completing a chunk already begun, a last piece short
// of a chunk) goes through fill into the chunk buffer at hand, as Fill
// does.
func (w *Writer) fillChunks(n int64, fill func(dst []byte, off int64) error, whole func(off int64) (writeJob, error)) error {
	chunk := int64(w.opts.ChunkSize)
	for off := int64(0); off < n; {
		if w.curLen != 0 || n-off < chunk {
			piece := min(chunk-int64(w.curLen), n-off)
			if err := w.Fill(piece, func(dst []byte, at int64) error { return fill(dst, off+at) }); err != nil {
				return err
			}
			off += piece
			continue
		}
		job, err := whole(off)
		if err != nil {
			return err
		}
		job.index, job.n = w.next, int(chunk)
		w.jobs <- job
		w.next++
		w.rawSize += chunk
		off += chunk
	}
	return nil
}

// Reserve adds n bytes to the stream, whole chunks from a chunk boundary,
// whose contents come later, from FillReserved: the stream goes on after
// them at once. The way to write what follows a stretch of the stream
// before that stretch is known. It returns the index of the first
// reserved chunk. Close fails while a reserved chunk is not filled.
func (w *Writer) Reserve(n int64) (first int, err error) {
	if err := w.writable(); err != nil {
		return 0, err
	}
	chunk := int64(w.opts.ChunkSize)
	if w.curLen != 0 || n <= 0 || n%chunk != 0 {
		return 0, fmt.Errorf("gdswriter: reserve %d bytes at stream offset %d: only whole %d-byte chunks from a chunk boundary", n, w.rawSize, chunk)
	}
	first = w.next
	w.mu.Lock()
	if w.reserved == nil {
		w.reserved = map[int]int{}
	}
	w.reserved[first] = int(n / chunk)
	w.mu.Unlock()
	w.next += int(n / chunk)
	w.rawSize += n
	return first, nil
}

// FillReserved queues the chunks Reserve reserved from chunk first for the
// workers to fill, as FillParallel does: fill gets each chunk's offset
// within the reserved bytes. Unlike the other writes, it may run at the
// same time as them (from another goroutine), though not with Close or
// Abort.
func (w *Writer) FillReserved(first int, fill func(dst []byte, off int64) error) error {
	if err := w.writable(); err != nil {
		return err
	}
	w.mu.Lock()
	count, ok := w.reserved[first]
	delete(w.reserved, first)
	w.mu.Unlock()
	if !ok {
		return fmt.Errorf("gdswriter: no reserved chunks from chunk %d", first)
	}
	chunk := int64(w.opts.ChunkSize)
	for i := range count {
		if err := w.failure(); err != nil {
			return err
		}
		off := int64(i) * chunk
		w.jobs <- writeJob{index: first + i, buf: w.pool.get(), n: int(chunk), fill: func(dst []byte) error { return fill(dst, off) }}
	}
	return nil
}

// ReadFrom reads r to its end straight into chunk buffers.
func (w *Writer) ReadFrom(r io.Reader) (int64, error) {
	var total int64
	for {
		if err := w.fillBuffer(); err != nil {
			return total, err
		}
		n, err := r.Read(w.cur.mem[w.curLen:w.opts.ChunkSize])
		w.curLen += n
		w.rawSize += int64(n)
		total += int64(n)
		w.dispatchIfFull()
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// WriteShared appends p to the stream like Write, but hands whole chunks of
// p to the workers without copying them when p's memory is aligned to
// Alignment (memory from mmap, pinned host buffers). The caller must leave p
// unchanged until Close returns. Unaligned memory, and any part of p that
// does not fill a whole chunk, is copied as Write does.
func (w *Writer) WriteShared(p []byte) error {
	for len(p) > 0 {
		if w.curLen > 0 || len(p) < w.opts.ChunkSize || !isAligned(p) {
			n := len(p)
			if w.curLen > 0 || !isAligned(p) {
				n = min(n, w.opts.ChunkSize-w.curLen)
			}
			if _, err := w.Write(p[:n]); err != nil {
				return err
			}
			p = p[n:]
			continue
		}
		if err := w.writable(); err != nil {
			return err
		}
		w.jobs <- writeJob{index: w.next, shared: p[:w.opts.ChunkSize], n: w.opts.ChunkSize}
		w.next++
		w.rawSize += int64(w.opts.ChunkSize)
		p = p[w.opts.ChunkSize:]
	}
	return nil
}

// writable says why the stream takes no more bytes: Close or Abort came,
// or the writer failed; nil when it does.
func (w *Writer) writable() error {
	if w.done {
		return errors.New("gdswriter: write after Close or Abort")
	}
	return w.failure()
}

// fillBuffer makes sure a chunk buffer with free room is at hand.
func (w *Writer) fillBuffer() error {
	if err := w.writable(); err != nil {
		return err
	}
	if w.cur == nil {
		w.cur = w.pool.get()
		w.curLen = 0
	}
	return nil
}

func (w *Writer) dispatchIfFull() {
	if w.curLen == w.opts.ChunkSize {
		w.dispatch()
	}
}

func (w *Writer) dispatch() {
	w.jobs <- writeJob{index: w.next, buf: w.cur, n: w.curLen}
	w.next++
	w.cur = nil
	w.curLen = 0
}

func (w *Writer) work() {
	defer w.workers.Done()
	enc := NewEncoder(w.opts.Method, w.opts.ElemSize)
	var out *alignedBuffer
	defer func() { out.free() }()
	for job := range w.jobs {
		if w.failure() == nil {
			if out == nil && w.opts.Method != MethodNone {
				var err error
				if out, err = newAlignedBuffer(w.opts.ChunkSize); err != nil {
					w.fail(err)
				}
			}
			if w.failure() == nil {
				if err := w.doJob(enc, out, job); err != nil {
					w.fail(err)
				}
			}
		}
		if job.buf != nil {
			w.pool.put(job.buf)
		}
	}
}

// doJob fills a job's chunk if it is to be filled, then writes it.
func (w *Writer) doJob(enc *Encoder, out *alignedBuffer, job writeJob) error {
	if job.fill != nil {
		if err := job.fill(job.raw()); err != nil {
			return err
		}
	}
	if job.device != nil {
		return w.writeDeviceChunk(job)
	}
	hurried := w.hurry.Load() && len(w.jobs) <= w.opts.Workers
	return w.writeChunk(enc, out, job, hurried)
}

// writeChunk encodes one chunk, checksums it and writes it at a fresh
// extent of the file.
func (w *Writer) writeChunk(enc *Encoder, out *alignedBuffer, job writeJob, hurried bool) error {
	raw := job.raw()
	rawCRC := crc32.Checksum(raw, castagnoli)
	encode := enc.Encode
	if hurried {
		encode = enc.EncodeHurried
	}
	stored, codec := encode(raw)
	var extent []byte
	if codec == CodecRaw || len(stored) > w.opts.ChunkSize {
		codec, stored = CodecRaw, raw
		if job.buf != nil {
			extent = job.buf.mem[:alignUp(int64(len(raw)))]
		} else {
			extent = raw // a whole chunk: already aligned, nothing to pad
		}
	} else {
		copy(out.mem, stored)
		extent = out.mem[:alignUp(int64(len(stored)))]
	}
	clear(extent[len(stored):])
	var crc uint32
	if codec == CodecRaw {
		crc = crc32.Update(rawCRC, castagnoli, extent[len(stored):])
	} else {
		crc = crc32.Checksum(extent, castagnoli)
	}
	off := w.fileEnd.Add(int64(len(extent))) - int64(len(extent))
	w.file.reserve(off + int64(len(extent)))
	if err := w.file.writeAt(extent, off); err != nil {
		var pathErr *fs.PathError
		if errors.As(err, &pathErr) {
			return err // it names the file already: "write PATH: ..."
		}
		return fmt.Errorf("write %s: %w", w.path, err)
	}
	w.mu.Lock()
	for len(w.chunks) <= job.index {
		w.chunks = append(w.chunks, Chunk{})
	}
	w.chunks[job.index] = Chunk{Offset: off, Stored: int64(len(stored)), Raw: int64(job.n), Codec: codec, CRC: crc, RawCRC: rawCRC}
	w.mu.Unlock()
	if w.opts.Progress != nil {
		w.opts.Progress(int64(job.n))
	}
	return nil
}

// stop ends the workers and releases memory; the file stays open.
func (w *Writer) stop() {
	if w.done {
		return
	}
	w.done = true
	close(w.jobs)
	w.workers.Wait()
	if w.cur != nil {
		w.pool.put(w.cur)
		w.cur = nil
	}
	w.pool.close()
}

// Close writes the last partial chunk, waits for the workers, makes the file
// durable (fsync) and returns its description. On error the file is left for
// the caller to remove with its staging directory.
func (w *Writer) Close() (Result, error) {
	if w.done {
		return Result{}, errors.New("gdswriter: Close after Close or Abort")
	}
	if w.curLen > 0 && w.failure() == nil {
		w.dispatch()
	}
	w.stop()
	w.closeDevice()
	trace.Mark("writer: every chunk written")
	if len(w.reserved) > 0 {
		w.fail(fmt.Errorf("gdswriter: %d runs of reserved chunks were never filled", len(w.reserved)))
	}
	if err := w.failure(); err != nil {
		w.file.close()
		return Result{}, err
	}
	if err := w.file.trim(w.fileEnd.Load()); err != nil {
		w.file.close()
		return Result{}, fmt.Errorf("truncate %s: %w", w.path, err)
	}
	if err := w.file.sync(); err != nil {
		w.file.close()
		return Result{}, fmt.Errorf("fsync %s: %w", w.path, err)
	}
	trace.Mark("writer: data file synced")
	direct := w.file.Direct()
	if err := w.file.close(); err != nil {
		return Result{}, fmt.Errorf("close %s: %w", w.path, err)
	}
	return Result{
		Size:      w.fileEnd.Load(),
		RawSize:   w.rawSize,
		ChunkSize: int64(w.opts.ChunkSize),
		Chunks:    w.chunks,
		Direct:    direct,

		DeviceChunks: int(w.deviceChunks.Load()),
	}, nil
}

// Abort stops the workers and closes the file without making it durable.
// The caller removes the file.
func (w *Writer) Abort() {
	w.fail(errors.New("gdswriter: aborted"))
	w.stop()
	w.closeDevice()
	w.file.close()
}

// isAligned reports whether p starts at a multiple of Alignment in memory.
func isAligned(p []byte) bool {
	return len(p) > 0 && uintptr(unsafe.Pointer(&p[0]))%Alignment == 0
}
