package doctor

import (
	"context"
	"github.com/stasis-ckpt/stasis/cuda"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// hermeticOptions returns Options that look only inside t's temp dirs: no
// libraries, no CRIU, empty /proc and /sys trees, and a 0700 store.
func hermeticOptions(t *testing.T) Options {
	t.Helper()
	t.Setenv("CUFILE_FORCE_COMPAT_MODE", "")
	root := t.TempDir()
	o := Options{
		StoreDir:         filepath.Join(root, "store"),
		CRIUPath:         filepath.Join(root, "no-criu-here"),
		LibDirs:          []string{mkdir(t, root, "lib")},
		NoDefaultLibDirs: true,
		ProcRoot:         mkdir(t, root, "proc"),
		SysRoot:          mkdir(t, root, "sys"),
		CuFileConfig:     filepath.Join(root, "cufile.json"),
		AutoChoice: func() (string, string, *cuda.CuFile) {
			return "pinned", "a stand-in's reason", nil
		},
	}
	if err := os.Mkdir(o.StoreDir, 0o700); err != nil {
		t.Fatal(err)
	}
	return o
}

func mkdir(t *testing.T, parts ...string) string {
	t.Helper()
	dir := filepath.Join(parts...)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func writeFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	mkdir(t, filepath.Dir(path))
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

// runChecks runs every check and indexes the results by name.
func runChecks(t *testing.T, o Options) map[string]Check {
	t.Helper()
	byName := map[string]Check{}
	for _, c := range Run(context.Background(), o) {
		if _, dup := byName[c.Name]; dup {
			t.Fatalf("check %q reported twice", c.Name)
		}
		byName[c.Name] = c
	}
	return byName
}

func mustCheck(t *testing.T, checks map[string]Check, name string) Check {
	t.Helper()
	c, ok := checks[name]
	if !ok {
		t.Fatalf("no %q check; got %v", name, checks)
	}
	return c
}

func wantStatus(t *testing.T, c Check, want Status) {
	t.Helper()
	if c.Status != want {
		t.Fatalf("%s: status %s, want %s (detail %q, hint %q)", c.Name, c.Status, want, c.Detail, c.Hint)
	}
}

func wantDetail(t *testing.T, c Check, substrings ...string) {
	t.Helper()
	for _, s := range substrings {
		if !strings.Contains(c.Detail, s) {
			t.Errorf("%s: detail %q lacks %q", c.Name, c.Detail, s)
		}
	}
}

// buildSharedLib compiles C source into a shared library at path with gcc.
func buildSharedLib(t *testing.T, path, source string) {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc is not installed; it is needed to build test libraries")
	}
	src := filepath.Join(t.TempDir(), "lib.c")
	writeFile(t, src, source, 0o644)
	mkdir(t, filepath.Dir(path))
	if out, err := exec.Command(gcc, "-shared", "-fPIC", "-o", path, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
}

// cFunctions returns C source defining trivial functions with these names.
func cFunctions(names ...string) string {
	var b strings.Builder
	for _, name := range names {
		b.WriteString("int " + name + "(void) { return 0; }\n")
	}
	return b.String()
}

// mountScratch mounts a fresh file system of the given type on a temp dir,
// for tests that need a file system this machine may not otherwise have.
func mountScratch(t *testing.T, fsType, data string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("mounting %s needs root", fsType)
	}
	dir := t.TempDir()
	if err := unix.Mount(fsType, dir, fsType, 0, data); err != nil {
		t.Skipf("cannot mount %s here: %v", fsType, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}
