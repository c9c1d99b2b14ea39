package gdswriter

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"runtime"
	"sync"
)

// Reader reads, verifies and decodes the chunks of one data file.
type Reader struct {
	path string
	file *directFile
}

// OpenReader opens a data file for reading, with O_DIRECT unless noDirect is
// set or the file system refuses it.
func OpenReader(path string, noDirect bool) (*Reader, error) {
	f, err := openDirect(path, os.O_RDONLY, noDirect)
	if err != nil {
		return nil, err
	}
	return &Reader{path: path, file: f}, nil
}

// Direct reports whether reads bypass the page cache.
func (r *Reader) Direct() bool { return r.file.Direct() }

// Close closes the file.
func (r *Reader) Close() error { return r.file.close() }

// ReadOptions configure Stream.
type ReadOptions struct {
	// Workers reading and decoding at once; GOMAXPROCS when zero.
	Workers int
	// Progress, when set, is called with each chunk's raw size once it has
	// been delivered.
	Progress func(rawBytes int64)
}

// readChunk reads chunk c (index i) into ext, checks its stored checksum,
// decodes it into dst when it is not raw, and checks the decoded checksum.
// The returned bytes alias ext (raw chunks) or dst.
func (r *Reader) readChunk(i int, c Chunk, ext, dst *alignedBuffer, dec *Decoder) ([]byte, error) {
	bad := func(format string, args ...any) error {
		return &ChunkError{Path: r.path, Index: i, Offset: c.Offset, Reason: fmt.Sprintf(format, args...)}
	}
	extent := ext.mem[:c.Extent()]
	if err := r.file.readAt(extent, c.Offset); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, bad("file is truncated")
		}
		return nil, fmt.Errorf("read %s: %w", r.path, err)
	}
	if got := crc32.Checksum(extent, castagnoli); got != c.CRC {
		return nil, bad("checksum mismatch (stored CRC32C %08x, read %08x)", c.CRC, got)
	}
	raw := extent[:c.Stored]
	if c.Codec != CodecRaw {
		var err error
		raw, err = dec.Decode(dst.mem[:0], raw, c.Codec, int(c.Raw))
		if err != nil {
			return nil, bad("cannot decode %s chunk: %v", c.Codec, err)
		}
	}
	if int64(len(raw)) != c.Raw {
		return nil, bad("decoded to %d bytes, expected %d", len(raw), c.Raw)
	}
	if got := crc32.Checksum(raw, castagnoli); got != c.RawCRC {
		return nil, bad("decoded data checksum mismatch (stored CRC32C %08x, decoded %08x)", c.RawCRC, got)
	}
	return raw, nil
}

type readResult struct {
	raw  []byte
	bufs [2]*alignedBuffer
	err  error
}

type readTask struct {
	index int
	out   chan readResult
}

// Stream reads every chunk of the table with several workers, verifies and
// decodes each, and calls fn with the decoded bytes in table order. raw is
// only valid during the call. The chunk table must have passed
// ValidateChunks. The first error (a ChunkError for bad data) stops the
// stream and is returned.
func (r *Reader) Stream(ctx context.Context, chunks []Chunk, o ReadOptions, fn func(i int, raw []byte) error) error {
	if len(chunks) == 0 {
		return nil
	}
	workers := o.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	var bufSize int64
	for _, c := range chunks {
		bufSize = max(bufSize, c.Extent(), c.Raw)
	}
	window := 2 * workers
	// Every task in flight holds at most one buffer once done and two while
	// decoding: window+1 tasks, workers of them decoding, fit.
	pool, err := newBufferPool(window+workers+2, int(bufSize))
	if err != nil {
		return err
	}
	defer pool.close()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tasks := make(chan readTask)
	order := make(chan chan readResult, window)
	var wg sync.WaitGroup

	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(order)
		defer close(tasks)
		for i := range chunks {
			out := make(chan readResult, 1)
			select {
			case order <- out:
			case <-ctx.Done():
				return
			}
			select {
			case tasks <- readTask{index: i, out: out}:
			case <-ctx.Done():
				out <- readResult{err: ctx.Err()}
				return
			}
		}
	}()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dec := NewDecoder()
			for t := range tasks {
				t.out <- r.readTask(ctx, pool, dec, chunks[t.index], t.index)
			}
		}()
	}

	release := func(res readResult) {
		for _, b := range res.bufs {
			if b != nil {
				pool.put(b)
			}
		}
	}
	var first error
	i := 0
	for out := range order {
		res := <-out
		if first == nil {
			if res.err != nil {
				first = res.err
			} else if err := fn(i, res.raw); err != nil {
				first = err
			} else if o.Progress != nil {
				o.Progress(int64(len(res.raw)))
			}
			if first != nil {
				cancel()
			}
		}
		release(res)
		i++
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

func (r *Reader) readTask(ctx context.Context, pool *bufferPool, dec *Decoder, c Chunk, i int) readResult {
	if err := ctx.Err(); err != nil {
		return readResult{err: err}
	}
	ext := pool.get()
	if c.Codec == CodecRaw {
		raw, err := r.readChunk(i, c, ext, nil, dec)
		return readResult{raw: raw, bufs: [2]*alignedBuffer{ext}, err: err}
	}
	dst := pool.get()
	raw, err := r.readChunk(i, c, ext, dst, dec)
	pool.put(ext)
	return readResult{raw: raw, bufs: [2]*alignedBuffer{dst}, err: err}
}
