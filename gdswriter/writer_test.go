package gdswriter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Small chunks give many chunks per test file.
const wtChunk = 64 << 10

// wtData returns n deterministic bytes that mix 4 KiB blocks of random
// bytes, words, zeros and bf16-like values, so that every codec has
// something to compress and something to give up on.
func wtData(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	words := []string{"checkpoint ", "tensor ", "gradient ", "step ", "layer ", "0.125 ", "\n"}
	out := make([]byte, 0, n)
	for blk := 0; len(out) < n; blk++ {
		m := min(4096, n-len(out))
		switch blk % 4 {
		case 0:
			for i := 0; i < m; i++ {
				out = append(out, byte(r.Uint32()))
			}
		case 1:
			for len(out) < n && m > 0 {
				w := words[r.IntN(len(words))]
				w = w[:min(len(w), m)]
				out = append(out, w...)
				m -= len(w)
			}
		case 2:
			out = append(out, make([]byte, m)...)
		case 3:
			for i := 0; i < m; i++ {
				if i%2 == 0 {
					out = append(out, byte(r.Uint32()))
				} else {
					out = append(out, 0x3f+byte(r.IntN(2)))
				}
			}
		}
	}
	return out
}

// wtWrite writes data to a new data file in dir through a Writer, with
// Write in uneven pieces or with ReadFrom, and checks the Result against
// what was written.
func wtWrite(t testing.TB, dir string, data []byte, o WriterOptions, readFrom bool) (string, Result) {
	t.Helper()
	path := filepath.Join(dir, fmt.Sprintf("data-%d", rand.Int64()))
	chunkSize := o.ChunkSize
	if chunkSize == 0 {
		chunkSize = DefaultChunkSize
	}
	var progress atomic.Int64
	o.Progress = func(n int64) { progress.Add(n) }
	w, err := Create(context.Background(), path, o)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if readFrom {
		n, err := w.ReadFrom(iotest.HalfReader(bytes.NewReader(data)))
		if err != nil || n != int64(len(data)) {
			w.Abort()
			t.Fatalf("ReadFrom = %d, %v; want %d", n, err, len(data))
		}
	} else {
		rest := data
		for piece := 1000; len(rest) > 0; piece = piece*3 + 1 {
			k := min(piece, len(rest))
			n, err := w.Write(rest[:k])
			if err != nil || n != k {
				w.Abort()
				t.Fatalf("Write = %d, %v; want %d", n, err, k)
			}
			rest = rest[k:]
		}
	}
	if got := w.Offset(); got != int64(len(data)) {
		t.Errorf("Offset = %d after %d bytes", got, len(data))
	}
	res, err := w.Close()
	if err != nil {
		t.Fatalf("Close: %v", err)
	}
	if res.RawSize != int64(len(data)) {
		t.Errorf("RawSize = %d, want %d", res.RawSize, len(data))
	}
	if got := progress.Load(); got != res.RawSize {
		t.Errorf("Progress reported %d bytes, RawSize %d", got, res.RawSize)
	}
	if res.ChunkSize != int64(chunkSize) {
		t.Errorf("ChunkSize = %d, want %d", res.ChunkSize, chunkSize)
	}
	if want := (len(data) + chunkSize - 1) / chunkSize; len(res.Chunks) != want {
		t.Errorf("%d chunks, want %d", len(res.Chunks), want)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() != res.Size {
		t.Errorf("file has %d bytes, Result.Size %d", st.Size(), res.Size)
	}
	if err := ValidateChunks(res.Chunks, res.ChunkSize, res.Size, res.RawSize); err != nil {
		t.Errorf("ValidateChunks on the writer's own table: %v", err)
	}
	return path, res
}

// wtRead streams the whole file and checks that chunks arrive in table
// order, each with its declared raw size.
func wtRead(t testing.TB, path string, chunks []Chunk, workers int) ([]byte, error) {
	t.Helper()
	r, err := OpenReader(path, false)
	if err != nil {
		t.Fatalf("OpenReader: %v", err)
	}
	defer r.Close()
	var out []byte
	next := 0
	var progress int64
	err = r.Stream(context.Background(), chunks, ReadOptions{Workers: workers, Progress: func(n int64) { progress += n }}, func(i int, raw []byte) error {
		if i != next {
			t.Errorf("chunk %d delivered when %d was due", i, next)
		}
		if int64(len(raw)) != chunks[i].Raw {
			t.Errorf("chunk %d: %d bytes, table says %d", i, len(raw), chunks[i].Raw)
		}
		next++
		out = append(out, raw...)
		return nil
	})
	if err == nil && next != len(chunks) {
		t.Errorf("Stream delivered %d of %d chunks", next, len(chunks))
	}
	if err == nil && progress != int64(len(out)) {
		t.Errorf("read Progress reported %d bytes, delivered %d", progress, len(out))
	}
	return out, err
}

func TestWriterRoundTrip(t *testing.T) {
	dir := t.TempDir()
	sizes := []int{0, 1, 4095, 4096, wtChunk - 1, wtChunk, wtChunk + 1, 5*wtChunk + 12345}
	for _, method := range []Method{MethodNone, MethodZstd, MethodS2, MethodAuto} {
		for _, workers := range []int{1, 4} {
			for _, size := range sizes {
				name := fmt.Sprintf("%s/workers=%d/size=%d", method, workers, size)
				t.Run(name, func(t *testing.T) {
					data := wtData(size, uint64(size))
					o := WriterOptions{ChunkSize: wtChunk, Method: method, Workers: workers}
					path, res := wtWrite(t, dir, data, o, workers == 4)
					got, err := wtRead(t, path, res.Chunks, workers)
					if err != nil {
						t.Fatalf("Stream: %v", err)
					}
					if !bytes.Equal(got, data) {
						t.Fatalf("read back %d bytes that differ from the %d written", len(got), len(data))
					}
					codecs := map[Codec]int{}
					for _, c := range res.Chunks {
						codecs[c.Codec]++
					}
					switch {
					case method == MethodNone && codecs[CodecRaw] != len(res.Chunks):
						t.Errorf("method none stored codecs %v", codecs)
					case size >= wtChunk && method == MethodZstd && codecs[CodecZstd] == 0,
						size >= wtChunk && method == MethodS2 && codecs[CodecS2] == 0,
						size >= wtChunk && method == MethodAuto && codecs[CodecRaw] == len(res.Chunks):
						t.Errorf("method %s compressed nothing of compressible data: %v", method, codecs)
					}
				})
			}
		}
	}
}

func TestWriterOptions(t *testing.T) {
	dir := t.TempDir()
	for _, o := range []WriterOptions{
		{ChunkSize: 5000},
		{ChunkSize: -4096},
		{ChunkSize: MaxChunkSize + Alignment},
		{Method: "lz4"},
	} {
		path := filepath.Join(dir, "x")
		if w, err := Create(context.Background(), path, o); err == nil {
			w.Abort()
			t.Errorf("Create accepted %+v", o)
		}
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("Create with bad options %+v left a file: %v", o, err)
		}
	}
	// The zero value works: default chunk size, no compression.
	path, res := wtWrite(t, dir, wtData(10000, 1), WriterOptions{ChunkSize: 0}, false)
	if res.ChunkSize != DefaultChunkSize || len(res.Chunks) != 1 || res.Chunks[0].Codec != CodecRaw {
		t.Errorf("zero options gave chunk size %d, chunks %+v", res.ChunkSize, res.Chunks)
	}
	// An existing file is never overwritten.
	if w, err := Create(context.Background(), path, WriterOptions{}); err == nil {
		w.Abort()
		t.Errorf("Create over an existing file succeeded")
	}
}

