package tensors

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/cuda"
	"github.com/stasis-ckpt/stasis/cuda/cudatest"
	"github.com/stasis-ckpt/stasis/gdswriter"
)

// The cuFile path against the stand-ins: libcufile.c writes and reads the
// "device memory" (host memory) with pwrite and pread, and the stand-in
// libcuda runs the checksum kernel on the host. The real library and
// kernel are exercised on the GPU machine (TestRealGPUCuFile).

func needStandIn(t *testing.T) {
	t.Helper()
	if fakeDir == "" {
		t.Skip("the stand-in driver could not be built (no gcc)")
	}
	os.Remove(filepath.Join(fakeDir, "calls.log"))
}

// withCuFile makes the cuFile library the saves and loads get pass
// through change first (GDS on, or an error), until the test ends.
func withCuFile(t *testing.T, change func(*cuda.CuFile) (*cuda.CuFile, error)) {
	t.Helper()
	t.Cleanup(func() { openCuFile = cuda.OpenCuFile })
	openCuFile = func(drv *cuda.Driver) (*cuda.CuFile, error) {
		cf, err := cuda.OpenCuFile(drv)
		if err != nil {
			t.Fatalf("the stand-in libcufile: %v", err)
		}
		return change(cf)
	}
}

func withGDS(t *testing.T) {
	withCuFile(t, func(cf *cuda.CuFile) (*cuda.CuFile, error) {
		gds := *cf
		gds.GDS, gds.ModeWhy = true, "GPUDirect Storage: nvidia-fs 2.26"
		return &gds, nil
	})
}

func metaOf(t *testing.T, s *catalog.Store, id string) Meta {
	t.Helper()
	m, err := s.ReadManifest(id)
	if err != nil {
		t.Fatal(err)
	}
	var meta Meta
	if err := json.Unmarshal(m.Meta, &meta); err != nil {
		t.Fatal(err)
	}
	return meta
}

// balanced checks that everything registered or loaded was released.
func balanced(t *testing.T) {
	t.Helper()
	c := cudatest.Calls(fakeDir)
	for _, pair := range [][2]string{
		{"cufile-handle-register", "cufile-handle-deregister"}, {"cufile-buf-register", "cufile-buf-deregister"},
		{"module-load", "module-unload"}, {"stream-create", "stream-destroy"}, {"register", "unregister"},
	} {
		if c[pair[0]] != c[pair[1]] {
			t.Errorf("%d %s, %d %s", c[pair[0]], pair[0], c[pair[1]], pair[1])
		}
	}
}

// cuFileState is a state whose chunks (4 MiB) fall every way: two whole
// chunks inside a GPU tensor of odd size, a chunk spanning it and a host
// tensor, a GPU tensor starting mid-chunk (its whole chunks start at an
// odd place in its memory), many small GPU tensors, empty tensors, and a
// short last chunk.
func cuFileState(t *testing.T) (saved, blank []Tensor) {
	add := func(name string, n int, device bool, seed uint64) {
		b := randBytes(n, seed)
		tn := Tensor{Name: name, DType: "uint8", Shape: []int64{int64(n)}, Bytes: int64(n)}
		into := tn
		if device && n > 0 {
			tn.Device, into.Device = deviceMemory(t, n), deviceMemory(t, n)
			copy(memOf[tn.Device], b)
		} else if !device {
			tn.Host, into.Host = b, make([]byte, n)
		}
		saved, blank = append(saved, tn), append(blank, into)
	}
	add("big", 10<<20+123, true, 1)
	add("host", 3<<20, false, 2)
	add("mid", 13<<20+1, true, 3)
	for i := 0; i < 100; i++ {
		add("small/"+string(rune('a'+i%26))+string(rune('a'+i/26)), 1000+i, true, uint64(10+i))
	}
	add("empty/gpu", 0, true, 0)
	add("empty/host", 0, false, 0)
	return saved, blank
}

// memOf maps the stand-in's device pointers to their memory.
var memOf = map[uintptr][]byte{}

func deviceMemory(t *testing.T, n int) uintptr {
	mem := mapped(t, n)
	memOf[ptr(mem)] = mem
	return ptr(mem)
}

func deviceBytes(tn Tensor) []byte {
	if tn.Device != 0 {
		return memOf[tn.Device]
	}
	return tn.Host
}

func sameTensors(t *testing.T, a, b []Tensor) {
	t.Helper()
	for i := range a {
		if !bytes.Equal(deviceBytes(a[i]), deviceBytes(b[i])) {
			t.Fatalf("%s came back different", a[i].Name)
		}
	}
}

