package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestUsedFiles(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	open, err := os.Create(filepath.Join(dir, "open-file"))
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	tree, err := Tree(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// A device (as /dev/null is every `stasis run` job's stdin), a pipe
	// and a shared writable mapping (a NumPy memmap).
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	memmap := filepath.Join(dir, "memmap")
	if err := os.WriteFile(memmap, make([]byte, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	mf, err := os.OpenFile(memmap, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer mf.Close()
	region, err := unix.Mmap(int(mf.Fd()), 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(region)
	tree, err = Tree(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	files, shared, mounts := usedFiles(tree[:1])
	if !shared[memmap] || shared[self] {
		t.Errorf("shared writable mappings %v, want %s and not %s", shared, memmap, self)
	}
	for _, m := range mounts {
		if PseudoFS(m.FSType) || m.MountPoint == "/dev" {
			t.Errorf("mount %+v recorded (the tree has /dev/null and a pipe open)", m)
		}
	}
	if !slices.Contains(files, self) {
		t.Errorf("the test binary %s is not among the files it maps: %v", self, files)
	}
	if slices.Contains(files, filepath.Join(dir, "open-file")) {
		t.Error("an open file that is not mapped is listed as mapped")
	}
	here := MountsHere()
	for _, path := range []string{self, dir, "/"} {
		m, ok := mountOf(here, path)
		if !ok || !slices.Contains(mounts, m) {
			t.Errorf("the mount of %s (%+v) is not among %+v", path, m, mounts)
		}
	}
	if !slices.IsSortedFunc(mounts, func(a, b Mount) int { return strings.Compare(a.MountPoint, b.MountPoint) }) || !slices.IsSorted(files) {
		t.Error("not sorted")
	}
}

func TestMountinfo(t *testing.T) {
	info := filepath.Join(t.TempDir(), "mountinfo")
	os.WriteFile(info, []byte(`22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:25 / /data rw shared:7 - nfs4 srv:/export rw
31 22 0:26 / /data/my\040dir rw - tmpfs tmp\134fs rw
32 30 0:27 / /data rw - overlay overlay rw
garbage line
`), 0o600)
	table := readMountinfo(info)
	if len(table) != 4 || table[2].MountPoint != "/data/my dir" || table[2].Source != `tmp\fs` {
		t.Fatalf("parsed %+v", table)
	}
	for path, want := range map[string]string{
		"/usr/lib/libc.so.6":      "ext4",
		"/data/x":                 "overlay", // the later mount on /data is on top
		"/data/my dir/f":          "tmpfs",
		"/data/my dirt":           "overlay",
		"/":                       "ext4",
		"/dataset/not-under-data": "ext4",
	} {
		if m, ok := mountOf(table, path); !ok || m.FSType != want {
			t.Errorf("mount of %s: %+v, want %s", path, m, want)
		}
	}
	if m, ok := MountAt(table, "/data"); !ok || m.FSType != "overlay" {
		t.Errorf("MountAt /data: %+v", m)
	}
	if _, ok := MountAt(table, "/data/x"); ok {
		t.Error("MountAt found a mount where there is none")
	}
}

func TestHasher(t *testing.T) {
	dir, cache := t.TempDir(), filepath.Join(t.TempDir(), "cache")
	h := NewHasher(cache)
	lib := filepath.Join(dir, "libx.so")
	os.WriteFile(lib, []byte("version 1"), 0o755)
	sum := func(s string) string { b := sha256.Sum256([]byte(s)); return hex.EncodeToString(b[:]) }

	got, err := h.File(lib)
	if err != nil || got.SHA256 != sum("version 1") || got.Size != 9 {
		t.Fatalf("File: %+v, %v", got, err)
	}
	entries, _ := os.ReadDir(cache)
	if len(entries) != 1 {
		t.Fatalf("cache holds %d entries, want 1", len(entries))
	}
	// The cached hash is served as long as the file is unchanged: plant
	// another one to see it used.
	planted := strings.Repeat("7", 64)
	os.WriteFile(filepath.Join(cache, entries[0].Name()), []byte(planted), 0o600)
	if got, _ := h.File(lib); got.SHA256 != planted {
		t.Fatalf("the cache was not used: %s", got.SHA256)
	}
	// A changed file (same size) is hashed again.
	os.WriteFile(lib, []byte("version 2"), 0o755)
	if got, _ := h.File(lib); got.SHA256 != sum("version 2") {
		t.Fatalf("a changed file kept its old hash: %s", got.SHA256)
	}
	// A damaged cache entry is ignored.
	entries, _ = os.ReadDir(cache)
	for _, e := range entries {
		os.WriteFile(filepath.Join(cache, e.Name()), []byte("not a hash"), 0o600)
	}
	if got, _ := h.File(lib); got.SHA256 != sum("version 2") {
		t.Fatalf("a damaged cache entry was used: %s", got.SHA256)
	}

	// Describe keeps the order given and leaves out what is gone or not a
	// regular file.
	other := filepath.Join(dir, "other")
	os.WriteFile(other, []byte("o"), 0o600)
	described := h.Describe([]string{other, filepath.Join(dir, "gone"), dir, lib})
	if len(described) != 2 || described[0].Path != other || described[1].Path != lib || described[1].SHA256 != sum("version 2") {
		t.Fatalf("Describe: %+v", described)
	}
	// Without a cache directory it still hashes.
	if got, err := NewHasher("").File(other); err != nil || got.SHA256 != sum("o") {
		t.Fatalf("no cache: %+v, %v", got, err)
	}
}