func TestWriterUseAfterClose(t *testing.T) {
	w, err := Create(context.Background(), filepath.Join(t.TempDir(), "d"), WriterOptions{ChunkSize: wtChunk})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("abc")); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("x")); err == nil {
		t.Error("Write after Close succeeded")
	}
	if _, err := w.Close(); err == nil {
		t.Error("second Close succeeded")
	}
	w.Abort() // harmless after Close
}

// fsMagic returns the statfs magic of the file system holding dir.
func fsMagic(t *testing.T, dir string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatalf("statfs %s: %v", dir, err)
	}
	return int64(st.Type)
}

// acceptsODirect reports whether the file system of dir lets a file be
// opened with O_DIRECT.
func acceptsODirect(t *testing.T, dir string) bool {
	t.Helper()
	path := filepath.Join(dir, fmt.Sprintf(".odirect-probe-%d", os.Getpid()))
	defer os.Remove(path)
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_DIRECT, 0o600)
	if err != nil {
		if errors.Is(err, unix.EINVAL) {
			return false
		}
		t.Fatalf("probe %s: %v", path, err)
	}
	unix.Close(fd)
	return true
}

func TestDirectOnDisk(t *testing.T) {
	dir := t.TempDir()
	switch fsMagic(t, dir) {
	case unix.EXT4_SUPER_MAGIC, unix.XFS_SUPER_MAGIC, unix.BTRFS_SUPER_MAGIC:
	default:
		t.Skipf("%s is not on ext4, xfs or btrfs (statfs magic %#x)", dir, fsMagic(t, dir))
	}
	data := wtData(3*wtChunk+777, 7)
	path, res := wtWrite(t, dir, data, WriterOptions{ChunkSize: wtChunk, Workers: 2}, false)
	if !res.Direct {
		t.Errorf("writer on a disk file system did not use O_DIRECT")
	}
	r, err := OpenReader(path, false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if !r.Direct() {
		t.Errorf("reader on a disk file system did not use O_DIRECT")
	}
	var got []byte
	if err := r.Stream(context.Background(), res.Chunks, ReadOptions{}, func(_ int, raw []byte) error {
		got = append(got, raw...)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Error("O_DIRECT round trip changed the data")
	}
	// NoDirect is honoured.
	w, err := Create(context.Background(), filepath.Join(dir, "plain"), WriterOptions{ChunkSize: wtChunk, NoDirect: true})
	if err != nil {
		t.Fatal(err)
	}
	if w.Direct() {
		t.Error("NoDirect writer reports O_DIRECT")
	}
	w.Abort()
	r2, err := OpenReader(path, true)
	if err != nil {
		t.Fatal(err)
	}
	if r2.Direct() {
		t.Error("noDirect reader reports O_DIRECT")
	}
	r2.Close()
}

// TestDirectAllocatesAhead: on a disk file system, a direct file's blocks
// are allocated ahead of the writes (so that they overwrite, in
// parallel), and what was allocated beyond the data is cut at Close.
func TestDirectAllocatesAhead(t *testing.T) {
	dir := t.TempDir()
	switch fsMagic(t, dir) {
	case unix.EXT4_SUPER_MAGIC, unix.XFS_SUPER_MAGIC:
	default:
		t.Skipf("%s is not on ext4 or xfs (statfs magic %#x)", dir, fsMagic(t, dir))
	}
	path := filepath.Join(dir, "data")
	var written atomic.Int64
	w, err := Create(context.Background(), path, WriterOptions{ChunkSize: wtChunk, Workers: 2, Progress: func(n int64) { written.Add(n) }})
	if err != nil {
		t.Fatal(err)
	}
	data := wtData(3*wtChunk+777, 9)
	if _, err := w.Write(data[:2*wtChunk]); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); written.Load() < 2*wtChunk; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first chunks were not written")
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	if st.Size < minAllocAhead || st.Blocks*512 < minAllocAhead {
		t.Errorf("while writing: size %d, %d bytes allocated; want at least %d allocated ahead", st.Size, st.Blocks*512, minAllocAhead)
	}
	if _, err := w.Write(data[2*wtChunk:]); err != nil {
		t.Fatal(err)
	}
	res, err := w.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != res.Size || st.Blocks*512 >= minAllocAhead {
		t.Errorf("after Close: size %d (data %d), %d bytes allocated", st.Size, res.Size, st.Blocks*512)
	}
	got, err := wtRead(t, path, res.Chunks, 2)
	if err != nil || !bytes.Equal(got, data) {
		t.Errorf("read back %d bytes (%v), want the %d written", len(got), err, len(data))
	}
}

// TestPoolGrows: a pool with room to grow hands out buffers beyond those
// it started with, up to its limit and no further, all usable.
func TestPoolGrows(t *testing.T) {
	p, err := newBufferPool(2, wtChunk)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	p.grow(11)
	var taken []*alignedBuffer
	for i := 0; i < 11; i++ {
		b := p.get()
		if !isAligned(b.mem) || len(b.mem) != wtChunk {
			t.Fatalf("buffer %d: %d bytes at %p, not a whole aligned chunk", i, len(b.mem), &b.mem[0])
		}
		b.mem[len(b.mem)-1] = byte(i)
		taken = append(taken, b)
	}
	p.mu.Lock()
	n := len(p.all)
	p.mu.Unlock()
	if n != 11 || len(p.free) != 0 {
		t.Fatalf("after 11 gets: %d buffers, %d free; want 11, 0", n, len(p.free))
	}
	for _, b := range taken {
		p.put(b)
	}
	// A pinned pool does not grow.
	pinned, err := newPinnedPool(1, wtChunk, func(b []byte) (func([]byte), error) { return func([]byte) {}, nil })
	if err != nil {
		t.Fatal(err)
	}
	defer pinned.close()
	pinned.grow(5)
	if pinned.limit != 1 || pinned.wake != nil {
		t.Errorf("a pinned pool grew to %d", pinned.limit)
	}
}

// TestHugeBuffer: a buffer of whole huge pages starts on one.
func TestHugeBuffer(t *testing.T) {
	b, err := newHugeBuffer(2 * hugePage)
	if err != nil {
		t.Fatal(err)
	}
	defer b.free()
	if addr := uintptr(unsafe.Pointer(&b.mem[0])); addr%hugePage != 0 || len(b.mem) != 2*hugePage {
		t.Fatalf("%d bytes at %#x", len(b.mem), addr)
	}
	b.mem[0], b.mem[len(b.mem)-1] = 1, 2
}

// TestWriterBacklog: with a backlog, a writer with one worker takes a
// stream of many chunks (more than its own buffers) and it reads back the
// same.
func TestWriterBacklog(t *testing.T) {
	data := wtData(40*wtChunk+123, 11)
	path, res := wtWrite(t, t.TempDir(), data, WriterOptions{ChunkSize: wtChunk, Workers: 1, Method: MethodAuto, Backlog: 32 * wtChunk}, true)
	got, err := wtRead(t, path, res.Chunks, 2)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes (%v), want the %d written", len(got), err, len(data))
	}
}

