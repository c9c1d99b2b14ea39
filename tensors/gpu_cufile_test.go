package tensors

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/cuda"
	"github.com/stasis-ckpt/stasis/gdswriter"
	"golang.org/x/sys/unix"
)

// TestRealGPUCuFile saves GPU memory through the real libcufile (GDS or
// compat mode) and the real checksum kernel, loads it back through cuFile
// into other GPU memory, checks the bytes and verifies the checkpoint on
// the host, finds a corrupted chunk on the GPU, and shows what auto does.
// It logs save and load speeds of cuFile and of the pinned pipeline on the
// same bytes in the same run (figures only).
//
//	STASIS_GPU_TEST=1 [STASIS_GPU_TEST_CUFILE=works|refused] [STASIS_GPU_TEST_BYTES=N] [STASIS_GPU_TEST_DIR=/root/t] go test ./tensors -run RealGPUCuFile -v
//
// STASIS_GPU_TEST_CUFILE=works asserts that cuFile takes the file (on a
// disk cuFile can register), =refused that it refuses it (the GPU machine
// without its disk's udev record: cuFileHandleRegister fails), and that
// auto then falls back saying why.
func TestRealGPUCuFile(t *testing.T) {
	n, dir := realGPUSettings(t, 1<<30)
	expect := os.Getenv("STASIS_GPU_TEST_CUFILE")
	drv, err := cuda.LoadLibrary()
	if err != nil {
		t.Fatal(err)
	}
	devCtx, err := drv.PrimaryContext(0)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := cuda.OpenCuFile(drv)
	if err != nil {
		t.Fatalf("libcufile: %v", err)
	}
	t.Logf("libcufile %s (version %s): %s", cf.Path, cf.VersionString(), cf.ModeWhy)

	// One large tensor, one starting at an odd offset of the stream, a
	// host tensor between them, and a short tail.
	sizes := []int{n, 64<<20 + 1, 3 << 20, 12345}
	var src, dst []uintptr
	host := mapped(t, n)
	pattern := bf16(32<<20, 6)
	for off := 0; off < n; off += len(pattern) {
		copy(host[off:], pattern)
	}
	hostTensor := randBytes(sizes[2], 7)
	var ts, into []Tensor
	for i, size := range sizes {
		name := "t" + strconv.Itoa(i)
		if i == 2 {
			ts = append(ts, Tensor{Name: name, DType: "uint8", Shape: []int64{int64(size)}, Host: hostTensor, Bytes: int64(size)})
			into = append(into, Tensor{Name: name, DType: "uint8", Shape: []int64{int64(size)}, Host: make([]byte, size), Bytes: int64(size)})
			src, dst = append(src, 0), append(dst, 0)
			continue
		}
		s, err := drv.Alloc(devCtx, size)
		if err != nil {
			t.Fatal(err)
		}
		defer drv.Free(devCtx, s)
		d, err := drv.Alloc(devCtx, size)
		if err != nil {
			t.Fatal(err)
		}
		defer drv.Free(devCtx, d)
		if err := drv.CopyToDevice(devCtx, s, host[:size]); err != nil {
			t.Fatal(err)
		}
		src, dst = append(src, s), append(dst, d)
		ts = append(ts, Tensor{Name: name, DType: "uint8", Shape: []int64{int64(size)}, Device: s, Bytes: int64(size)})
		into = append(into, Tensor{Name: name, DType: "uint8", Shape: []int64{int64(size)}, Device: d, Bytes: int64(size)})
	}
	total := 0
	for _, size := range sizes {
		total += size
	}
	gb := func(d time.Duration) float64 { return float64(total) / d.Seconds() / 1e9 }
	check := func(what string) {
		t.Helper()
		back := mapped(t, n)
		for i, size := range sizes {
			if dst[i] == 0 {
				if !bytes.Equal(into[i].Host, hostTensor) {
					t.Fatalf("%s: the host tensor came back different", what)
				}
				continue
			}
			if err := drv.CopyToHost(devCtx, back[:size], dst[i]); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(back[:size], host[:size]) {
				t.Fatalf("%s: GPU tensor %d came back different", what, i)
			}
			drv.CopyToDevice(devCtx, dst[i], make([]byte, min(size, 1<<20))) // spoil the start for the next load
		}
	}
	none := gdswriter.WriterOptions{Method: gdswriter.MethodNone}

	s, err := catalog.Open(filepath.Join(dir, "store-cufile"), catalog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// auto: cuFile only with GPUDirect Storage.
	rec, err := Save(context.Background(), s, ts, SaveOptions{Job: "auto", Writer: none})
	if err != nil {
		t.Fatal(err)
	}
	meta := metaOf(t, s, rec.ID)
	t.Logf("auto: io_path %s: %s", meta.IOPath, meta.Why)
	if !cf.GDS && meta.IOPath != "pinned" {
		t.Fatalf("auto in compat mode took %s", meta.IOPath)
	}
	if expect == "refused" && !strings.Contains(meta.Why, "cuFileHandleRegister failed") && cf.GDS {
		t.Fatalf("auto with the file refused: %s", meta.Why)
	}
	s.Remove(rec.ID)

	unix.Sync()
	start := time.Now()
	rec, err = Save(context.Background(), s, ts, SaveOptions{Job: "pinned", Writer: none, IO: IOPinned})
	if err != nil {
		t.Fatal(err)
	}
	pinnedSave := time.Since(start)
	unix.Sync()
	start = time.Now()
	if _, err := Load(context.Background(), s, rec.ID, into, LoadOptions{IO: IOPinned}); err != nil {
		t.Fatal(err)
	}
	pinnedLoad := time.Since(start)
	check("pinned")
	s.Remove(rec.ID)

	unix.Sync()
	start = time.Now()
	rec, err = Save(context.Background(), s, ts, SaveOptions{Job: "cufile", IO: IOCuFile})
	cufileSave := time.Since(start)
	if expect == "refused" {
		if !errors.Is(err, ErrCuFileUnavailable) || !strings.Contains(err.Error(), "cuFileHandleRegister failed") {
			t.Fatalf("cufile with the file refused: %v", err)
		}
		t.Logf("cufile, the file refused: %v", err)
		if recs, _ := s.List(catalog.Filter{}); len(recs) != 0 {
			t.Fatalf("a failed save is listed: %+v", recs)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	meta = metaOf(t, s, rec.ID)
	t.Logf("cufile: io_path %s: %s", meta.IOPath, meta.Why)
	if meta.IOPath != ioPathName(cf) {
		t.Fatalf("io_path %s", meta.IOPath)
	}
	if _, err := s.Verify(context.Background(), rec.ID, catalog.ReadOptions{}); err != nil {
		t.Fatalf("the GPU's checksums do not hold on the host: %v", err)
	}
	unix.Sync()
	start = time.Now()
	if _, err := Load(context.Background(), s, rec.ID, into, LoadOptions{IO: IOCuFile}); err != nil {
		t.Fatal(err)
	}
	cufileLoad := time.Since(start)
	check("cufile")
	t.Logf("%d bytes: save pinned %.2f GB/s, cufile %.2f GB/s (%.2f x); load pinned %.2f GB/s, cufile %.2f GB/s (%.2f x)",
		total, gb(pinnedSave), gb(cufileSave), pinnedSave.Seconds()/cufileSave.Seconds(), gb(pinnedLoad), gb(cufileLoad), pinnedLoad.Seconds()/cufileLoad.Seconds())

	// A corrupted chunk that cuFile reads is found on the GPU.
	m, _ := s.ReadManifest(rec.ID)
	c := m.Files[0].Chunks[1]
	f, err := os.OpenFile(filepath.Join(s.CheckpointDir(rec.ID), dataFileName), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{0x5a}, c.Offset+777)
	f.Close()
	unix.Sync()
	_, err = Load(context.Background(), s, rec.ID, into, LoadOptions{IO: IOCuFile})
	var ce *gdswriter.ChunkError
	if !errors.As(err, &ce) || ce.Index != 1 || !strings.Contains(err.Error(), "computed in device memory") {
		t.Fatalf("a corrupted chunk: %v", err)
	}
	t.Logf("corrupted chunk: %v", err)
}
