package gdswriter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
)

// rtAligned returns n bytes of page-aligned memory holding wtData, freed at
// the end of the test.
func rtAligned(t *testing.T, n int, seed uint64) []byte {
	t.Helper()
	b, err := newAlignedBuffer(max(n, 1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.free)
	copy(b.mem, wtData(n, seed))
	return b.mem[:n]
}

// rtReadInto reads a whole data file with ReadInto into dst and checks the
// progress it reports.
func rtReadInto(t *testing.T, path string, res Result, dst []byte, workers int) error {
	t.Helper()
	r, err := OpenReader(path, false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var progress atomic.Int64
	err = r.ReadInto(context.Background(), res.Chunks, res.ChunkSize, dst, ReadOptions{Workers: workers, Progress: func(n int64) { progress.Add(n) }})
	if err == nil && progress.Load() != res.RawSize {
		t.Errorf("ReadInto reported %d bytes of %d", progress.Load(), res.RawSize)
	}
	return err
}

// rtDsts returns an aligned and an unaligned destination of n bytes.
func rtDsts(t *testing.T, n int) map[string][]byte {
	t.Helper()
	al, err := newAlignedBuffer(max(n, 1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(al.free)
	return map[string][]byte{"aligned": al.mem[:n], "unaligned": make([]byte, n+1)[1:]}
}

func TestReadInto(t *testing.T) {
	dir := t.TempDir()
	sizes := []int{0, 1, 4095, 4096, wtChunk - 1, wtChunk, wtChunk + 1, 5*wtChunk + 12345}
	for _, method := range []Method{MethodNone, MethodZstd, MethodAuto} {
		for _, workers := range []int{1, 4} {
			for _, size := range sizes {
				t.Run(fmt.Sprintf("%s/workers=%d/size=%d", method, workers, size), func(t *testing.T) {
					data := wtData(size, uint64(size)+1)
					path, res := wtWrite(t, dir, data, WriterOptions{ChunkSize: wtChunk, Method: method, Workers: workers}, false)
					for name, dst := range rtDsts(t, size) {
						for i := range dst {
							dst[i] = 0xa5
						}
						if err := rtReadInto(t, path, res, dst, workers); err != nil {
							t.Fatalf("%s destination: %v", name, err)
						}
						if !bytes.Equal(dst, data) {
							t.Errorf("%s destination: bytes differ", name)
						}
					}
				})
			}
		}
	}
}

func TestReadIntoRefuses(t *testing.T) {
	dir := t.TempDir()
	data := wtData(3*wtChunk+10, 4)
	path, res := wtWrite(t, dir, data, WriterOptions{ChunkSize: wtChunk, Workers: 2}, false)
	r, err := OpenReader(path, false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, n := range []int{len(data) - 1, len(data) + 1, 0} {
		if err := r.ReadInto(context.Background(), res.Chunks, res.ChunkSize, make([]byte, n), ReadOptions{}); err == nil {
			t.Errorf("ReadInto a %d-byte destination of %d bytes of chunks succeeded", n, len(data))
		}
	}
	// A chunk size that does not match the table is an error, not a
	// write outside the destination.
	// (It used to panic in a worker goroutine, taking the process down.)
	for _, cs := range []int64{2 * wtChunk, wtChunk / 2, 0} {
		if err := r.ReadInto(context.Background(), res.Chunks, cs, make([]byte, len(data)), ReadOptions{}); err == nil {
			t.Errorf("ReadInto with chunk size %d for a table of %d succeeded", cs, wtChunk)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.ReadInto(ctx, res.Chunks, res.ChunkSize, make([]byte, len(data)), ReadOptions{}); !errors.Is(err, context.Canceled) {
		t.Errorf("ReadInto with a cancelled context: %v", err)
	}
	if err := r.ReadInto(context.Background(), nil, wtChunk, nil, ReadOptions{}); err != nil {
		t.Errorf("ReadInto of an empty table: %v", err)
	}
}

func TestReadIntoCorruption(t *testing.T) {
	dir := t.TempDir()
	data := wtData(4*wtChunk+3000, 6)
	for _, method := range []Method{MethodNone, MethodZstd} {
		for _, chunkIdx := range []int{1, 4} {
			t.Run(fmt.Sprintf("%s/chunk%d", method, chunkIdx), func(t *testing.T) {
				path, res := wtWrite(t, dir, data, WriterOptions{ChunkSize: wtChunk, Method: method, Workers: 4}, false)
				c := res.Chunks[chunkIdx]
				wtFlip(t, path, c.Offset+c.Stored-1)
				// The aligned destination takes the direct path for whole
				// raw chunks, the unaligned one the copying path.
				for name, dst := range rtDsts(t, len(data)) {
					for _, workers := range []int{1, 4} {
						err := rtReadInto(t, path, res, dst, workers)
						if err == nil {
							t.Fatalf("%s destination, %d workers: damage not detected", name, workers)
						}
						wantChunkError(t, err, path, chunkIdx, "")
					}
				}
			})
		}
	}
	path, res := wtWrite(t, dir, data, WriterOptions{ChunkSize: wtChunk, Workers: 4}, false)
	if err := os.Truncate(path, res.Size-Alignment); err != nil {
		t.Fatal(err)
	}
	for _, dst := range rtDsts(t, len(data)) {
		err := rtReadInto(t, path, res, dst, 2)
		wantChunkError(t, err, path, chunkAt(t, res.Chunks, res.Size-1), "truncated")
	}
}

func TestWriteShared(t *testing.T) {
	dir := t.TempDir()
	const size = 5*wtChunk + 1234
	for _, method := range []Method{MethodNone, MethodZstd, MethodAuto} {
		for _, workers := range []int{1, 4} {
			patterns := map[string]func(w *Writer, src []byte) error{
				"whole aligned buffer": func(w *Writer, src []byte) error { return w.WriteShared(src) },
				"after a partial chunk": func(w *Writer, src []byte) error {
					if _, err := w.Write(src[:100]); err != nil {
						return err
					}
					return w.WriteShared(src[100:])
				},
				"unaligned memory": func(w *Writer, src []byte) error {
					if err := w.WriteShared(src[:1]); err != nil {
						return err
					}
					return w.WriteShared(src[1:])
				},
				"whole chunks between copies": func(w *Writer, src []byte) error {
					if _, err := w.ReadFrom(bytes.NewReader(nil)); err != nil {
						return err
					}
					if err := w.WriteShared(src[:2*wtChunk]); err != nil {
						return err
					}
					if _, err := w.Write(src[2*wtChunk : 2*wtChunk+wtChunk]); err != nil {
						return err
					}
					return w.WriteShared(src[3*wtChunk:])
				},
			}
			for name, write := range patterns {
				t.Run(fmt.Sprintf("%s/workers=%d/%s", method, workers, name), func(t *testing.T) {
					src := rtAligned(t, size, 8)
					orig := bytes.Clone(src)
					path := filepath.Join(dir, fmt.Sprintf("shared-%s-%d-%d", method, workers, len(name)))
					var progress atomic.Int64
					w, err := Create(context.Background(), path, WriterOptions{ChunkSize: wtChunk, Method: method, Workers: workers,
						Progress: func(n int64) { progress.Add(n) }})
					if err != nil {
						t.Fatal(err)
					}
					if err := write(w, src); err != nil {
						w.Abort()
						t.Fatalf("write: %v", err)
					}
					if w.Offset() != size {
						t.Errorf("Offset = %d, want %d", w.Offset(), size)
					}
					res, err := w.Close()
					if err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(src, orig) {
						t.Error("WriteShared changed the caller's memory")
					}
					if res.RawSize != size || progress.Load() != size || len(res.Chunks) != 6 {
						t.Errorf("RawSize %d, progress %d, %d chunks", res.RawSize, progress.Load(), len(res.Chunks))
					}
					if st, err := os.Stat(path); err != nil || st.Size() != res.Size {
						t.Errorf("file size %v (%v), Result.Size %d", st, err, res.Size)
					}
					if err := ValidateChunks(res.Chunks, res.ChunkSize, res.Size, res.RawSize); err != nil {
						t.Errorf("ValidateChunks: %v", err)
					}
					got, err := wtRead(t, path, res.Chunks, workers)
					if err != nil || !bytes.Equal(got, orig) {
						t.Errorf("Stream after WriteShared: %v, equal %v", err, bytes.Equal(got, orig))
					}
				})
			}
		}
	}
}

func TestWriteSharedCancel(t *testing.T) {
	before := runtime.NumGoroutine()
	src := rtAligned(t, 8*wtChunk, 3)
	ctx, cancel := context.WithCancel(context.Background())
	path := filepath.Join(t.TempDir(), "d")
	w, err := Create(ctx, path, WriterOptions{ChunkSize: wtChunk, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WriteShared(src[:4*wtChunk]); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := w.WriteShared(src[4*wtChunk:]); !errors.Is(err, context.Canceled) {
		t.Errorf("WriteShared after cancel: %v", err)
	}
	w.Abort()
	if err := w.WriteShared(src); err == nil {
		t.Error("WriteShared after Abort succeeded")
	}
	os.Remove(path)
	settleGoroutines(t, before)
}

// TestForEach delivers every chunk exactly once, with its bytes, from
// several workers, and stops at the first error.
func TestForEach(t *testing.T) {
	dir := t.TempDir()
	data := wtData(37*Alignment*16+999, 11)
	path, res := wtWrite(t, dir, data, WriterOptions{ChunkSize: 16 * Alignment, Method: MethodZstd, Workers: 3}, false)
	r, err := OpenReader(path, false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := make([]byte, len(data))
	seen := make([]atomic.Int32, len(res.Chunks))
	err = r.ForEach(context.Background(), res.Chunks, ReadOptions{Workers: 4}, func(i int, raw []byte) error {
		seen[i].Add(1)
		copy(got[int64(i)*res.ChunkSize:], raw)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range seen {
		if n := seen[i].Load(); n != 1 {
			t.Fatalf("chunk %d delivered %d times", i, n)
		}
	}
	if !bytes.Equal(got, data) {
		t.Fatal("ForEach delivered other bytes")
	}
	stop := errors.New("stop here")
	err = r.ForEach(context.Background(), res.Chunks, ReadOptions{Workers: 4}, func(i int, raw []byte) error {
		if i == 5 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) {
		t.Fatalf("ForEach returned %v, want the callback's error", err)
	}
}