// TestCuFileRoundTrip saves through cuFile and loads back through it
// bit-exactly, into GPU and host buffers; the manifest says how many
// chunks took cuFile and the checkpoint verifies on the host.
func TestCuFileRoundTrip(t *testing.T) {
	needStandIn(t)
	s := mustStore(t)
	ts, into := cuFileState(t)
	rec, err := Save(context.Background(), s, ts, SaveOptions{Job: "cufile", IO: IOCuFile})
	if err != nil {
		t.Fatal(err)
	}
	meta := metaOf(t, s, rec.ID)
	// Chunks 0 and 1 lie inside "big", chunks 4 and 5 inside "mid"; the
	// others span tensors or hold host memory.
	if meta.IOPath != "cufile-compat" || !strings.HasPrefix(meta.Why, "4 of 7 chunks written by cuFileWrite") || !strings.Contains(meta.Why, "compat mode") || strings.Contains(meta.Why, "compression") {
		t.Fatalf("meta %+v", meta)
	}
	if c := cudatest.Calls(fakeDir); c["cufile-write"] != 4 || c["launch"] != 4 || c["cufile-buf-register"] != 2 {
		t.Fatalf("calls %v", c)
	}
	if _, err := s.Verify(context.Background(), rec.ID, catalog.ReadOptions{}); err != nil {
		t.Fatalf("verify on the host: %v", err)
	}
	if _, err := Load(context.Background(), s, rec.ID, into, LoadOptions{IO: IOCuFile}); err != nil {
		t.Fatal(err)
	}
	sameTensors(t, ts, into)
	if c := cudatest.Calls(fakeDir); c["cufile-read"] != 4 || c["launch"] != 8 {
		t.Fatalf("calls %v", c)
	}

	// The same checkpoint through the pinned path, and into host memory.
	_, pinned := cuFileState(t)
	if _, err := Load(context.Background(), s, rec.ID, pinned, LoadOptions{IO: IOPinned}); err != nil {
		t.Fatal(err)
	}
	sameTensors(t, ts, pinned)
	hosts := make([]Tensor, len(ts))
	for i, tn := range ts {
		hosts[i] = Tensor{Name: tn.Name, DType: tn.DType, Shape: tn.Shape, Bytes: tn.Bytes, Host: make([]byte, tn.Bytes)}
	}
	if _, err := Load(context.Background(), s, rec.ID, hosts, LoadOptions{IO: IOCuFile}); err != nil {
		t.Fatal(err)
	}
	sameTensors(t, ts, hosts)
	if c := cudatest.Calls(fakeDir); c["cufile-read"] != 4 {
		t.Fatalf("cuFileRead used where it should not be: %v", c)
	}
	balanced(t)
}

// TestCuFileAuto: auto takes cuFile only where it does GPUDirect Storage
// and the save is uncompressed, and records why not otherwise.
func TestCuFileAuto(t *testing.T) {
	needStandIn(t)
	s := mustStore(t)
	src := mapped(t, 8<<20)
	copy(src, randBytes(8<<20, 4))
	ts := []Tensor{{Name: "w", DType: "uint8", Shape: []int64{8 << 20}, Device: ptr(src), Bytes: 8 << 20}}
	none := gdswriter.WriterOptions{Method: gdswriter.MethodNone}
	whys := map[string]SaveOptions{
		"compat mode: nvidia-fs is not loaded":               {Job: "auto", Writer: none},
		"compression was asked for, and cuFile writes raw":   {Job: "auto", Writer: gdswriter.WriterOptions{Method: gdswriter.MethodAuto}},
		"cuFile not used: the pinned I/O path was asked for": {Job: "auto", Writer: none, IO: IOPinned},
	}
	for want, o := range whys {
		rec, err := Save(context.Background(), s, ts, o)
		if err != nil {
			t.Fatal(err)
		}
		if meta := metaOf(t, s, rec.ID); meta.IOPath != "pinned" || !strings.Contains(meta.Why, want) || !strings.HasPrefix(meta.Why, whyPinned) {
			t.Errorf("%s: meta %+v", want, meta)
		}
	}
	if c := cudatest.Calls(fakeDir); c["cufile-write"] != 0 {
		t.Fatalf("cuFile used: %v", c)
	}

	// $STASIS_IO chooses when the caller does not.
	t.Setenv(IOEnv, "pinned")
	rec, err := Save(context.Background(), s, ts, SaveOptions{Job: "auto", Writer: none})
	if err != nil || !strings.Contains(metaOf(t, s, rec.ID).Why, "the pinned I/O path was asked for") {
		t.Fatalf("STASIS_IO=pinned: %v", err)
	}
	t.Setenv(IOEnv, "gds")
	if _, err := Save(context.Background(), s, ts, SaveOptions{Job: "auto", Writer: none}); !errors.Is(err, catalog.ErrInvalid) || err.Error() != `invalid argument: $STASIS_IO "gds": use auto, cufile or pinned` {
		t.Fatalf("STASIS_IO=gds: %v", err)
	}
	t.Setenv(IOEnv, "")

	withGDS(t)
	rec, err = Save(context.Background(), s, ts, SaveOptions{Job: "auto"}) // no method: uncompressed
	if err != nil {
		t.Fatal(err)
	}
	if meta := metaOf(t, s, rec.ID); meta.IOPath != "cufile" || !strings.HasPrefix(meta.Why, "2 of 2 chunks written by cuFileWrite straight from GPU memory (GPUDirect Storage") {
		t.Fatalf("with GDS: %+v", meta)
	}
	dst := mapped(t, 8<<20)
	into := []Tensor{{Name: "w", DType: "uint8", Shape: []int64{8 << 20}, Device: ptr(dst), Bytes: 8 << 20}}
	if _, err := Load(context.Background(), s, rec.ID, into, LoadOptions{}); err != nil || !bytes.Equal(dst, src) {
		t.Fatalf("load: %v", err)
	}
	if c := cudatest.Calls(fakeDir); c["cufile-write"] != 2 || c["cufile-read"] != 2 {
		t.Fatalf("calls %v", c)
	}
	balanced(t)
}

