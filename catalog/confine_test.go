package catalog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// victim makes a directory outside the store holding files a planted
// link would have stasis delete, and returns it with a check that it is
// intact.
func victim(t *testing.T) (string, func()) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "victim")
	for _, p := range []string{"sub/deep", "other"} {
		if err := os.MkdirAll(filepath.Join(dir, p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p, "precious"), []byte("keep me"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir, func() {
		t.Helper()
		for _, p := range []string{"sub/deep", "other"} {
			if got, err := os.ReadFile(filepath.Join(dir, p, "precious")); err != nil || string(got) != "keep me" {
				t.Fatalf("%s/%s/precious outside the store: %q, %v", dir, p, got, err)
			}
		}
	}
}

// plant replaces the store's structural directory name by a link to to.
func plant(t *testing.T, s *Store, name, to string) {
	t.Helper()
	if err := os.RemoveAll(s.path(name)); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(to, s.path(name)); err != nil {
		t.Fatal(err)
	}
}

func TestOpenRefusesAStoreNotItsUsersAlone(t *testing.T) {
	s := mustStore(t)
	if err := os.Chmod(s.Root, 0o777); err != nil {
		t.Fatal(err)
	}
	_, err := Open(s.Root, Options{})
	if !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "chmod go-w "+s.Root) || !strings.Contains(err.Error(), "mode 0777") {
		t.Fatalf("Open of a world-writable store: %v", err)
	}
	if _, err := Open(s.Root, Options{AllowUnsafe: true}); err != nil {
		t.Fatalf("Open with AllowUnsafe: %v", err)
	}
	t.Setenv(AllowUnsafeEnv, "1")
	if _, err := Open(s.Root, Options{}); err != nil {
		t.Fatalf("Open with %s: %v", AllowUnsafeEnv, err)
	}
	t.Setenv(AllowUnsafeEnv, "")
	os.Chmod(s.Root, 0o700)
	// A group-writable catalog.db.
	os.Chmod(s.path(indexName), 0o620)
	if _, err := Open(s.Root, Options{}); !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "chmod go-w "+s.path(indexName)) {
		t.Fatalf("Open with a group-writable catalog.db: %v", err)
	}
	os.Chmod(s.path(indexName), 0o600)
	if os.Geteuid() == 0 {
		if err := os.Chown(s.Root, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		_, err := Open(s.Root, Options{})
		if !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "belongs to uid 65534") || !strings.Contains(err.Error(), "chown 0 "+s.Root) {
			t.Fatalf("Open of another user's store: %v", err)
		}
		os.Chown(s.Root, 0, 0)
	}
	// A link in the structure is refused, allowed or not.
	dir, intact := victim(t)
	plant(t, s, trashDir, dir)
	for _, o := range []Options{{}, {AllowUnsafe: true}} {
		_, err := Open(s.Root, o)
		if !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "is a symbolic link (to "+dir+")") {
			t.Fatalf("Open with trash/ a link (%+v): %v", o, err)
		}
	}
	intact()
}

// TestRemovalsFollowNoLink plants links as trash/, staging/ and scratch/
// after the store was opened (as someone who may write it would, between
// two checks) and runs gc and rm: nothing outside the store is deleted,
// and the link is named.
func TestRemovalsFollowNoLink(t *testing.T) {
	for _, name := range []string{trashDir, stagingDir, scratchDir} {
		t.Run(name, func(t *testing.T) {
			s := mustStore(t)
			rec, err := commitData(s, KindFiles, "links", 1, testData(100<<10, 1))
			if err != nil {
				t.Fatal(err)
			}
			dir, _ := victim(t)
			// What gc would take for leftovers: a staging directory
			// nobody holds, a removal's leftover, a dead scratch.
			os.WriteFile(filepath.Join(dir, "sub.lock"), nil, 0o600)
			os.WriteFile(filepath.Join(dir, "sub", scratchLock), nil, 0o600)
			os.Rename(filepath.Join(dir, "sub"), filepath.Join(dir, scratchPrefix+"sub"))
			os.WriteFile(filepath.Join(dir, scratchPrefix+"sub", scratchLock), nil, 0o600)
			plant(t, s, name, dir)
			if _, err := s.GC(); !errors.Is(err, ErrUnsafe) {
				t.Errorf("GC with %s a link: %v", name, err)
			}
			if err := s.Remove(rec.ID); name == trashDir && !errors.Is(err, ErrUnsafe) {
				t.Errorf("Remove with trash/ a link: %v", err)
			}
			if got, _ := os.ReadFile(filepath.Join(dir, scratchPrefix+"sub", "deep", "precious")); string(got) != "keep me" {
				t.Fatalf("%s/%ssub/deep/precious: %q", dir, scratchPrefix, got)
			}
			if got, _ := os.ReadFile(filepath.Join(dir, "other", "precious")); string(got) != "keep me" {
				t.Fatalf("%s/other/precious: %q", dir, got)
			}
		})
	}
}

