package gdswriter

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
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
	// Workers reading and decoding at once; DefaultWorkers() when zero.
	Workers int
	// Progress, when set, is called with each chunk's raw size once it has
	// been delivered.
	Progress func(rawBytes int64)
	// Pin, when set, registers ForEach's buffers with a device driver, so
	// that the bytes handed to fn can be copied to a device at full speed.
	Pin Pinning
}

// readChunk reads chunk c (index i) into ext (at least c.Extent() bytes,
// aligned), checks its stored checksum, decodes it into dst when it is not
// raw, and checks the decoded checksum. Raw chunks are checked in one pass:
// the CRC of the data, extended over the zero padding, is the extent's CRC.
// The returned bytes alias ext (raw chunks) or dst.
func (r *Reader) readChunk(i int, c Chunk, ext, dst []byte, dec *Decoder) ([]byte, error) {
	bad := func(format string, args ...any) error {
		return &ChunkError{Path: r.path, Index: i, Offset: c.Offset, Reason: fmt.Sprintf(format, args...)}
	}
	extent := ext[:c.Extent()]
	if err := r.file.readAt(extent, c.Offset); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, bad("file is truncated")
		}
		return nil, fmt.Errorf("read %s: %w", r.path, err)
	}
	stored := extent[:c.Stored]
	if c.Codec == CodecRaw {
		rawCRC := crc32.Checksum(stored, castagnoli)
		if got := crc32.Update(rawCRC, castagnoli, extent[c.Stored:]); got != c.CRC {
			return nil, bad("checksum mismatch (stored CRC32C %08x, read %08x)", c.CRC, got)
		}
		if rawCRC != c.RawCRC {
			return nil, bad("decoded data checksum mismatch (stored CRC32C %08x, decoded %08x)", c.RawCRC, rawCRC)
		}
		return stored, nil
	}
	if got := crc32.Checksum(extent, castagnoli); got != c.CRC {
		return nil, bad("checksum mismatch (stored CRC32C %08x, read %08x)", c.CRC, got)
	}
	raw, err := dec.Decode(dst[:0], stored, c.Codec, int(c.Raw))
	if err != nil {
		return nil, bad("cannot decode %s chunk: %v", c.Codec, err)
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
		workers = DefaultWorkers()
	}
	bufSize := int64(Alignment)
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
		raw, err := r.readChunk(i, c, ext.mem, nil, dec)
		return readResult{raw: raw, bufs: [2]*alignedBuffer{ext}, err: err}
	}
	dst := pool.get()
	raw, err := r.readChunk(i, c, ext.mem, dst.mem, dec)
	pool.put(ext)
	return readResult{raw: raw, bufs: [2]*alignedBuffer{dst}, err: err}
}

// ReadInto reads every chunk of the table into dst, chunk i at
// i*chunkSize, with several workers in any order, verifying and decoding
// each. Raw chunks whose place in dst is aligned (pinned or mapped memory)
// are read straight into it; compressed chunks are decoded straight into
// it. dst must hold exactly the chunks' raw bytes. On error, dst holds an
// unspecified mix of old and new bytes.
func (r *Reader) ReadInto(ctx context.Context, chunks []Chunk, chunkSize int64, dst []byte, o ReadOptions) error {
	var total int64
	for i, c := range chunks {
		// Chunk i goes to i*chunkSize: a chunk size that does not match
		// the table would put chunks outside dst.
		if i < len(chunks)-1 && c.Raw != chunkSize {
			return fmt.Errorf("gdswriter: chunk %d holds %d raw bytes, not the chunk size %d", i, c.Raw, chunkSize)
		}
		total += c.Raw
	}
	if total != int64(len(dst)) {
		return fmt.Errorf("gdswriter: destination holds %d bytes, the chunks %d", len(dst), total)
	}
	workers := o.Workers
	if workers <= 0 {
		workers = DefaultWorkers()
	}
	var bufSize int64
	for _, c := range chunks {
		bufSize = max(bufSize, c.Extent())
	}
	pool, err := newBufferPool(min(workers, len(chunks)), int(max(bufSize, Alignment)))
	if err != nil {
		return err
	}
	defer pool.close()
	dec := make(chan *Decoder, workers)
	for i := 0; i < workers; i++ {
		dec <- NewDecoder()
	}
	return forBlocks(ctx, len(chunks), 1, workers, func(i, _ int) error {
		c := chunks[i]
		lo := int64(i) * chunkSize
		target := dst[lo : lo+c.Raw : lo+c.Raw]
		d := <-dec
		defer func() { dec <- d }()
		if c.Codec == CodecRaw && c.Extent() == c.Raw && isAligned(target) {
			if _, err := r.readChunk(i, c, target, nil, d); err != nil {
				return err
			}
		} else {
			ext := pool.get()
			raw, err := r.readChunk(i, c, ext.mem, target, d)
			if err == nil && (len(raw) == 0 || &raw[0] != &target[0]) {
				copy(target, raw)
			}
			pool.put(ext)
			if err != nil {
				return err
			}
		}
		if o.Progress != nil {
			o.Progress(c.Raw)
		}
		return nil
	})
}

// ForEach reads, verifies and decodes every chunk of the table with several
// workers and calls fn for each, in no particular order and from several
// goroutines at once. raw is valid only during the call. The first error
// stops the work and is returned.
func (r *Reader) ForEach(ctx context.Context, chunks []Chunk, o ReadOptions, fn func(i int, raw []byte) error) error {
	if len(chunks) == 0 {
		return nil
	}
	workers := o.Workers
	if workers <= 0 {
		workers = DefaultWorkers()
	}
	workers = min(workers, len(chunks))
	bufSize := int64(Alignment)
	for _, c := range chunks {
		bufSize = max(bufSize, c.Extent(), c.Raw)
	}
	pool, err := newPinnedPool(2*workers, int(bufSize), o.Pin)
	if err != nil {
		return err
	}
	defer pool.close()
	decoders := make(chan *Decoder, workers)
	for i := 0; i < workers; i++ {
		decoders <- NewDecoder()
	}
	return forBlocks(ctx, len(chunks), 1, workers, func(i, _ int) error {
		c := chunks[i]
		dec := <-decoders
		ext, dst := pool.get(), pool.get()
		defer func() {
			pool.put(ext)
			pool.put(dst)
			decoders <- dec
		}()
		raw, err := r.readChunk(i, c, ext.mem, dst.mem, dec)
		if err == nil {
			err = fn(i, raw)
		}
		if err == nil && o.Progress != nil {
			o.Progress(c.Raw)
		}
		return err
	})
}
