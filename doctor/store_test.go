package doctor

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stasis-ckpt/stasis/catalog"
	"golang.org/x/sys/unix"
)

func TestStoreMode0700(t *testing.T) {
	o := hermeticOptions(t)
	checks := runChecks(t, o)
	c := mustCheck(t, checks, "store")
	wantStatus(t, c, OK)
	wantDetail(t, c, o.StoreDir+": mode 0700, owner ")
	wantDetail(t, mustCheck(t, checks, "store free space"), " GiB free of ", " GiB on "+o.StoreDir)
}

func TestStoreMode0755(t *testing.T) {
	o := hermeticOptions(t)
	if err := os.Chmod(o.StoreDir, 0o755); err != nil {
		t.Fatal(err)
	}
	c := mustCheck(t, runChecks(t, o), "store")
	wantStatus(t, c, Warn)
	wantDetail(t, c, "mode 0755")
	if !strings.Contains(c.Hint, "chmod 700 "+o.StoreDir) {
		t.Errorf("hint %q", c.Hint)
	}
}

func TestStoreNotCreatedYet(t *testing.T) {
	o := hermeticOptions(t)
	parent := o.StoreDir
	o.StoreDir = filepath.Join(parent, "not", "yet")
	checks := runChecks(t, o)

	c := mustCheck(t, checks, "store")
	wantStatus(t, c, OK)
	wantDetail(t, c, o.StoreDir+" does not exist (will be created)", "nearest existing parent "+parent+": mode 0700")
	wantDetail(t, mustCheck(t, checks, "store free space"), "on "+parent+" (parent)")
	wantDetail(t, mustCheck(t, checks, "store o_direct"), parent+" (parent)")

	if _, err := os.Stat(filepath.Join(parent, "not")); !os.IsNotExist(err) {
		t.Errorf("doctor created part of the store: %v", err)
	}
	if entries, _ := os.ReadDir(parent); len(entries) != 0 {
		t.Errorf("doctor left files in %s: %v", parent, entries)
	}
}

func TestStoreParentNotWritable(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root may write anywhere, so the parent is always writable")
	}
	o := hermeticOptions(t)
	if err := os.Chmod(o.StoreDir, 0o500); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(o.StoreDir, 0o700) })
	o.StoreDir = filepath.Join(o.StoreDir, "sub")
	checks := runChecks(t, o)
	c := mustCheck(t, checks, "store")
	wantStatus(t, c, Warn)
	wantDetail(t, c, "parent not writable")
	od := mustCheck(t, checks, "store o_direct")
	wantStatus(t, od, Warn)
	wantDetail(t, od, "could not test O_DIRECT")
}

func TestStoreIsAFile(t *testing.T) {
	o := hermeticOptions(t)
	o.StoreDir = filepath.Join(t.TempDir(), "file")
	writeFile(t, o.StoreDir, "", 0o600)
	checks := runChecks(t, o)
	wantStatus(t, mustCheck(t, checks, "store"), Missing)
	if _, ok := checks["store o_direct"]; ok {
		t.Error("o_direct tested on a file")
	}
}

func TestStoreNotGiven(t *testing.T) {
	o := hermeticOptions(t)
	o.StoreDir = ""
	wantStatus(t, mustCheck(t, runChecks(t, o), "store"), Missing)
}

func TestStoreODirectOnTempDir(t *testing.T) {
	o := hermeticOptions(t)
	want := ddAcceptsODirect(t, o.StoreDir)
	c := mustCheck(t, runChecks(t, o), "store o_direct")
	checkODirectVerdict(t, c, want)
	if entries, _ := os.ReadDir(o.StoreDir); len(entries) != 0 {
		t.Errorf("test file left behind: %v", entries)
	}
}

// tmpfs refused O_DIRECT until Linux 6.6 and accepts it since, so the
// expected verdict comes from dd run against the same directory.
func TestStoreODirectOnDevShm(t *testing.T) {
	var fs unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &fs); err != nil || uint32(fs.Type) != unix.TMPFS_MAGIC {
		t.Skip("/dev/shm is not a tmpfs here")
	}
	dir, err := os.MkdirTemp("/dev/shm", "stasis-doctor-test-")
	if err != nil {
		t.Skipf("cannot write to /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o700)

	o := hermeticOptions(t)
	o.StoreDir = dir
	want := ddAcceptsODirect(t, dir)
	checks := runChecks(t, o)
	checkODirectVerdict(t, mustCheck(t, checks, "store o_direct"), want)
	wantDetail(t, mustCheck(t, checks, "store"), "tmpfs (in RAM: lost on reboot)")
	t.Logf("tmpfs O_DIRECT accepted by this kernel: %v", want)
}

// ramfs has no O_DIRECT support on any kernel, so the WARN path is
// exercised for real there.
func TestStoreODirectOnRamfs(t *testing.T) {
	dir := mountScratch(t, "ramfs", "mode=700")
	o := hermeticOptions(t)
	o.StoreDir = dir
	checks := runChecks(t, o)
	c := mustCheck(t, checks, "store o_direct")
	wantStatus(t, c, Warn)
	wantDetail(t, c, "no O_DIRECT (e.g. tmpfs): plain writes will be used", "invalid argument")
	wantDetail(t, mustCheck(t, checks, "store"), "ramfs")
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("test file left behind: %v", entries)
	}
}

