package restore

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stasis-ckpt/stasis/checkpoint"
	"github.com/stasis-ckpt/stasis/cuda"
	"github.com/stasis-ckpt/stasis/cuda/cudatest"
)

const standInUUID = "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f" // the stand-in driver's GPU 0

// standIn loads the stand-in driver with two GPUs.
func standIn(t *testing.T) *cuda.Driver {
	t.Helper()
	lib, err := cudatest.Build(t.TempDir())
	if err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	t.Setenv("STASIS_LIBCUDA", lib)
	t.Setenv("STASIS_FAKE_CUDA_DIR", dir)
	os.WriteFile(filepath.Join(dir, "devices"), []byte("2"), 0o600)
	drv, err := cuda.Load()
	if err != nil {
		t.Fatal(err)
	}
	return drv
}

func TestGPUPlan(t *testing.T) {
	drv := standIn(t)
	here, err := drv.Devices()
	if err != nil || len(here) != 2 || here[0].UUID != standInUUID {
		t.Fatalf("stand-in GPUs: %v, %v", here, err)
	}
	const other = "GPU-00000000-0000-0000-0000-000000000001"
	meta := func(devs ...cuda.Device) *checkpoint.GPUMeta {
		return &checkpoint.GPUMeta{DriverVersion: 13000, Devices: devs}
	}
	fake := func(i int, uuid string) cuda.Device { return cuda.Device{Index: i, Name: "Fake GPU", UUID: uuid} }
	plan := func(m *checkpoint.GPUMeta, gpuMap string) ([]cuda.GPUPair, []string, error) {
		t.Helper()
		gm, err := cuda.ParseGPUMap(gpuMap)
		if err != nil {
			t.Fatal(err)
		}
		return gpuPlan(m, drv, gm)
	}

	// The same GPUs: no pairs, nothing amiss.
	if pairs, mm, err := plan(meta(here...), ""); err != nil || pairs != nil || mm != nil {
		t.Fatalf("same GPUs: %v, %v, %v", pairs, mm, err)
	}
	// Another machine's GPU 0: remapped by index.
	pairs, mm, err := plan(meta(fake(0, other)), "")
	if err != nil || mm != nil || len(pairs) != 1 || cuda.FormatUUID(pairs[0].Old) != other || cuda.FormatUUID(pairs[0].New) != standInUUID {
		t.Fatalf("by index: %v, %v, %v", pairs, mm, err)
	}
	// GPU 0 of this machine onto GPU 1: the pairs swap the two.
	pairs, _, err = plan(meta(here...), "0=1")
	if err != nil || len(pairs) != 2 || cuda.FormatUUID(pairs[0].New) != here[1].UUID || cuda.FormatUUID(pairs[1].New) != here[0].UUID {
		t.Fatalf("0=1: %v, %v", pairs, err)
	}
	// A map to a GPU that is not here, and a checkpoint with more GPUs
	// than this machine: no plan.
	if _, _, err := plan(meta(here...), "0=7"); !errors.Is(err, cuda.ErrNoGPU) {
		t.Fatalf("map to a missing GPU: %v", err)
	}
	if _, _, err := plan(meta(fake(0, other), here[0], here[1]), ""); !errors.Is(err, cuda.ErrNoGPU) {
		t.Fatalf("three GPUs onto two: %v", err)
	}
	// Another model and another driver: both named.
	h100 := cuda.Device{Index: 0, Name: "NVIDIA H100", UUID: other}
	old := meta(h100)
	old.DriverVersion = 12080
	_, mm, err = plan(old, "")
	if err != nil || len(mm) != 2 || !strings.Contains(mm[0], "driver for CUDA 12.8, this one is for CUDA 13.0") || !strings.Contains(mm[1], "was a NVIDIA H100") {
		t.Fatalf("other model and driver: %q, %v", mm, err)
	}
}