// TestCuFileMissing: without libcufile, auto records why and cufile fails
// with ErrCuFileUnavailable, listing nothing.
func TestCuFileMissing(t *testing.T) {
	needStandIn(t)
	withCuFile(t, func(*cuda.CuFile) (*cuda.CuFile, error) {
		return nil, errors.New("libcufile.so.0 not found (searched ...)")
	})
	s := mustStore(t)
	src := mapped(t, 4<<20)
	ts := []Tensor{{Name: "w", DType: "uint8", Shape: []int64{4 << 20}, Device: ptr(src), Bytes: 4 << 20}}
	rec, err := Save(context.Background(), s, ts, SaveOptions{Job: "missing", Writer: gdswriter.WriterOptions{Method: gdswriter.MethodNone}})
	if err != nil {
		t.Fatal(err)
	}
	if meta := metaOf(t, s, rec.ID); meta.IOPath != "pinned" || !strings.HasSuffix(meta.Why, "; cuFile not used: libcufile.so.0 not found (searched ...)") {
		t.Fatalf("meta %+v", meta)
	}
	_, err = Save(context.Background(), s, ts, SaveOptions{Job: "missing", IO: IOCuFile})
	if !errors.Is(err, ErrCuFileUnavailable) || err.Error() != "cuFile is unavailable: the cufile I/O path was asked for: libcufile.so.0 not found (searched ...)" {
		t.Fatalf("cufile without libcufile: %v", err)
	}
	into := []Tensor{{Name: "w", DType: "uint8", Shape: []int64{4 << 20}, Device: ptr(mapped(t, 4<<20)), Bytes: 4 << 20}}
	if _, err := Load(context.Background(), s, rec.ID, into, LoadOptions{IO: IOCuFile}); !errors.Is(err, ErrCuFileUnavailable) {
		t.Fatalf("load through cufile without libcufile: %v", err)
	}
	if recs, _ := s.List(catalog.Filter{}); len(recs) != 1 {
		t.Fatalf("%d checkpoints listed", len(recs))
	}
}

// TestCuFileHandleRefused: where cuFileHandleRegister fails, a save in
// auto goes through the pinned path and says why; one that asked for
// cuFile fails and lists nothing; loads do the same.
func TestCuFileHandleRefused(t *testing.T) {
	needStandIn(t)
	withGDS(t)
	s := mustStore(t)
	ts, into := cuFileState(t)
	cudatest.Switch(t, fakeDir, "fail-cufile-handle", "")
	rec, err := Save(context.Background(), s, ts, SaveOptions{Job: "refused", Writer: gdswriter.WriterOptions{Method: gdswriter.MethodNone}})
	if err != nil {
		t.Fatal(err)
	}
	if meta := metaOf(t, s, rec.ID); meta.IOPath != "pinned" || !strings.HasSuffix(meta.Why, "; cuFile not used: cuFileHandleRegister failed: udev property not found (cuFile error 5027)") {
		t.Fatalf("meta %+v", meta)
	}
	_, err = Save(context.Background(), s, ts, SaveOptions{Job: "refused", IO: IOCuFile})
	if !errors.Is(err, ErrCuFileUnavailable) || !strings.Contains(err.Error(), "cuFileHandleRegister failed: udev property not found (cuFile error 5027)") {
		t.Fatalf("cufile with registration refused: %v", err)
	}
	if recs, _ := s.List(catalog.Filter{}); len(recs) != 1 {
		t.Fatalf("%d checkpoints listed", len(recs))
	}
	if staged, _ := os.ReadDir(filepath.Join(s.Root, "staging")); len(staged) != 0 {
		t.Fatalf("staging holds %d entries", len(staged))
	}
	if _, err := Load(context.Background(), s, rec.ID, into, LoadOptions{IO: IOCuFile}); !errors.Is(err, ErrCuFileUnavailable) {
		t.Fatalf("load through cufile with registration refused: %v", err)
	}
	if _, err := Load(context.Background(), s, rec.ID, into, LoadOptions{}); err != nil {
		t.Fatal(err)
	}
	sameTensors(t, ts, into)
	balanced(t)
}