func TestStoreFreeSpaceLow(t *testing.T) {
	dir := mountScratch(t, "tmpfs", "size=64m,mode=700")
	o := hermeticOptions(t)
	o.StoreDir = dir
	c := mustCheck(t, runChecks(t, o), "store free space")
	wantStatus(t, c, Warn)
	wantDetail(t, c, "0.1 GiB free of 0.1 GiB")
	if !strings.Contains(c.Hint, "10.0 GiB") {
		t.Errorf("hint %q", c.Hint)
	}
}

func TestStoreFreeSpaceMatchesDf(t *testing.T) {
	o := hermeticOptions(t)
	out, err := exec.Command("df", "-B1", "--output=avail", o.StoreDir).Output()
	if err != nil {
		t.Skipf("df: %v", err)
	}
	fields := strings.Fields(string(out))
	avail, err := strconv.ParseFloat(fields[len(fields)-1], 64)
	if err != nil {
		t.Skipf("unexpected df output %q", out)
	}
	c := mustCheck(t, runChecks(t, o), "store free space")
	got, err := strconv.ParseFloat(strings.Fields(c.Detail)[0], 64)
	if err != nil {
		t.Fatalf("detail %q", c.Detail)
	}
	if diff := got - avail/(1<<30); diff > 0.2 || diff < -0.2 {
		t.Errorf("doctor says %.1f GiB free, df says %.1f GiB", got, avail/(1<<30))
	}
	want := OK
	if avail < minFreeBytes {
		want = Warn
	}
	wantStatus(t, c, want)
}

func TestFormatGiB(t *testing.T) {
	for bytes, want := range map[uint64]string{0: "0.0 GiB", 10 << 30: "10.0 GiB", 3 << 29: "1.5 GiB", 1 << 40: "1024.0 GiB"} {
		if got := formatGiB(bytes); got != want {
			t.Errorf("formatGiB(%d) = %q, want %q", bytes, got, want)
		}
	}
}

func TestFileSystemName(t *testing.T) {
	if got := fileSystemName(0xef53); got != "ext2/3/4" {
		t.Errorf("ext4 magic: %q", got)
	}
	if got := fileSystemName(0x12345678); got != "file system 0x12345678" {
		t.Errorf("unknown magic: %q", got)
	}
}

// ddAcceptsODirect asks dd, independently of this package, whether dir takes
// an O_DIRECT write.
func ddAcceptsODirect(t *testing.T, dir string) bool {
	t.Helper()
	dd, err := exec.LookPath("dd")
	if err != nil {
		t.Skip("no dd to cross-check O_DIRECT with")
	}
	target := filepath.Join(dir, "dd-probe")
	defer os.Remove(target)
	err = exec.Command(dd, "if=/dev/zero", "of="+target, "bs=4096", "count=1", "oflag=direct").Run()
	return err == nil
}

func checkODirectVerdict(t *testing.T, c Check, accepted bool) {
	t.Helper()
	if accepted {
		wantStatus(t, c, OK)
		wantDetail(t, c, "O_DIRECT works")
		return
	}
	wantStatus(t, c, Warn)
	wantDetail(t, c, "no O_DIRECT")
}

func TestRAMScratchNamed(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(catalog.RAMScratchEnv, dir)
	c := ramScratchCheck()
	wantStatus(t, c, OK)
	wantDetail(t, c, dir+" ($"+catalog.RAMScratchEnv+")")
	t.Setenv(catalog.RAMScratchEnv, "")
	c = ramScratchCheck()
	if os.Geteuid() == 0 {
		wantStatus(t, c, OK)
		if !strings.HasPrefix(c.Detail, catalog.HugeRAMBase+": tmpfs with huge pages") {
			t.Errorf("as root: %q", c.Detail)
		}
	} else {
		wantStatus(t, c, Warn)
	}
}
