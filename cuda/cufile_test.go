package cuda

import (
	"bytes"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stasis-ckpt/stasis/cuda/cudatest"
	"golang.org/x/sys/unix"
)

// standIn loads the stand-in libcuda with its state in a fresh directory
// and returns it, the directory and the primary context.
func standIn(t *testing.T) (*Driver, string, Context) {
	t.Helper()
	d, err := load(buildLib(t, "testdata/fakecuda/libcuda.c", ""))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	t.Setenv("STASIS_FAKE_CUDA_DIR", dir)
	ctx, err := d.PrimaryContext(0)
	if err != nil {
		t.Fatal(err)
	}
	return d, dir, ctx
}

// TestCRC32CWithStandIn runs the checksum kernel's plumbing (module load,
// launch, copy of the block checksums, joining) against the stand-in
// driver, which runs the kernel on the host: the result is hash/crc32's.
func TestCRC32CWithStandIn(t *testing.T) {
	d, dir, ctx := standIn(t)
	k, err := d.NewCRC32C(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	mem := cudatest.DeviceMemory(t, 5<<20)
	r := rand.New(rand.NewPCG(5, 6))
	for i := range mem {
		mem[i] = byte(r.Uint32())
	}
	for _, c := range []struct{ off, n int }{{0, 4 << 20}, {1, 4097}, {3, 1}, {8, 3*4096 + 5}, {0, 5 << 20}, {100, 0}} {
		got, err := k.Checksum(cudatest.Pointer(mem)+uintptr(c.off), int64(c.n))
		if want := crc32.Checksum(mem[c.off:c.off+c.n], castagnoli); err != nil || got != want {
			t.Errorf("%d bytes at +%d: %08x, %v; want %08x", c.n, c.off, got, err, want)
		}
	}
	cudatest.Switch(t, dir, "fail-launch", "")
	if _, err := k.Checksum(cudatest.Pointer(mem), 4096); err == nil || !strings.Contains(err.Error(), "cuLaunchKernel(stasis_crc32c_blocks): CUDA_ERROR_UNKNOWN") {
		t.Errorf("failing launch: %v", err)
	}
	k.Close()
	calls := cudatest.Calls(dir)
	if calls["module-load"] != 1 || calls["module-unload"] != 1 || calls["stream-create"] != 2 || calls["stream-destroy"] != 2 {
		t.Errorf("calls %v", calls)
	}

	// A PTX image without the kernel is refused by the driver.
	ptx := filepath.Join(t.TempDir(), "other.ptx")
	os.WriteFile(ptx, []byte(".version 8.0\n.target sm_80\n"), 0o600)
	t.Setenv(PTXEnv, ptx)
	if _, err := d.NewCRC32C(ctx, 1); err == nil || !strings.Contains(err.Error(), "cuModuleLoadData: CUDA_ERROR_INVALID_IMAGE") {
		t.Errorf("PTX without the kernel: %v", err)
	}
}

// TestEmbeddedPTX checks that the built-in PTX holds the kernel the
// binding launches, for the instruction set it was generated for.
func TestEmbeddedPTX(t *testing.T) {
	for _, want := range []string{".entry " + crc32cKernel, ".target sm_80", "Generated from crc32c.cu"} {
		if !bytes.Contains(crc32cPTX, []byte(want)) {
			t.Errorf("kernels/crc32c.ptx lacks %q", want)
		}
	}
}

// TestCuFileWithStandIn drives the cuFile binding through the stand-in
// libcufile: version, mode, a file written from and read into "device
// memory", and refusals named with cuFile's error number.
func TestCuFileWithStandIn(t *testing.T) {
	d, dir, ctx := standIn(t)
	lib, err := cudatest.BuildCuFile(t.TempDir())
	if err != nil {
		t.Skip(err)
	}
	f, err := openCuFile(d, []string{lib})
	if err != nil {
		t.Fatal(err)
	}
	if f.Version != 1150 || f.VersionString() != "1.15" || f.GDS || !strings.Contains(f.ModeWhy, "nvidia-fs is not loaded") {
		t.Errorf("version %d (%s), GDS %v: %s", f.Version, f.VersionString(), f.GDS, f.ModeWhy)
	}
	cudatest.Switch(t, dir, "cufile-gds", "")
	if gds, why := f.mode(); !gds || why != "GPUDirect Storage: nvidia-fs 2.26" {
		t.Errorf("with nvidia-fs: %v, %s", gds, why)
	}
	t.Setenv("CUFILE_FORCE_COMPAT_MODE", "true")
	if gds, why := f.mode(); gds || !strings.Contains(why, "CUFILE_FORCE_COMPAT_MODE=true") {
		t.Errorf("forced compat mode: %v, %s", gds, why)
	}

	path := filepath.Join(t.TempDir(), "data")
	file, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_DIRECT, 0o600)
	if err != nil {
		file, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	h, err := f.RegisterFile(ctx, int(file.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	mem := cudatest.DeviceMemory(t, 3*4096)
	for i := range mem {
		mem[i] = byte(i * 7)
	}
	base := cudatest.Pointer(mem)
	if err := f.RegisterBuffer(ctx, base, int64(len(mem))); err != nil {
		t.Fatal(err)
	}
	if err := h.Write(ctx, base, 4096, 8192, 4096); err != nil {
		t.Fatal(err)
	}
	back := cudatest.DeviceMemory(t, 8192)
	if err := h.Read(ctx, cudatest.Pointer(back), 0, 8192, 4096); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back, mem[4096:]) {
		t.Error("bytes read back differ")
	}
	cudatest.Switch(t, dir, "fail-cufile-write", "0")
	var fe *CuFileError
	if err := h.Write(ctx, base, 0, 4096, 0); !errors.As(err, &fe) || err.Error() != "cuFileWrite failed: CUDA Driver API error (cuFile error 5011)" {
		t.Errorf("failing write: %v", err)
	}
	f.DeregisterBuffer(ctx, base)
	h.Close()
	cudatest.Switch(t, dir, "fail-cufile-handle", "")
	if _, err := f.RegisterFile(ctx, int(file.Fd())); err == nil || err.Error() != "cuFileHandleRegister failed: udev property not found (cuFile error 5027)" {
		t.Errorf("refused registration: %v", err)
	}
	calls := cudatest.Calls(dir)
	if calls["cufile-handle-register"] != 1 || calls["cufile-handle-deregister"] != 1 || calls["cufile-buf-register"] != calls["cufile-buf-deregister"] {
		t.Errorf("calls %v", calls)
	}

	if _, err := openCuFile(d, []string{filepath.Join(t.TempDir(), "libcufile.so.0")}); err == nil || !strings.Contains(err.Error(), "cannot load it") {
		t.Errorf("a missing $STASIS_LIBCUFILE: %v", err)
	}
	if _, err := openCuFile(d, []string{"/nonexistent/libcufile.so.0", "libstasis-no-such-lib.so.0"}); err == nil || !strings.HasPrefix(err.Error(), "libcufile.so.0 not found") {
		t.Errorf("no libcufile: %v", err)
	}
	if _, err := openCuFile(d, []string{buildLib(t, "testdata/fakecuda/libcuda.c", "")}); err == nil || !strings.Contains(err.Error(), "lacks cuFileBufDeregister") {
		t.Errorf("a library that is not libcufile: %v", err)
	}
}