// TestWriterHurry: chunks encoded after Hurry take s2 instead of zstd (or
// raw where s2 does not pay), those before keep zstd, and all read back.
func TestWriterHurry(t *testing.T) {
	data := wtData(12*wtChunk+77, 12)
	for _, method := range []Method{MethodZstd, MethodAuto} {
		t.Run(string(method), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "d")
			w, err := Create(context.Background(), path, WriterOptions{ChunkSize: wtChunk, Workers: 2, Method: method})
			if err != nil {
				t.Fatal(err)
			}
			// Hurry while the workers still encode: whichever
			// codec each chunk got, the file reads back.
			if _, err := w.Write(data); err != nil {
				t.Fatal(err)
			}
			w.Hurry()
			res, err := w.Close()
			if err != nil {
				t.Fatal(err)
			}
			got, err := wtRead(t, path, res.Chunks, 2)
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("read back %d bytes (%v), want the %d written", len(got), err, len(data))
			}
		})
	}
	// Hurry before any data, with no backlog (so the queue never holds
	// more chunks than there are workers): every chunk zstd would take
	// takes s2; and without Hurry none does.
	for _, hurry := range []bool{true, false} {
		path := filepath.Join(t.TempDir(), "d")
		w, err := Create(context.Background(), path, WriterOptions{ChunkSize: wtChunk, Workers: 2, Method: MethodZstd})
		if err != nil {
			t.Fatal(err)
		}
		if hurry {
			w.Hurry()
		}
		if _, err := w.Write(data); err != nil {
			t.Fatal(err)
		}
		res, err := w.Close()
		if err != nil {
			t.Fatal(err)
		}
		for i, c := range res.Chunks {
			if hurry && c.Codec != CodecS2 && c.Codec != CodecRaw || !hurry && c.Codec == CodecS2 {
				t.Errorf("hurry %v: chunk %d has codec %v", hurry, i, c.Codec)
			}
		}
		if hurry && res.Chunks[0].Codec != CodecS2 {
			t.Errorf("after Hurry, chunk 0 (compressible) has codec %v, want s2", res.Chunks[0].Codec)
		}
		got, err := wtRead(t, path, res.Chunks, 2)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("hurry %v: read back %d bytes (%v), want the %d written", hurry, len(got), err, len(data))
		}
	}
}

