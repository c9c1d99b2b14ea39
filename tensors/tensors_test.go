package tensors

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/cuda/cudatest"
	"github.com/stasis-ckpt/stasis/gdswriter"
)

// Device buffers are tested against the stand-in driver
// (cuda/testdata/fakecuda), whose device pointers are host addresses; the
// real driver is exercised on the GPU machine (cmd/gputensors).

var fakeDir string // the stand-in's state directory; "" when it could not be built

func TestMain(m *testing.M) {
	code := 0
	if os.Getenv("STASIS_GPU_TEST") == "" {
		var cleanup func()
		fakeDir, cleanup = cudatest.Use()
		defer func() { cleanup(); os.Exit(code) }()
	} else {
		defer func() { os.Exit(code) }()
	}
	code = m.Run()
}

func mustStore(t *testing.T) *catalog.Store {
	t.Helper()
	s, err := catalog.Open(filepath.Join(t.TempDir(), "store"), catalog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// bf16 returns n bf16 values drawn from normal(0, 0.02).
func bf16(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, 2*n)
	for i := 0; i < n; i++ {
		bits := math.Float32bits(float32(r.NormFloat64() * 0.02))
		bits += 0x7fff + (bits>>16)&1
		b[2*i], b[2*i+1] = byte(bits>>16), byte(bits>>24)
	}
	return b
}

func randBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 2))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func opts(job string) SaveOptions {
	return SaveOptions{Job: job, Step: 7, Writer: gdswriter.WriterOptions{Method: gdswriter.MethodAuto}}
}

