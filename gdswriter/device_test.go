package gdswriter

import (
	"bytes"
	"context"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// memoryDevice stands in for cuFile: "device memory" is host memory named
// by a number (the buffer's Base), and the file is written and read with
// pwrite and pread.
type memoryDevice struct {
	mem        map[uintptr][]byte
	failWrites int // the write after this many fails (0: none)
	writes     atomic.Int64
	mu         sync.Mutex
	open       int // files registered and not closed
	openErr    error
}

func (d *memoryDevice) Open(f *os.File) (DeviceFile, error) {
	if d.openErr != nil {
		return nil, d.openErr
	}
	d.mu.Lock()
	d.open++
	d.mu.Unlock()
	return &memoryFile{d: d, f: f}, nil
}

type memoryFile struct {
	d *memoryDevice
	f *os.File
}

func (m *memoryFile) span(s DeviceSpan) []byte { return m.d.mem[s.Base][s.Offset : s.Offset+s.Len] }

func (m *memoryFile) WriteAt(src DeviceSpan, off int64) (uint32, error) {
	if n := m.d.writes.Add(1); m.d.failWrites > 0 && n > int64(m.d.failWrites) {
		return 0, errors.New("cuFileWrite failed (cuFile error 5011)")
	}
	b := append([]byte(nil), m.span(src)...) // host memory, not aligned for O_DIRECT
	buf, _ := newAlignedBuffer(len(b))
	defer buf.free()
	copy(buf.mem, b)
	_, err := m.f.WriteAt(buf.mem[:len(b)], off)
	return crc32.Checksum(b, castagnoli), err
}

func (m *memoryFile) ReadAt(dst DeviceSpan, off int64) (uint32, error) {
	buf, _ := newAlignedBuffer(int(dst.Len))
	defer buf.free()
	if _, err := m.f.ReadAt(buf.mem[:dst.Len], off); err != nil {
		return 0, err
	}
	copy(m.span(dst), buf.mem)
	return crc32.Checksum(m.span(dst), castagnoli), nil
}

func (m *memoryFile) Close() error {
	m.d.mu.Lock()
	m.d.open--
	m.d.mu.Unlock()
	return nil
}

// TestFillDevice writes a stream of host bytes, then device memory that
// starts mid-chunk and ends with a short chunk: the whole chunks inside the
// device memory go through the device, the others through host memory,
// and an ordinary reader reads it all back and verifies every checksum.
func TestFillDevice(t *testing.T) {
	const chunk = 64 << 10
	head := codecTestRandom(1000, 1)
	dev := codecTestRandom(5*chunk+777, 2)
	d := &memoryDevice{mem: map[uintptr][]byte{7: dev}}
	path := filepath.Join(t.TempDir(), "data")
	w, err := Create(context.Background(), path, WriterOptions{ChunkSize: chunk, Method: MethodAuto, Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.UseDevice(d); err != nil {
		t.Fatal(err)
	}
	w.Write(head)
	err = w.FillDevice(int64(len(dev)), 7, func(dst []byte, off int64) error {
		copy(dst, dev[off:])
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	res, err := w.Close()
	if err != nil {
		t.Fatal(err)
	}
	// Chunk 0 holds the head and the device memory's start; chunks 1 to 4
	// lie inside the device memory; chunk 5 is its end, short.
	if res.DeviceChunks != 4 || len(res.Chunks) != 6 {
		t.Fatalf("%d device chunks of %d", res.DeviceChunks, len(res.Chunks))
	}
	if d.open != 0 {
		t.Fatalf("%d device files left open", d.open)
	}
	for i := 1; i <= 4; i++ {
		if c := res.Chunks[i]; c.Codec != CodecRaw || c.CRC != c.RawCRC || !c.DeviceReadable() {
			t.Errorf("device chunk %d: %+v", i, c)
		}
	}
	want := append(append([]byte(nil), head...), dev...)
	if got := readAll(t, path, res); !bytes.Equal(got, want) {
		t.Fatal("the stream read back differs")
	}

	// Those chunks read straight back into "device memory"; a corrupted one
	// is named.
	back := make([]byte, len(dev))
	d.mem[9] = back
	r, err := OpenReader(path, false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	df, err := r.OpenDevice(d)
	if err != nil {
		t.Fatal(err)
	}
	defer df.Close()
	var chunks []DeviceChunk
	for i := 1; i <= 4; i++ {
		start := int64(i*chunk - len(head))
		chunks = append(chunks, DeviceChunk{Index: i, Chunk: res.Chunks[i], Dst: DeviceSpan{Base: 9, Offset: start, Len: chunk}})
	}
	if err := r.ReadToDevice(context.Background(), df, chunks, ReadOptions{Workers: 2}); err != nil {
		t.Fatal(err)
	}
	lo := chunk - len(head)
	if !bytes.Equal(back[lo:lo+4*chunk], dev[lo:lo+4*chunk]) {
		t.Fatal("chunks read into device memory differ")
	}
	wtFlip(t, path, res.Chunks[3].Offset+5)
	err = r.ReadToDevice(context.Background(), df, chunks, ReadOptions{Workers: 2})
	var ce *ChunkError
	if !errors.As(err, &ce) || ce.Index != 3 || !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "computed in device memory") {
		t.Fatalf("corrupted chunk: %v", err)
	}
	bad := chunks[:1]
	bad[0].Chunk = res.Chunks[5] // short: padded, so not readable to the device
	if err := r.ReadToDevice(context.Background(), df, bad, ReadOptions{}); err == nil || !strings.Contains(err.Error(), "cannot be read straight") {
		t.Fatalf("a padded chunk: %v", err)
	}
}

func readAll(t *testing.T, path string, res Result) []byte {
	t.Helper()
	r, err := OpenReader(path, false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var got []byte
	if err := r.Stream(context.Background(), res.Chunks, ReadOptions{}, func(_ int, raw []byte) error {
		got = append(got, raw...)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestFillDeviceFailure makes the second device write fail: Close reports
// it, naming the file and chunk, and the device file is closed.
func TestFillDeviceFailure(t *testing.T) {
	const chunk = 64 << 10
	dev := codecTestRandom(8*chunk, 3)
	d := &memoryDevice{mem: map[uintptr][]byte{1: dev}, failWrites: 1}
	path := filepath.Join(t.TempDir(), "data")
	w, err := Create(context.Background(), path, WriterOptions{ChunkSize: chunk, Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.UseDevice(d); err != nil {
		t.Fatal(err)
	}
	err = w.FillDevice(int64(len(dev)), 1, func([]byte, int64) error { t.Error("host path used"); return nil })
	if err == nil {
		_, err = w.Close()
	} else {
		w.Abort()
	}
	if err == nil || !strings.Contains(err.Error(), "cuFileWrite failed (cuFile error 5011)") || !strings.Contains(err.Error(), path) {
		t.Fatalf("a failing device write: %v", err)
	}
	if d.open != 0 {
		t.Fatalf("%d device files left open", d.open)
	}
}

// TestUseDeviceRefused: a device that cannot register the file leaves the
// Writer on the host path.
func TestUseDeviceRefused(t *testing.T) {
	d := &memoryDevice{openErr: errors.New("cuFileHandleRegister failed (cuFile error 5027)")}
	path := filepath.Join(t.TempDir(), "data")
	w, err := Create(context.Background(), path, WriterOptions{ChunkSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.UseDevice(d); err == nil {
		t.Fatal("UseDevice succeeded")
	}
	data := codecTestRandom(3*4096, 4)
	if err := w.FillDevice(int64(len(data)), 1, func(dst []byte, off int64) error { copy(dst, data[off:]); return nil }); err != nil {
		t.Fatal(err)
	}
	res, err := w.Close()
	if err != nil || res.DeviceChunks != 0 {
		t.Fatalf("%+v, %v", res, err)
	}
	if got := readAll(t, path, res); !bytes.Equal(got, data) {
		t.Fatal("read back differs")
	}
}