func TestTmpfsFallback(t *testing.T) {
	const shm = "/dev/shm"
	if _, err := os.Stat(shm); err != nil {
		t.Skipf("no %s: %v", shm, err)
	}
	if fsMagic(t, shm) != unix.TMPFS_MAGIC {
		t.Skipf("%s is not tmpfs", shm)
	}
	dir, err := os.MkdirTemp(shm, "gdswriter-test-")
	if err != nil {
		t.Skipf("cannot write to %s: %v", shm, err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// Linux 6.6 and later accept O_DIRECT on tmpfs; older kernels refuse it
	// at open, and the writer must fall back to plain I/O. Either way Direct
	// must say what happened.
	want := acceptsODirect(t, dir)
	if want {
		t.Logf("this kernel's tmpfs accepts O_DIRECT; checking that Direct reports it and data round-trips")
	}
	data := wtData(2*wtChunk+99, 3)
	path, res := wtWrite(t, dir, data, WriterOptions{ChunkSize: wtChunk, Method: MethodAuto}, false)
	if res.Direct != want {
		t.Errorf("writer Direct = %v on tmpfs, O_DIRECT probe says %v", res.Direct, want)
	}
	r, err := OpenReader(path, false)
	if err != nil {
		t.Fatal(err)
	}
	if r.Direct() != want {
		t.Errorf("reader Direct = %v on tmpfs, O_DIRECT probe says %v", r.Direct(), want)
	}
	r.Close()
	got, err := wtRead(t, path, res.Chunks, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Error("tmpfs round trip changed the data")
	}
}

// TestDirectFallbackAtFirstIO makes the file system refuse a direct
// transfer (an unaligned buffer on an O_DIRECT file gets EINVAL) and checks
// that the I/O is redone without O_DIRECT and reported as such.
func TestDirectFallbackAtFirstIO(t *testing.T) {
	dir := t.TempDir()
	if !acceptsODirect(t, dir) {
		t.Skipf("%s does not accept O_DIRECT at all", dir)
	}
	backing := make([]byte, 3*Alignment+1)
	data := backing[1:] // not page aligned, and not a multiple of 4096 long
	copy(data, wtData(len(data), 11))
	path := filepath.Join(dir, "raw")
	direct, err := RawWrite(context.Background(), path, data, Alignment, 1, false)
	if err != nil {
		t.Fatalf("RawWrite of an unaligned buffer: %v", err)
	}
	if direct {
		t.Errorf("RawWrite reports O_DIRECT although the kernel refused the unaligned write")
	}
	got := make([]byte, len(data))
	if _, err := RawRead(context.Background(), path, got, Alignment, 1, false); err != nil {
		t.Fatalf("RawRead: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Error("data changed through the fallback path")
	}
}

func TestRawRoundTrip(t *testing.T) {
	dir := t.TempDir()
	const size = 1 << 20
	for _, workers := range []int{1, 4} {
		src, err := newAlignedBuffer(size)
		if err != nil {
			t.Fatal(err)
		}
		defer src.free()
		copy(src.mem, wtData(size, uint64(workers)))
		path := filepath.Join(dir, fmt.Sprintf("raw-%d", workers))
		direct, err := RawWrite(context.Background(), path, src.mem, 64<<10, workers, false)
		if err != nil {
			t.Fatalf("RawWrite: %v", err)
		}
		if want := acceptsODirect(t, dir); direct != want {
			t.Errorf("RawWrite direct = %v, O_DIRECT probe %v", direct, want)
		}
		if st, err := os.Stat(path); err != nil || st.Size() != size {
			t.Fatalf("raw file: %v, %v", st, err)
		}
		dst, err := newAlignedBuffer(size)
		if err != nil {
			t.Fatal(err)
		}
		defer dst.free()
		if _, err := RawRead(context.Background(), path, dst.mem, 64<<10, workers, workers == 4); err != nil {
			t.Fatalf("RawRead: %v", err)
		}
		if !bytes.Equal(dst.mem, src.mem) {
			t.Errorf("workers=%d: RawRead returned different bytes", workers)
		}
		// A file is never overwritten, and a cancelled read fails.
		if _, err := RawWrite(context.Background(), path, src.mem, 64<<10, workers, false); !errors.Is(err, os.ErrExist) {
			t.Errorf("RawWrite over an existing file: %v", err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := RawRead(ctx, path, dst.mem, 64<<10, workers, false); !errors.Is(err, context.Canceled) {
			t.Errorf("RawRead with a cancelled context: %v", err)
		}
	}
	// Reading more than the file holds is an error, not a short success.
	big := make([]byte, 2<<20)
	if _, err := RawRead(context.Background(), filepath.Join(dir, "raw-1"), big, 64<<10, 2, true); !errors.Is(err, io.EOF) {
		t.Errorf("RawRead past the end: %v", err)
	}
}

// wtFlip inverts the byte at off of the file at path.
func wtFlip(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// chunkAt returns the index of the chunk whose extent holds file offset off.
func chunkAt(t *testing.T, chunks []Chunk, off int64) int {
	t.Helper()
	for i, c := range chunks {
		if off >= c.Offset && off < c.Offset+c.Extent() {
			return i
		}
	}
	t.Fatalf("no chunk holds offset %d", off)
	return -1
}

// wantChunkError checks that err reports bad data in chunk index of path.
func wantChunkError(t *testing.T, err error, path string, index int, reason string) {
	t.Helper()
	if err == nil {
		t.Fatalf("Stream accepted damaged data (want an error for chunk %d)", index)
	}
	if !errors.Is(err, ErrCorrupt) {
		t.Errorf("error does not wrap ErrCorrupt: %v", err)
	}
	var ce *ChunkError
	if !errors.As(err, &ce) {
		t.Fatalf("error is not a *ChunkError: %v", err)
	}
	if ce.Path != path || ce.Index != index {
		t.Errorf("ChunkError names %s chunk %d, want %s chunk %d", ce.Path, ce.Index, path, index)
	}
	if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), fmt.Sprintf("chunk %d", index)) {
		t.Errorf("message %q does not name the file and chunk", err)
	}
	if reason != "" && !strings.Contains(ce.Reason, reason) {
		t.Errorf("reason %q does not say %q", ce.Reason, reason)
	}
}

func TestCorruptionIsDetected(t *testing.T) {
	dir := t.TempDir()
	// 3.5 chunks: the last one is short, so its extent has zero padding.
	data := wtData(3*wtChunk+wtChunk/2+100, 5)
	for _, method := range []Method{MethodNone, MethodZstd} {
		cases := []struct {
			name string
			off  func(c []Chunk, size int64) int64
		}{
			{"first byte of chunk 0", func(c []Chunk, _ int64) int64 { return c[0].Offset }},
			{"payload of chunk 1", func(c []Chunk, _ int64) int64 { return c[1].Offset + c[1].Stored/2 }},
			{"last payload byte of the last chunk", func(c []Chunk, _ int64) int64 {
				l := c[len(c)-1]
				return l.Offset + l.Stored - 1
			}},
			{"padding of the last chunk", func(c []Chunk, _ int64) int64 {
				l := c[len(c)-1]
				return l.Offset + l.Stored + 3
			}},
			{"last byte of the file", func(_ []Chunk, size int64) int64 { return size - 1 }},
		}
		for _, tc := range cases {
			t.Run(fmt.Sprintf("%s/%s", method, tc.name), func(t *testing.T) {
				path, res := wtWrite(t, dir, data, WriterOptions{ChunkSize: wtChunk, Method: method, Workers: 4}, false)
				if l := res.Chunks[len(res.Chunks)-1]; l.Stored%Alignment == 0 {
					t.Fatalf("last chunk has no padding (stored %d)", l.Stored)
				}
				off := tc.off(res.Chunks, res.Size)
				wtFlip(t, path, off)
				for _, workers := range []int{1, 4} {
					_, err := wtRead(t, path, res.Chunks, workers)
					wantChunkError(t, err, path, chunkAt(t, res.Chunks, off), "checksum mismatch")
				}
			})
		}
	}
}

// TestCorruptionBehindAValidExtentCRC damages a compressed chunk and fixes
// its extent checksum in the table, as a buggy writer might: the decoded
// checksum (or the decoder) must still catch it.
func TestCorruptionBehindAValidExtentCRC(t *testing.T) {
	dir := t.TempDir()
	data := wtData(4*wtChunk, 9)
	path, res := wtWrite(t, dir, data, WriterOptions{ChunkSize: wtChunk, Method: MethodZstd, Workers: 1}, false)
	idx := -1
	for i, c := range res.Chunks {
		if c.Codec == CodecZstd {
			idx = i
			break
		}
	}
	if idx < 0 {
		t.Fatal("no zstd chunk written")
	}
	c := &res.Chunks[idx]
	wtFlip(t, path, c.Offset+c.Stored/2)
	f, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	c.CRC = crc32c(f[c.Offset : c.Offset+c.Extent()])
	_, err = wtRead(t, path, res.Chunks, 2)
	wantChunkError(t, err, path, idx, "")

	// A table whose decoded checksum is wrong is caught the same way.
	path2, res2 := wtWrite(t, dir, data, WriterOptions{ChunkSize: wtChunk, Method: MethodNone, Workers: 1}, false)
	res2.Chunks[2].RawCRC ^= 1
	_, err = wtRead(t, path2, res2.Chunks, 2)
	wantChunkError(t, err, path2, 2, "decoded data checksum mismatch")
}

func TestTruncatedFile(t *testing.T) {
	dir := t.TempDir()
	data := wtData(3*wtChunk+5000, 13)
	for _, cut := range []int64{1, Alignment, 100} {
		t.Run(fmt.Sprintf("minus%d", cut), func(t *testing.T) {
			path, res := wtWrite(t, dir, data, WriterOptions{ChunkSize: wtChunk, Workers: 4}, false)
			if err := os.Truncate(path, res.Size-cut); err != nil {
				t.Fatal(err)
			}
			_, err := wtRead(t, path, res.Chunks, 4)
			wantChunkError(t, err, path, chunkAt(t, res.Chunks, res.Size-1), "truncated")
		})
	}
}

// settleGoroutines waits for the goroutine count to come back to at most
// before, and fails if it does not within a generous bound.
func settleGoroutines(t *testing.T, before int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines still running, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestWriterCancel(t *testing.T) {
	dir := t.TempDir()
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	path := filepath.Join(dir, "d")
	w, err := Create(ctx, path, WriterOptions{ChunkSize: wtChunk, Workers: 4, Method: MethodZstd})
	if err != nil {
		t.Fatal(err)
	}
	data := wtData(10*wtChunk+17, 1)
	if _, err := w.Write(data); err != nil {
		t.Fatalf("Write before cancel: %v", err)
	}
	cancel()
	if _, err := w.Write(data); !errors.Is(err, context.Canceled) {
		t.Errorf("Write after cancel: %v, want context.Canceled", err)
	}
	if _, err := w.ReadFrom(bytes.NewReader(data)); !errors.Is(err, context.Canceled) {
		t.Errorf("ReadFrom after cancel: %v, want context.Canceled", err)
	}
	w.Abort()
	w.Abort() // idempotent
	if _, err := w.Close(); err == nil {
		t.Error("Close after Abort succeeded")
	}
	if err := os.Remove(path); err != nil {
		t.Errorf("remove aborted file: %v", err)
	}
	settleGoroutines(t, before)

	// Cancelled while a Write is blocked on busy workers: every chunk
	// buffer is taken, so the Write must wait for workers and then see the
	// cancellation.
	ctx2, cancel2 := context.WithCancel(context.Background())
	w2, err := Create(ctx2, filepath.Join(dir, "d2"), WriterOptions{ChunkSize: wtChunk, Workers: 1, Method: MethodZstd})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		for {
			if _, err := w2.Write(data); err != nil {
				done <- err
				return
			}
		}
	}()
	cancel2()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("concurrent Write after cancel: %v", err)
	}
	if _, err := w2.Close(); !errors.Is(err, context.Canceled) {
		t.Errorf("Close of a cancelled writer: %v, want context.Canceled", err)
	}
	w2.Abort()
	settleGoroutines(t, before)
}

func TestStreamStopsOnCallbackError(t *testing.T) {
	dir := t.TempDir()
	data := wtData(12*wtChunk, 2)
	path, res := wtWrite(t, dir, data, WriterOptions{ChunkSize: wtChunk, Method: MethodS2, Workers: 2}, false)
	before := runtime.NumGoroutine()
	r, err := OpenReader(path, false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	stop := errors.New("enough")
	calls := 0
	err = r.Stream(context.Background(), res.Chunks, ReadOptions{Workers: 4}, func(i int, _ []byte) error {
		calls++
		if i == 2 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) {
		t.Errorf("Stream returned %v, want the callback's error", err)
	}
	if calls != 3 {
		t.Errorf("callback ran %d times after failing at chunk 2", calls)
	}
	settleGoroutines(t, before)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	calls = 0
	err = r.Stream(ctx, res.Chunks, ReadOptions{Workers: 2}, func(int, []byte) error { calls++; return nil })
	if !errors.Is(err, context.Canceled) || calls != 0 {
		t.Errorf("Stream with a cancelled context: %v after %d chunks", err, calls)
	}
	if err := r.Stream(context.Background(), nil, ReadOptions{}, func(int, []byte) error {
		t.Error("callback called for an empty table")
		return nil
	}); err != nil {
		t.Errorf("Stream of an empty table: %v", err)
	}
	settleGoroutines(t, before)
}

func crc32c(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// vcTable is a valid table for a 20480-byte file of three raw chunks with
// chunk size 8192: 8192 + 8192 + 100 raw bytes.
func vcTable() ([]Chunk, int64, int64, int64) {
	return []Chunk{
		{Offset: 0, Stored: 8192, Raw: 8192, Codec: CodecRaw},
		{Offset: 8192, Stored: 8192, Raw: 8192, Codec: CodecRaw},
		{Offset: 16384, Stored: 100, Raw: 100, Codec: CodecRaw},
	}, 8192, 20480, 16484
}

func TestValidateChunks(t *testing.T) {
	chunks, cs, fs, rs := vcTable()
	if err := ValidateChunks(chunks, cs, fs, rs); err != nil {
		t.Fatalf("valid table rejected: %v", err)
	}
	// Extents may lie in any order in the file.
	if err := ValidateChunks([]Chunk{
		{Offset: 12288, Stored: 8192, Raw: 8192, Codec: CodecRaw},
		{Offset: 4096, Stored: 8192, Raw: 8192, Codec: CodecRaw},
		{Offset: 0, Stored: 100, Raw: 100, Codec: CodecRaw},
	}, cs, fs, rs); err != nil {
		t.Errorf("reordered extents rejected: %v", err)
	}
	if err := ValidateChunks([]Chunk{
		{Offset: 0, Stored: 8192, Raw: 8192, Codec: CodecZstd},
		{Offset: 8192, Stored: 3000, Raw: 8192, Codec: CodecS2},
		{Offset: 12288, Stored: 5000, Raw: 100, Codec: CodecPlanes2},
	}, cs, 20480, rs); err != nil {
		t.Errorf("compressed table rejected: %v", err)
	}
	if err := ValidateChunks(nil, cs, 0, 0); err != nil {
		t.Errorf("empty table of an empty file rejected: %v", err)
	}

	cases := []struct {
		name   string
		want   string // in the error
		mutate func(c []Chunk, cs, fs, rs *int64) []Chunk
	}{
		{"overlapping extents", "overlap", func(c []Chunk, _, _, _ *int64) []Chunk { c[1].Offset = 4096; return c }},
		{"two chunks at one offset", "overlap", func(c []Chunk, _, _, _ *int64) []Chunk { c[2].Offset = 0; return c }},
		{"unaligned offset", "unaligned", func(c []Chunk, _, _, _ *int64) []Chunk { c[2].Offset = 16385; return c }},
		{"negative offset", "outside the file", func(c []Chunk, _, _, _ *int64) []Chunk { c[0].Offset = -4096; return c }},
		{"extent past the end", "outside the file", func(c []Chunk, _, _, _ *int64) []Chunk { c[2].Offset = 20480; return c }},
		{"extent straddling the end", "outside the file", func(c []Chunk, _, fs, _ *int64) []Chunk { *fs = 20000; return c }},
		{"gap in the file", "cover", func(c []Chunk, _, fs, _ *int64) []Chunk { *fs += 4096; return c }},
		{"gap between extents", "cover", func(c []Chunk, _, fs, _ *int64) []Chunk { c[2].Offset = 20480; *fs = 24576; return c }},
		{"short chunk not last", "only the last chunk", func(c []Chunk, _, _, rs *int64) []Chunk {
			c[0].Raw, c[0].Stored = 100, 100
			*rs = 100 + 8192 + 100
			return c
		}},
		{"raw sizes do not sum", "raw bytes, file declares", func(c []Chunk, _, _, rs *int64) []Chunk { *rs++; return c }},
		{"raw size zero", "raw size 0", func(c []Chunk, _, _, rs *int64) []Chunk { c[2].Raw, c[2].Stored = 0, 0; *rs -= 100; return c }},
		{"raw size above chunk size", "raw size 8193", func(c []Chunk, _, _, rs *int64) []Chunk { c[2].Raw = 8193; *rs += 8093; return c }},
		{"stored above chunk size", "stored size 8193", func(c []Chunk, _, _, _ *int64) []Chunk {
			c[2].Codec, c[2].Stored = CodecZstd, 8193
			return c
		}},
		{"chunk size not a multiple of 4096", "chunk size 8000", func(c []Chunk, cs, _, _ *int64) []Chunk { *cs = 8000; return c }},
		{"chunk size zero", "chunk size 0", func(c []Chunk, cs, _, _ *int64) []Chunk { *cs = 0; return c }},
		{"chunk size too large", "not a positive multiple", func(c []Chunk, cs, _, _ *int64) []Chunk { *cs = MaxChunkSize + Alignment; return c }},
		{"unknown codec", "unknown chunk codec", func(c []Chunk, _, _, _ *int64) []Chunk { c[1].Codec = "lz4"; return c }},
		{"empty codec", "unknown chunk codec", func(c []Chunk, _, _, _ *int64) []Chunk { c[1].Codec = ""; return c }},
		{"raw codec with stored != raw", "raw chunk with stored size", func(c []Chunk, _, _, _ *int64) []Chunk { c[2].Stored = 50; return c }},
		{"negative file size", "negative size", func(c []Chunk, _, fs, _ *int64) []Chunk { *fs = -1; return nil }},
		{"chunks missing", "raw bytes, file declares", func(c []Chunk, _, _, _ *int64) []Chunk { return c[:2] }},
		{"no chunks for a non-empty file", "raw bytes, file declares", func(c []Chunk, _, _, _ *int64) []Chunk { return nil }},
	}
	for _, tc := range cases {
		c, cs, fs, rs := vcTable()
		c = tc.mutate(c, &cs, &fs, &rs)
		if err := ValidateChunks(c, cs, fs, rs); err == nil {
			t.Errorf("%s: accepted", tc.name)
		} else if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: rejected for another reason: %v", tc.name, err)
		}
	}
}

// TestFillParallel writes a stream of Writes and FillParallels that start
// and end inside chunks and on their edges, and reads it back: the bytes
// are the stream's, whichever worker filled them; with 4 workers, fills
// run at the same time.
func TestFillParallel(t *testing.T) {
	data := wtData(9*wtChunk+777, 7)
	// Pieces of the stream: [0,a) by Write, [a,b) by FillParallel, and so on.
	cuts := []int{wtChunk / 3, 4*wtChunk + 5, 4*wtChunk + 9, 5 * wtChunk, 8 * wtChunk, len(data)}
	for _, workers := range []int{1, 4} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "data")
			w, err := Create(context.Background(), path, WriterOptions{ChunkSize: wtChunk, Method: MethodAuto, Workers: workers})
			if err != nil {
				t.Fatal(err)
			}
			var running, most atomic.Int32
			release := make(chan struct{})
			var releaseOnce sync.Once
			from := 0
			for i, to := range cuts {
				if i%2 == 0 {
					if _, err := w.Write(data[from:to]); err != nil {
						t.Fatal(err)
					}
				} else {
					base := from
					err := w.FillParallel(int64(to-from), func(dst []byte, off int64) error {
						n := running.Add(1)
						defer running.Add(-1)
						for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
						}
						if n >= 2 {
							releaseOnce.Do(func() { close(release) })
						}
						if len(dst) == wtChunk && workers > 1 {
							// Hold a whole chunk's fill until another runs
							// beside it, or a while has passed.
							select {
							case <-release:
							case <-time.After(2 * time.Second):
							}
						}
						copy(dst, data[base+int(off):])
						return nil
					})
					if err != nil {
						t.Fatal(err)
					}
				}
				from = to
			}
			if w.Offset() != int64(len(data)) {
				t.Fatalf("Offset = %d, want %d", w.Offset(), len(data))
			}
			res, err := w.Close()
			if err != nil {
				t.Fatal(err)
			}
			got, err := wtRead(t, path, res.Chunks, workers)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data) {
				t.Fatalf("read back %d bytes that differ from the %d written", len(got), len(data))
			}
			if workers > 1 && most.Load() < 2 {
				t.Errorf("at most %d fills ran at once with %d workers", most.Load(), workers)
			}
		})
	}
}

