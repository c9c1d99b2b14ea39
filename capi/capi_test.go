package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// The C ABI is tested from outside, as its users see it: libstasis.so is
// built with -buildmode=c-shared, then a C program (testdata/roundtrip.c)
// and the Python package's tests (python/tests, with NumPy) run against
// it.

var libDir string // holds libstasis.so; "" when it could not be built

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "stasis-capi-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	out, err := exec.Command("go", "build", "-buildmode=c-shared", "-o", filepath.Join(dir, "libstasis.so"), ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "building libstasis.so: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	libDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func TestCProgram(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("needs gcc to build the C test program")
	}
	prog := filepath.Join(t.TempDir(), "roundtrip")
	if out, err := exec.Command("gcc", "-Wall", "-Werror", "-I.", "-o", prog, "testdata/roundtrip.c",
		"-L"+libDir, "-lstasis", "-Wl,-rpath,"+libDir).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	out, err := exec.Command(prog, filepath.Join(t.TempDir(), "store")).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("%s", out)
}

// TestPython runs the Python package's tests with Debian's Python and
// NumPy (/usr/bin/python3; `make` installs python3-numpy).
func TestPython(t *testing.T) {
	python := "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		t.Skip("needs /usr/bin/python3 (make installs it)")
	}
	if err := exec.Command(python, "-c", "import numpy").Run(); err != nil {
		t.Skip("needs NumPy for /usr/bin/python3 (make installs python3-numpy)")
	}
	cmd := exec.Command(python, "-m", "unittest", "discover", "-v", "-s", "tests")
	cmd.Dir = "../python"
	pkg, _ := filepath.Abs("../python")
	cmd.Env = append(os.Environ(), "STASIS_LIB="+filepath.Join(libDir, "libstasis.so"), "PYTHONPATH="+pkg, "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("%s", out)
}