// TestGCLeavesOtherStoresRAMScratch kills processes of two stores that
// hold scratch directories in a shared RAM place: each store's gc
// removes its own and leaves the other's, and leaves a directory of
// that place that names no store (an older stasis's, or anyone's).
func TestGCLeavesOtherStoresRAMScratch(t *testing.T) {
	var fs unix.Statfs_t
	if unix.Statfs(SharedRAMBase, &fs) != nil || fs.Type != unix.TMPFS_MAGIC {
		t.Skipf("%s is not a tmpfs", SharedRAMBase)
	}
	base, err := os.MkdirTemp(SharedRAMBase, "stasis-test-ram-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	t.Setenv(RAMScratchEnv, base)
	a, b := mustStore(t), mustStore(t)
	cmd, ofA := startHelper(t, "scratch-hold-ram", a.Root)
	killHelper(t, cmd)
	cmd, ofB := startHelper(t, "scratch-hold-ram", b.Root)
	killHelper(t, cmd)
	if filepath.Dir(ofA) != base || filepath.Dir(ofB) != base {
		t.Fatalf("scratch directories at %s and %s, not in %s", ofA, ofB, base)
	}
	unnamed := filepath.Join(base, scratchPrefix+"unnamed")
	os.Mkdir(unnamed, 0o700)
	os.WriteFile(filepath.Join(unnamed, scratchLock), nil, 0o600)

	rep, err := a.GC()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(rep.ScratchRemoved, ofA) || slices.Contains(rep.ScratchRemoved, ofB) || slices.Contains(rep.ScratchRemoved, unnamed) {
		t.Fatalf("store A's gc removed %v; want %s only", rep.ScratchRemoved, ofA)
	}
	for _, d := range []string{ofB, unnamed} {
		if _, err := os.Stat(d); err != nil {
			t.Fatalf("store A's gc removed %s: %v", d, err)
		}
	}
	rep, err = b.GC()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(rep.ScratchRemoved, ofB) {
		t.Fatalf("store B's gc removed %v; want %s", rep.ScratchRemoved, ofB)
	}
	if _, err := os.Stat(unnamed); err != nil {
		t.Fatalf("gc removed %s: %v", unnamed, err)
	}
}

// TestKeepLogFollowsNoLink: with logs/ a link to a folder of many files,
// keeping a log neither writes there nor prunes the folder to the newest
// 20.
func TestKeepLogFollowsNoLink(t *testing.T) {
	s := mustStore(t)
	dir := filepath.Join(t.TempDir(), "victim")
	os.Mkdir(dir, 0o700)
	for i := range keepLogs + 5 {
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("%02d-file", i)), []byte("keep"), 0o600)
	}
	src := filepath.Join(t.TempDir(), "criu.log")
	os.WriteFile(src, []byte("log"), 0o600)
	if _, err := s.KeepLog(src, "criu.log"); err != nil {
		t.Fatal(err)
	}
	plant(t, s, logsDir, dir)
	if _, err := s.KeepLog(src, "criu.log"); !errors.Is(err, ErrUnsafe) {
		t.Errorf("KeepLog with logs/ a link: %v", err)
	}
	if got := dirNames(t, dir); len(got) != keepLogs+5 {
		t.Fatalf("the folder logs/ links to holds %d files, had %d: %v", len(got), keepLogs+5, got)
	}
}