func TestHostRoundTrip(t *testing.T) {
	s := mustStore(t)
	w := bf16(3<<20, 1) // 6 MiB: chunks span tensors
	ts := []Tensor{
		{Name: "model/w", DType: "bf16", Shape: []int64{1024, 3072}, Host: w, Bytes: int64(len(w))},
		{Name: "model/b", DType: "fp32", Shape: []int64{3}, Host: randBytes(12, 2), Bytes: 12},
		{Name: "step", DType: "int64", Shape: []int64{}, Host: randBytes(8, 3), Bytes: 8},
		{Name: "empty", DType: "fp16", Shape: []int64{0, 4}, Host: []byte{}, Bytes: 0},
	}
	rec, err := Save(context.Background(), s, ts, opts("host"))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Kind != catalog.KindTensors || rec.Step != 7 {
		t.Fatalf("record %+v", rec)
	}
	into := make([]Tensor, len(ts))
	for i, t0 := range ts {
		into[i] = t0
		into[i].Host = make([]byte, len(t0.Host))
	}
	m, err := Load(context.Background(), s, rec.ID, into, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range ts {
		if !bytes.Equal(into[i].Host, ts[i].Host) {
			t.Errorf("%s: loaded bytes differ", ts[i].Name)
		}
	}
	var meta Meta
	if err := json.Unmarshal(m.Meta, &meta); err != nil || meta.IOPath != "host" {
		t.Fatalf("manifest meta %s: %v", m.Meta, err)
	}
	desc, _ := Describe(m)
	if len(desc) != 4 || desc[0].DType != "bf16" || fmt.Sprint(desc[0].Shape) != "[1024 3072]" {
		t.Fatalf("Describe: %+v", desc)
	}
	if ratio := float64(rec.StoredBytes) / float64(rec.Bytes); ratio > 0.72 {
		t.Errorf("bf16 weights stored at %.3f of their size, want <= 0.72", ratio)
	}
}

func TestManySmallTensors(t *testing.T) {
	s := mustStore(t)
	var ts, into []Tensor
	for i := 0; i < 20000; i++ {
		b := randBytes(4*(1+i%16), uint64(i))
		ts = append(ts, Tensor{Name: fmt.Sprintf("layer%d/p%d", i/100, i%100), DType: "fp32", Shape: []int64{int64(len(b) / 4)}, Host: b, Bytes: int64(len(b))})
		into = append(into, Tensor{Name: ts[i].Name, DType: "fp32", Shape: ts[i].Shape, Host: make([]byte, len(b)), Bytes: int64(len(b))})
	}
	rec, err := Save(context.Background(), s, ts, opts("small"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Load(context.Background(), s, rec.ID, into, LoadOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range ts {
		if !bytes.Equal(into[i].Host, ts[i].Host) {
			t.Fatalf("%s differs", ts[i].Name)
		}
	}
}

func TestBadInput(t *testing.T) {
	s := mustStore(t)
	b := randBytes(16, 1)
	bad := map[string]Tensor{
		"needs 16 bytes":  {Name: "x", DType: "fp32", Shape: []int64{4}, Host: b[:12], Bytes: 12},
		"unknown dtype":   {Name: "x", DType: "fp4", Shape: []int64{4}, Host: b, Bytes: 16},
		"not a usable":    {Name: "../x", DType: "fp32", Shape: []int64{4}, Host: b, Bytes: 16},
		"no buffer":       {Name: "x", DType: "fp32", Shape: []int64{4}, Bytes: 16},
		"either a device": {Name: "x", DType: "fp32", Shape: []int64{4}, Host: b, Device: 1, Bytes: 16},
	}
	for want, tn := range bad {
		if _, err := Save(context.Background(), s, []Tensor{tn}, opts("bad")); !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v", want, err)
		}
	}
	x := Tensor{Name: "x", DType: "fp32", Shape: []int64{4}, Host: b, Bytes: 16}
	if _, err := Save(context.Background(), s, []Tensor{x, x}, opts("bad")); !errors.Is(err, ErrMismatch) {
		t.Errorf("two tensors named x: %v", err)
	}
	if recs, _ := s.List(catalog.Filter{}); len(recs) != 0 {
		t.Fatalf("refused saves are listed: %+v", recs)
	}

	rec, err := Save(context.Background(), s, []Tensor{x}, opts("load"))
	if err != nil {
		t.Fatal(err)
	}
	loads := map[string][]Tensor{
		"x is fp32 of 16 bytes in the checkpoint, the buffer is fp32 of 32 bytes": {{Name: "x", DType: "fp32", Shape: []int64{8}, Host: make([]byte, 32), Bytes: 32}},
		"the checkpoint has x, no buffer was given":                               {},
		"a buffer is given for y":                                                 {{Name: "x", DType: "fp32", Host: make([]byte, 16), Bytes: 16}, {Name: "y", DType: "fp32", Host: make([]byte, 4), Bytes: 4}},
	}
	for want, into := range loads {
		if _, err := Load(context.Background(), s, rec.ID, into, LoadOptions{}); !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), want) {
			t.Errorf("load (%s): %v", want, err)
		}
	}
	// A corrupted chunk: Load fails and names the file and chunk.
	data := filepath.Join(s.CheckpointDir(rec.ID), dataFileName)
	raw, _ := os.ReadFile(data)
	raw[3] ^= 1
	os.WriteFile(data, raw, 0o600)
	into := []Tensor{{Name: "x", DType: "fp32", Host: make([]byte, 16), Bytes: 16}}
	if _, err := Load(context.Background(), s, rec.ID, into, LoadOptions{}); !errors.Is(err, gdswriter.ErrCorrupt) || !strings.Contains(err.Error(), "data.0000: chunk 0") {
		t.Errorf("corrupted chunk: %v", err)
	}
}

// mapped returns n bytes of mapped memory: a "device buffer" for the
// stand-in driver, whose device pointers are host addresses.
var (
	mapped = cudatest.DeviceMemory
	ptr    = cudatest.Pointer
)

func pinCounts(t *testing.T) (reg, unreg int) {
	t.Helper()
	calls := cudatest.Calls(fakeDir)
	return calls["register"], calls["unregister"]
}

func TestDeviceRoundTripWithStandIn(t *testing.T) {
	if fakeDir == "" {
		t.Skip("the stand-in driver could not be built (no gcc)")
	}
	s := mustStore(t)
	src := mapped(t, 10<<20)
	copy(src, bf16(5<<20, 9))
	dst := mapped(t, 10<<20)
	ts := []Tensor{{Name: "w", DType: "bf16", Shape: []int64{5 << 20}, Device: ptr(src), Bytes: int64(len(src))}}
	rec, err := Save(context.Background(), s, ts, opts("device"))
	if err != nil {
		t.Fatal(err)
	}
	into := []Tensor{{Name: "w", DType: "bf16", Shape: []int64{5 << 20}, Device: ptr(dst), Bytes: int64(len(dst))}}
	if _, err := Load(context.Background(), s, rec.ID, into, LoadOptions{}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(src, dst) {
		t.Fatal("the device buffer came back different")
	}
	m, _ := s.ReadManifest(rec.ID)
	var meta Meta
	if err := json.Unmarshal(m.Meta, &meta); err != nil || meta.IOPath != "pinned" || meta.Why == "" {
		t.Fatalf("manifest meta %s: %v", m.Meta, err)
	}
	if reg, unreg := pinCounts(t); reg == 0 || reg != unreg {
		t.Fatalf("pinned %d buffers, unpinned %d", reg, unreg)
	}
}

// TestDeviceErrorMidSave makes the third device-to-host copy fail: nothing
// is listed, nothing is left in staging, and every pinned buffer is
// unpinned.
func TestDeviceErrorMidSave(t *testing.T) {
	if fakeDir == "" {
		t.Skip("the stand-in driver could not be built (no gcc)")
	}
	os.Remove(filepath.Join(fakeDir, "calls.log"))
	os.WriteFile(filepath.Join(fakeDir, "fail-dtoh"), []byte("3"), 0o600)
	defer os.Remove(filepath.Join(fakeDir, "fail-dtoh"))
	s := mustStore(t)
	src := mapped(t, 20<<20)
	ts := []Tensor{{Name: "w", DType: "uint8", Shape: []int64{20 << 20}, Device: ptr(src), Bytes: int64(len(src))}}
	_, err := Save(context.Background(), s, ts, opts("fail"))
	if err == nil || !strings.Contains(err.Error(), "w: cuMemcpyDtoH: CUDA_ERROR_UNKNOWN") {
		t.Fatalf("save with a failing copy: %v", err)
	}
	if recs, _ := s.List(catalog.Filter{}); len(recs) != 0 {
		t.Fatalf("listed: %+v", recs)
	}
	if staged, _ := os.ReadDir(filepath.Join(s.Root, "staging")); len(staged) != 0 {
		t.Fatalf("staging holds %d entries", len(staged))
	}
	if reg, unreg := pinCounts(t); reg == 0 || reg != unreg {
		t.Fatalf("pinned %d buffers, unpinned %d", reg, unreg)
	}
}