// TestCuFileBuffersRefused: a GPU buffer cuFile will not register is
// written unregistered, and the manifest says so; compression asked for
// beside cufile applies to the chunks cuFile does not write.
func TestCuFileBuffersRefused(t *testing.T) {
	needStandIn(t)
	s := mustStore(t)
	ts, _ := cuFileState(t)
	cudatest.Switch(t, fakeDir, "fail-cufile-buf", "")
	zstd := gdswriter.WriterOptions{Method: gdswriter.MethodZstd}
	rec, err := Save(context.Background(), s, ts, SaveOptions{Job: "unregistered", IO: IOCuFile, Writer: zstd})
	if err != nil {
		t.Fatal(err)
	}
	if meta := metaOf(t, s, rec.ID); meta.IOPath != "cufile-compat" || !strings.Contains(meta.Why, "; compression (zstd) applied to those others only") ||
		!strings.HasSuffix(meta.Why, "; 2 GPU buffers went unregistered (cuFileBufRegister failed: GPU memory pinning failed (cuFile error 5036))") {
		t.Fatalf("meta %+v", meta)
	}
	balanced(t)
}

// TestCuFileCorruptChunk: a chunk read by cuFile that fails its checksum
// on the GPU is named.
func TestCuFileCorruptChunk(t *testing.T) {
	needStandIn(t)
	s := mustStore(t)
	ts, into := cuFileState(t)
	rec, err := Save(context.Background(), s, ts, SaveOptions{Job: "corrupt", IO: IOCuFile})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := s.ReadManifest(rec.ID)
	c := m.Files[0].Chunks[4] // inside "mid", written by cuFile
	data := filepath.Join(s.CheckpointDir(rec.ID), dataFileName)
	f, err := os.OpenFile(data, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{0xde, 0xad}, c.Offset+1000)
	f.Close()
	_, err = Load(context.Background(), s, rec.ID, into, LoadOptions{IO: IOCuFile})
	var ce *gdswriter.ChunkError
	if !errors.As(err, &ce) || ce.Index != 4 || !errors.Is(err, gdswriter.ErrCorrupt) || !strings.Contains(err.Error(), "data.0000: chunk 4 at offset") {
		t.Fatalf("corrupted chunk: %v", err)
	}
	balanced(t)
}

// TestCuFileWriteFailsMidSave: cuFileWrite failing midway fails the save,
// lists nothing, leaves nothing in staging, and releases every handle,
// buffer, kernel and pinned buffer.
func TestCuFileWriteFailsMidSave(t *testing.T) {
	needStandIn(t)
	s := mustStore(t)
	ts, _ := cuFileState(t)
	cudatest.Switch(t, fakeDir, "fail-cufile-write", "8388608")
	_, err := Save(context.Background(), s, ts, SaveOptions{Job: "fail", IO: IOCuFile, Writer: gdswriter.WriterOptions{Workers: 1}})
	if err == nil || !strings.Contains(err.Error(), "cuFileWrite failed: CUDA Driver API error (cuFile error 5011)") {
		t.Fatalf("save with cuFileWrite failing: %v", err)
	}
	if recs, _ := s.List(catalog.Filter{}); len(recs) != 0 {
		t.Fatalf("listed: %+v", recs)
	}
	if staged, _ := os.ReadDir(filepath.Join(s.Root, "staging")); len(staged) != 0 {
		t.Fatalf("staging holds %d entries", len(staged))
	}
	balanced(t)
}

func TestParseIO(t *testing.T) {
	t.Setenv(IOEnv, "")
	for in, want := range map[string]string{"": IOAuto, "auto": IOAuto, "cufile": IOCuFile, "pinned": IOPinned} {
		if got, err := ParseIO(in); err != nil || got != want {
			t.Errorf("ParseIO(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParseIO("GDS"); !errors.Is(err, catalog.ErrInvalid) || !strings.Contains(err.Error(), `I/O path "GDS": use auto, cufile or pinned`) {
		t.Errorf("ParseIO(GDS): %v", err)
	}
	for _, c := range []struct {
		off, n int64
		want   bool
	}{{0, 4096, true}, {1, 4096, false}, {1, 8191, true}, {4096, 4095, false}, {100, 0, false}} {
		if got := holdsWholeChunk(c.off, c.n, 4096); got != c.want {
			t.Errorf("holdsWholeChunk(%d, %d) = %v", c.off, c.n, got)
		}
	}
}
