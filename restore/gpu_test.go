package restore

import (
	"errors"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stasis-ckpt/stasis/checkpoint"
	"github.com/stasis-ckpt/stasis/cuda"
)

const standInUUID = "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f" // the stand-in driver's one GPU

func standIn(t *testing.T) *cuda.Driver {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc is needed to build the stand-in driver")
	}
	lib := filepath.Join(t.TempDir(), "libcuda.so.1")
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-o", lib, "../cuda/testdata/fakecuda/libcuda.c").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	t.Setenv("STASIS_LIBCUDA", lib)
	t.Setenv("STASIS_FAKE_CUDA_DIR", t.TempDir())
	drv, err := cuda.Load()
	if err != nil {
		t.Fatal(err)
	}
	return drv
}

func TestGPUPlan(t *testing.T) {
	drv := standIn(t)
	const other = "GPU-00000000-0000-0000-0000-000000000001"
	meta := func(devs ...cuda.Device) *checkpoint.GPUMeta {
		return &checkpoint.GPUMeta{DriverVersion: 13000, Devices: devs}
	}
	fake := func(i int, uuid string) cuda.Device { return cuda.Device{Index: i, Name: "Fake GPU", UUID: uuid} }

	// The same GPU: no pairs.
	if pairs, err := gpuPlan(meta(fake(0, standInUUID)), drv, nil, false); err != nil || pairs != nil {
		t.Fatalf("same GPU: %v, %v", pairs, err)
	}
	// Another machine's GPU 0: remapped by index.
	pairs, err := gpuPlan(meta(fake(0, other)), drv, nil, false)
	if err != nil || len(pairs) != 1 || cuda.FormatUUID(pairs[0].Old) != other || cuda.FormatUUID(pairs[0].New) != standInUUID {
		t.Fatalf("by index: %v, %v", pairs, err)
	}
	// The same, named by --gpu-map.
	gm, err := ParseGPUMap(other + "=" + standInUUID)
	if err != nil {
		t.Fatal(err)
	}
	if pairs, err := gpuPlan(meta(fake(0, other)), drv, gm, false); err != nil || len(pairs) != 1 {
		t.Fatalf("--gpu-map: %v, %v", pairs, err)
	}
	// A map to a GPU that is not here.
	gm, _ = ParseGPUMap(standInUUID + "=" + other)
	if _, err := gpuPlan(meta(fake(0, standInUUID)), drv, gm, false); !errors.Is(err, ErrIncompatible) {
		t.Fatalf("map to a missing GPU: %v", err)
	}
	// A partial map that would put two GPUs of the checkpoint on one.
	gm, _ = ParseGPUMap(other + "=" + standInUUID)
	if _, err := gpuPlan(meta(fake(0, other), fake(1, standInUUID)), drv, gm, false); !errors.Is(err, ErrIncompatible) {
		t.Fatalf("two GPUs onto one: %v", err)
	}
	// A checkpoint that used a second GPU this machine lacks.
	if _, err := gpuPlan(meta(fake(0, standInUUID), fake(1, other)), drv, nil, false); !errors.Is(err, ErrIncompatible) {
		t.Fatalf("missing GPU 1: %v", err)
	}
	// Another model: refused unless forced.
	h100 := cuda.Device{Index: 0, Name: "NVIDIA H100", UUID: other}
	if _, err := gpuPlan(meta(h100), drv, nil, false); !errors.Is(err, ErrIncompatible) {
		t.Fatalf("other model: %v", err)
	}
	if _, err := gpuPlan(meta(h100), drv, nil, true); err != nil {
		t.Fatalf("other model, forced: %v", err)
	}
	// Another driver: refused unless forced.
	old := meta(fake(0, standInUUID))
	old.DriverVersion = 12080
	if _, err := gpuPlan(old, drv, nil, false); !errors.Is(err, ErrIncompatible) {
		t.Fatalf("other driver: %v", err)
	}
}

func TestParseGPUMap(t *testing.T) {
	m, err := ParseGPUMap(" GPU-00000000-0000-0000-0000-000000000001=GPU-00000000-0000-0000-0000-000000000002 ")
	if err != nil || m["gpu-00000000-0000-0000-0000-000000000001"] != "gpu-00000000-0000-0000-0000-000000000002" {
		t.Fatalf("%v, %v", m, err)
	}
	for _, bad := range []string{"x", "GPU-1=GPU-2", "GPU-00000000-0000-0000-0000-000000000001"} {
		if _, err := ParseGPUMap(bad); err == nil {
			t.Errorf("ParseGPUMap(%q) accepted", bad)
		}
	}
}
