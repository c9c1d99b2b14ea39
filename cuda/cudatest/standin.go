// Package cudatest builds the stand-in NVIDIA driver
// (cuda/testdata/fakecuda/libcuda.c) and cuFile library (libcufile.c) for
// the tests of packages that move GPU memory, so that they run on machines
// without a GPU.
package cudatest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Build compiles the stand-in libcuda.so.1 into dir and returns its path.
func Build(dir string) (string, error) {
	return build(dir, "libcuda.c", "libcuda.so.1")
}

// BuildCuFile compiles the stand-in libcufile.so.0 into dir and returns its
// path.
func BuildCuFile(dir string) (string, error) {
	return build(dir, "libcufile.c", "libcufile.so.0")
}

func build(dir, source, name string) (string, error) {
	if _, err := exec.LookPath("gcc"); err != nil {
		return "", fmt.Errorf("gcc is needed to build the stand-in %s", name)
	}
	_, here, _, _ := runtime.Caller(0)
	src := filepath.Join(filepath.Dir(here), "..", "testdata", "fakecuda", source)
	lib := filepath.Join(dir, name)
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-o", lib, src).CombinedOutput(); err != nil {
		return "", fmt.Errorf("gcc: %v: %s", err, out)
	}
	return lib, nil
}

// Use builds the stand-ins into a new temporary directory, which also
// holds their state (STASIS_FAKE_CUDA_DIR), and points STASIS_LIBCUDA and
// STASIS_LIBCUFILE at them, for a TestMain. It returns the directory (""
// when the stand-ins could not be built; the reason is printed) and a
// function removing it.
func Use() (dir string, cleanup func()) {
	dir, err := os.MkdirTemp("", "stasis-fakecuda-")
	if err == nil {
		var lib, cufile string
		if lib, err = Build(dir); err == nil {
			cufile, err = BuildCuFile(dir)
		}
		if err == nil {
			os.Setenv("STASIS_LIBCUDA", lib)
			os.Setenv("STASIS_LIBCUFILE", cufile)
			os.Setenv("STASIS_FAKE_CUDA_DIR", dir)
			return dir, func() { os.RemoveAll(dir) }
		}
		os.RemoveAll(dir)
	}
	fmt.Fprintf(os.Stderr, "stand-in driver not built: %v\n", err)
	return "", func() {}
}

// DeviceMemory returns n bytes outside Go's heap, unmapped when the test
// ends: the stand-in's "device memory", whose pointers are host addresses.
func DeviceMemory(t testing.TB, n int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

// Pointer is b's address as the stand-in's device pointer.
func Pointer(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

// Switch turns one of the stand-ins' switches (fail-cufile-handle,
// cufile-gds, ...) on, with its content, until the test ends.
func Switch(t testing.TB, dir, name, content string) {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(path) })
}

// Calls counts the stand-in's calls logged in dir/calls.log by name
// ("register", "unregister", "lock", ...).
func Calls(dir string) map[string]int {
	data, _ := os.ReadFile(filepath.Join(dir, "calls.log"))
	count := map[string]int{}
	for _, line := range strings.Split(string(data), "\n") {
		if name, _, ok := strings.Cut(line, " "); ok {
			count[name]++
		}
	}
	return count
}