// TestFillParallelError: a worker's fill error fails the stream; Close
// reports it.
func TestFillParallelError(t *testing.T) {
	w, err := Create(context.Background(), filepath.Join(t.TempDir(), "data"), WriterOptions{ChunkSize: wtChunk, Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	bad := errors.New("page 17 could not be read")
	err = w.FillParallel(6*wtChunk, func(dst []byte, off int64) error {
		if off == 3*wtChunk {
			return bad
		}
		return nil
	})
	if err != nil && !errors.Is(err, bad) {
		t.Fatalf("FillParallel: %v", err)
	}
	if _, err := w.Close(); !errors.Is(err, bad) {
		t.Fatalf("Close = %v, want the fill's error", err)
	}
}

// TestReserve writes a stream whose middle chunks come last: Reserve
// skips them, the stream goes on with FillParallel and Write, and
// FillReserved fills them from another goroutine while a FillParallel
// still runs. The stream reads back whole; a run never filled fails
// Close; Reserve off a chunk boundary, or of part of a chunk, is refused.
func TestReserve(t *testing.T) {
	data := wtData(7*wtChunk+321, 11)
	path := filepath.Join(t.TempDir(), "data")
	w, err := Create(context.Background(), path, WriterOptions{ChunkSize: wtChunk, Method: MethodAuto, Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(data[:wtChunk]); err != nil {
		t.Fatal(err)
	}
	first, err := w.Reserve(3 * wtChunk)
	if err != nil {
		t.Fatal(err)
	}
	if first != 1 || w.Offset() != 4*wtChunk {
		t.Fatalf("Reserve: first chunk %d, offset after %d; want 1 and %d", first, w.Offset(), 4*wtChunk)
	}
	fillFrom := func(base int) func(dst []byte, off int64) error {
		return func(dst []byte, off int64) error {
			copy(dst, data[base+int(off):])
			return nil
		}
	}
	filled := make(chan error, 1)
	started := make(chan struct{})
	err = w.FillParallel(2*wtChunk, func(dst []byte, off int64) error {
		if off == 0 {
			go func() { filled <- w.FillReserved(first, fillFrom(wtChunk)) }()
			close(started)
		}
		copy(dst, data[4*wtChunk+int(off):])
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	<-started
	if _, err := w.Write(data[6*wtChunk:]); err != nil {
		t.Fatal(err)
	}
	if err := <-filled; err != nil {
		t.Fatalf("FillReserved: %v", err)
	}
	if err := w.FillReserved(first, fillFrom(wtChunk)); err == nil {
		t.Error("a second FillReserved of the same run succeeded")
	}
	res, err := w.Close()
	if err != nil {
		t.Fatal(err)
	}
	got, err := wtRead(t, path, res.Chunks, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes that differ from the %d written", len(got), len(data))
	}

	w, err = Create(context.Background(), filepath.Join(t.TempDir(), "data"), WriterOptions{ChunkSize: wtChunk, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Reserve(wtChunk + 4096); err == nil {
		t.Error("Reserve of a chunk and a bit succeeded")
	}
	if _, err := w.Write(data[:100]); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Reserve(wtChunk); err == nil {
		t.Error("Reserve inside a chunk succeeded")
	}
	if _, err := w.Write(data[100:wtChunk]); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Reserve(2 * wtChunk); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Close(); err == nil || !strings.Contains(err.Error(), "never filled") {
		t.Fatalf("Close with a reserved run unfilled = %v, want an error naming it", err)
	}
}
