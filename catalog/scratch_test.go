package catalog

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// mountsAt lists the mount options of each mount at dir, from mountinfo.
func mountsAt(t *testing.T, dir string) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var opts []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == dir {
			opts = append(opts, line[strings.Index(line, " - ")+3:])
		}
	}
	return opts
}

func TestMountHugeRAMOnceWithHugePages(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := filepath.Join(t.TempDir(), "ram")
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	if isMountPoint(dir) {
		t.Fatal("a fresh directory is taken for a mount point")
	}
	for i := 0; i < 2; i++ {
		if err := mountHugeRAM(dir); err != nil {
			t.Fatalf("mount %d: %v", i, err)
		}
	}
	mounts := mountsAt(t, dir)
	if len(mounts) != 1 {
		t.Fatalf("%d mounts at %s after two calls, want 1: %q", len(mounts), dir, mounts)
	}
	if !strings.HasPrefix(mounts[0], "tmpfs ") || !strings.Contains(mounts[0], "huge=always") {
		t.Errorf("mount at %s: %q, want a tmpfs with huge=always", dir, mounts[0])
	}
	if !isMountPoint(dir) {
		t.Error("the mounted tmpfs is not taken for a mount point")
	}
	// nosuid and nodev, but not noexec: CRIU's action script runs there.
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Flags&unix.ST_NOSUID == 0 || fs.Flags&unix.ST_NODEV == 0 || fs.Flags&unix.ST_NOEXEC != 0 {
		t.Errorf("mount flags %#x at %s: want nosuid and nodev, not noexec", fs.Flags, dir)
	}
	// A file written there takes huge pages, as far as the kernel has
	// them to give (a machine short of contiguous memory may not): logged.
	before := meminfo("ShmemHugePages")
	if err := os.WriteFile(filepath.Join(dir, "f"), make([]byte, 8<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Logf("writing 8 MiB there took %d MiB more of huge pages", (meminfo("ShmemHugePages")-before)>>20)
}

func TestRAMScratchBase(t *testing.T) {
	base := RAMScratchBase()
	var fs unix.Statfs_t
	if err := unix.Statfs(base, &fs); err != nil || fs.Type != unix.TMPFS_MAGIC {
		t.Fatalf("RAM scratch base %s is not a tmpfs (%v)", base, err)
	}
	switch {
	case os.Getenv(RAMScratchEnv) != "":
		if base != os.Getenv(RAMScratchEnv) {
			t.Errorf("RAM scratch base %s, want $%s", base, RAMScratchEnv)
		}
	case os.Geteuid() == 0:
		if base != HugeRAMBase {
			t.Errorf("RAM scratch base %s as root, want %s", base, HugeRAMBase)
		}
	default:
		if base != SharedRAMBase {
			t.Errorf("RAM scratch base %s, want %s", base, SharedRAMBase)
		}
	}
	s := mustStore(t)
	sc, err := s.NewScratch("test", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Remove()
	if !sc.InRAM() || filepath.Dir(sc.Dir) != base {
		t.Errorf("scratch %s (in RAM: %v), want one in %s", sc.Dir, sc.InRAM(), base)
	}
}
