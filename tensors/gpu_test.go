package tensors

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/cuda"
	"github.com/stasis-ckpt/stasis/gdswriter"
	"golang.org/x/sys/unix"
)

// TestRealGPU saves GPU memory through the real driver and loads it back
// into other GPU memory, with and without compression, and checks the
// bytes; a save that hits an invalid device pointer midway lists nothing.
// It logs save and load speeds next to raw O_DIRECT I/O of the same bytes
// in the same run (figures only: nothing is asserted about speed).
//
//	STASIS_GPU_TEST=1 [STASIS_GPU_TEST_BYTES=2147483648] [STASIS_GPU_TEST_DIR=/root/t] go test ./tensors -run RealGPU -v
//
// With STASIS_GPU_TEST_OUT=PREFIX it also writes the weights to PREFIX.bin
// (for scripts/bench_peers.py, which times torch.save and safetensors on
// the same bytes) and the figures to PREFIX.json.
func TestRealGPU(t *testing.T) {
	n, dir := realGPUSettings(t, 2<<30)
	drv, err := cuda.Load()
	if err != nil {
		t.Fatal(err)
	}
	devCtx, err := drv.PrimaryContext(0)
	if err != nil {
		t.Fatal(err)
	}
	src, err := drv.Alloc(devCtx, n)
	if err != nil {
		t.Fatal(err)
	}
	defer drv.Free(devCtx, src)
	dst, err := drv.Alloc(devCtx, n)
	if err != nil {
		t.Fatal(err)
	}
	defer drv.Free(devCtx, dst)
	host := mapped(t, n)
	pattern := bf16(32<<20, 5) // 64 MiB, tiled
	for off := 0; off < n; off += len(pattern) {
		copy(host[off:], pattern)
	}
	if err := drv.CopyToDevice(devCtx, src, host); err != nil {
		t.Fatal(err)
	}
	back := mapped(t, n)
	gb := func(d time.Duration) float64 { return float64(n) / d.Seconds() / 1e9 }
	out := os.Getenv("STASIS_GPU_TEST_OUT")
	figures := map[string]float64{"bytes": float64(n)}
	if out != "" {
		if err := os.WriteFile(out+".bin", host, 0o600); err != nil {
			t.Fatal(err)
		}
		defer func() {
			data, _ := json.MarshalIndent(figures, "", " ")
			os.WriteFile(out+".json", data, 0o600)
		}()
	}

	start := time.Now()
	if _, err := gdswriter.RawWrite(context.Background(), filepath.Join(dir, "raw"), host, gdswriter.DefaultChunkSize, gdswriter.DefaultWorkers(), false); err != nil {
		t.Fatal(err)
	}
	rawWrite := gb(time.Since(start))
	unix.Sync()
	clear(back) // touch every page first, so the baseline pays no page faults
	start = time.Now()
	if _, err := gdswriter.RawRead(context.Background(), filepath.Join(dir, "raw"), back, gdswriter.DefaultChunkSize, gdswriter.DefaultWorkers(), false); err != nil {
		t.Fatal(err)
	}
	rawRead := gb(time.Since(start))
	os.Remove(filepath.Join(dir, "raw"))
	t.Logf("%d bytes of bf16 weights; raw O_DIRECT write %.2f GB/s, read %.2f GB/s", n, rawWrite, rawRead)
	figures["raw_write_gbps"], figures["raw_read_gbps"] = rawWrite, rawRead

	for _, method := range []gdswriter.Method{gdswriter.MethodNone, gdswriter.MethodAuto} {
		s, err := catalog.Open(filepath.Join(dir, "store-"+string(method)), catalog.Options{})
		if err != nil {
			t.Fatal(err)
		}
		ts := []Tensor{{Name: "w", DType: "bf16", Shape: []int64{int64(n / 2)}, Device: src, Bytes: int64(n)}}
		unix.Sync()
		start = time.Now()
		rec, err := Save(context.Background(), s, ts, SaveOptions{Job: "gpu", Writer: gdswriter.WriterOptions{Method: method}})
		if err != nil {
			t.Fatal(err)
		}
		save := time.Since(start)
		unix.Sync()
		start = time.Now()
		into := []Tensor{{Name: "w", DType: "bf16", Shape: ts[0].Shape, Device: dst, Bytes: int64(n)}}
		if _, err := Load(context.Background(), s, rec.ID, into, LoadOptions{}); err != nil {
			t.Fatal(err)
		}
		load := time.Since(start)
		clear(back)
		if err := drv.CopyToHost(devCtx, back, dst); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(back, host) {
			t.Fatalf("%s: the GPU buffer came back different", method)
		}
		t.Logf("compress %s: save %.2f GB/s (%.2f x raw write), load %.2f GB/s (%.2f x raw read), stored %.3f of the bytes",
			method, gb(save), gb(save)/rawWrite, gb(load), gb(load)/rawRead, float64(rec.StoredBytes)/float64(rec.Bytes))
		figures["stasis_"+string(method)+"_save_gbps"], figures["stasis_"+string(method)+"_load_gbps"] = gb(save), gb(load)
		figures["stasis_"+string(method)+"_stored_ratio"] = float64(rec.StoredBytes) / float64(rec.Bytes)
		s.Remove(rec.ID)
	}

	// The same bytes as 20,000 small tensors (the sizes of a model's many
	// small parameters), uncompressed and auto.
	const many = 20000
	var small, smallInto []Tensor
	per := int64(n/many) &^ 1
	for i := 0; i < many; i++ {
		small = append(small, Tensor{Name: "p" + strconv.Itoa(i), DType: "bf16", Shape: []int64{per / 2}, Device: src + uintptr(int64(i)*per), Bytes: per})
		smallInto = append(smallInto, Tensor{Name: "p" + strconv.Itoa(i), DType: "bf16", Shape: []int64{per / 2}, Device: dst + uintptr(int64(i)*per), Bytes: per})
	}
	sb := func(d time.Duration) float64 { return float64(per*many) / d.Seconds() / 1e9 }
	for _, method := range []gdswriter.Method{gdswriter.MethodNone, gdswriter.MethodAuto} {
		s, _ := catalog.Open(filepath.Join(dir, "store-small-"+string(method)), catalog.Options{})
		unix.Sync()
		start = time.Now()
		rec, err := Save(context.Background(), s, small, SaveOptions{Job: "small", Writer: gdswriter.WriterOptions{Method: method}})
		if err != nil {
			t.Fatal(err)
		}
		save := time.Since(start)
		unix.Sync()
		start = time.Now()
		if _, err := Load(context.Background(), s, rec.ID, smallInto, LoadOptions{}); err != nil {
			t.Fatal(err)
		}
		load := time.Since(start)
		t.Logf("%d small tensors, compress %s: save %.2f GB/s, load %.2f GB/s", many, method, sb(save), sb(load))
		figures["small_stasis_"+string(method)+"_save_gbps"], figures["small_stasis_"+string(method)+"_load_gbps"] = sb(save), sb(load)
		s.Remove(rec.ID)
	}

	s, _ := catalog.Open(filepath.Join(dir, "store-bad"), catalog.Options{})
	bad := []Tensor{{Name: "past-the-end", DType: "uint8", Shape: []int64{64 << 20}, Device: src + uintptr(n), Bytes: 64 << 20}}
	if _, err := Save(context.Background(), s, bad, SaveOptions{Job: "gpu"}); err == nil {
		t.Fatal("a save from past the end of a GPU buffer succeeded")
	} else {
		t.Logf("invalid device pointer: %v", err)
	}
	if recs, _ := s.List(catalog.Filter{}); len(recs) != 0 {
		t.Fatalf("a failed save is listed: %+v", recs)
	}
}

// realGPUSettings skips the test unless STASIS_GPU_TEST is set, and returns
// how many bytes to move (STASIS_GPU_TEST_BYTES, else defaultBytes) and the
// directory for the stores (STASIS_GPU_TEST_DIR, else a temporary one).
func realGPUSettings(t *testing.T, defaultBytes int) (n int, dir string) {
	t.Helper()
	if os.Getenv("STASIS_GPU_TEST") == "" {
		t.Skip("needs an NVIDIA GPU: set STASIS_GPU_TEST=1 on the GPU machine")
	}
	n = defaultBytes
	if v, err := strconv.Atoi(os.Getenv("STASIS_GPU_TEST_BYTES")); err == nil {
		n = v
	}
	if dir = os.Getenv("STASIS_GPU_TEST_DIR"); dir == "" {
		dir = t.TempDir()
	}
	return n, dir
}
