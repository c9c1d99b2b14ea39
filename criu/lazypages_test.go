package criu

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// lpMap maps pages of private anonymous memory in this process, filled
// with random bytes; with prot PROT_NONE, they are then made inaccessible.
func lpMap(t *testing.T, pages int, prot int, seed uint64) ([]byte, uint64, []byte) {
	t.Helper()
	mem, err := unix.Mmap(-1, 0, pages*PageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(seed, seed))
	for i := range mem {
		mem[i] = byte(r.Uint32())
	}
	want := bytes.Clone(mem)
	if prot != unix.PROT_READ|unix.PROT_WRITE {
		if err := unix.Mprotect(mem, prot); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	return mem, uint64(uintptr(unsafe.Pointer(&mem[0]))), want
}

// pmEntry is a pagemap entry: pages pages at vaddr, flagged flags.
func pmEntry(vaddr uint64, pages, flags uint32) *PagemapEntry {
	return &PagemapEntry{Vaddr: proto.Uint64(vaddr), NrPages: proto.Uint32(pages), Flags: proto.Uint32(flags)}
}

// writeLazyDump writes, into a new directory, what a dump of pid with lazy
// pages leaves for CopyLazyPages: pm as its pagemap, and written as the
// pages image, the pages CRIU wrote.
func writeLazyDump(t *testing.T, pid int, pm *Pagemap, written []byte) string {
	t.Helper()
	dir := t.TempDir()
	if err := WritePagemap(filepath.Join(dir, fmt.Sprintf("pagemap-%d.img", pid)), pm); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("pages-%d.img", pm.PagesID)), written, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestCopyLazyPages builds the images of a lazy dump of this very process
// (a pagemap whose lazy entries point into memory it holds, some of it
// inaccessible, and a pages image with the pages "CRIU wrote"), and reads
// the complete image back in pieces of every size from several goroutines:
// it is CRIU's pages and the memory, in the pagemap's order; the pagemap
// now marks the lazy pages present.
func TestCopyLazyPages(t *testing.T) {
	_, buf, bufWant := lpMap(t, 8, unix.PROT_READ|unix.PROT_WRITE, 1)
	_, hidden, hiddenWant := lpMap(t, 2, unix.PROT_NONE, 2)
	written := make([]byte, 3*PageSize)
	for i := range written {
		written[i] = byte(i*7 + 3)
	}
	pid := os.Getpid()
	pm := &Pagemap{PagesID: 5, Entries: []*PagemapEntry{
		pmEntry(0x10000, 2, PagePresent),
		pmEntry(buf+PageSize, 3, PageLazy),
		pmEntry(0x40000, 1, 0), // no contents
		pmEntry(hidden, 2, PageLazy),
		pmEntry(0x50000, 1, PagePresent|PageLazy),
		pmEntry(buf+6*PageSize, 1, PageLazy),
	}}
	dir := writeLazyDump(t, pid, pm, written)
	pagemapPath := filepath.Join(dir, fmt.Sprintf("pagemap-%d.img", pid))
	c, err := CopyLazyPages(dir, pid)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want := bytes.Join([][]byte{written[:2*PageSize], bufWant[PageSize : 4*PageSize], hiddenWant, written[2*PageSize:], bufWant[6*PageSize : 7*PageSize]}, nil)
	if c.Name != "pages-5.img" || c.Written != filepath.Join(dir, "pages-5.img") {
		t.Errorf("Name %q, Written %q", c.Name, c.Written)
	}
	if c.Size() != int64(len(want)) || c.Lazy() != 6*PageSize {
		t.Fatalf("Size %d, Lazy %d; want %d and %d", c.Size(), c.Lazy(), len(want), 6*PageSize)
	}
	got := make([]byte, len(want))
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for off, piece := 0, 1; off < len(want); off, piece = off+piece, piece*3+100 {
		piece = min(piece, len(want)-off)
		wg.Add(1)
		go func(off, piece int) {
			defer wg.Done()
			errs <- c.ReadAt(got[off:off+piece], int64(off))
		}(off, piece)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got, want) {
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("the complete image differs first at byte %d (page %d)", i, i/PageSize)
			}
		}
	}
	if err := c.ReadAt(make([]byte, 10), c.Size()-5); err == nil {
		t.Error("a read past the image's end succeeded")
	}

	after, err := ReadPagemap(pagemapPath)
	if err != nil {
		t.Fatal(err)
	}
	wantFlags := []uint32{PagePresent, PagePresent | PageLazy, 0, PagePresent | PageLazy, PagePresent | PageLazy, PagePresent | PageLazy}
	for i, e := range after.Entries {
		if e.GetFlags() != wantFlags[i] || e.GetVaddr() != pm.Entries[i].GetVaddr() || e.GetNrPages() != pm.Entries[i].GetNrPages() {
			t.Errorf("entry %d after: %v; want flags %d", i, e, wantFlags[i])
		}
	}
}

// TestCopyLazyPagesRefuses: a pages image that does not hold what the
// pagemap says CRIU wrote, pages in a parent image, and a process that is
// gone are errors.
func TestCopyLazyPagesRefuses(t *testing.T) {
	_, buf, _ := lpMap(t, 2, unix.PROT_READ|unix.PROT_WRITE, 3)
	setup := func(t *testing.T, pid int, written int, entries ...*PagemapEntry) string {
		return writeLazyDump(t, pid, &Pagemap{PagesID: 1, Entries: entries}, make([]byte, written))
	}
	present := pmEntry(0x1000, 2, PagePresent)
	lazy := pmEntry(buf, 2, PageLazy)

	dir := setup(t, os.Getpid(), PageSize, present, lazy)
	if _, err := CopyLazyPages(dir, os.Getpid()); err == nil || !strings.Contains(err.Error(), "holds 4096 bytes; its pagemap lists 8192") {
		t.Errorf("short pages image: %v", err)
	}
	parent := pmEntry(0x9000, 1, PageInParent)
	dir = setup(t, os.Getpid(), 2*PageSize, present, parent)
	if _, err := CopyLazyPages(dir, os.Getpid()); err == nil || !strings.Contains(err.Error(), "parent image") {
		t.Errorf("pages in a parent image: %v", err)
	}
	if _, err := CopyLazyPages(t.TempDir(), os.Getpid()); err == nil {
		t.Error("no pagemap: no error")
	}

	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	gone := cmd.Process.Pid
	dir = setup(t, gone, 0, lazy)
	c, err := CopyLazyPages(dir, gone)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.ReadAt(make([]byte, PageSize), 0); err == nil || !strings.Contains(err.Error(), fmt.Sprint(gone)) {
		t.Errorf("reading a process that is gone: %v", err)
	}
}

// TestCopyLazyPagesClosedWhileRead: Close may come while a writer's
// workers still read (a failed checkpoint); their reads then fail, and
// nothing is left open.
func TestCopyLazyPagesClosedWhileRead(t *testing.T) {
	_, hidden, _ := lpMap(t, 64, unix.PROT_NONE, 4)
	pid := os.Getpid()
	dir := writeLazyDump(t, pid, &Pagemap{PagesID: 1, Entries: []*PagemapEntry{pmEntry(hidden, 64, PageLazy)}}, nil)
	c, err := CopyLazyPages(dir, pid)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				c.ReadAt(make([]byte, PageSize), int64(i*8*PageSize))
			}
		}()
	}
	c.Close()
	wg.Wait()
	if err := c.ReadAt(make([]byte, PageSize), 0); err == nil {
		t.Error("a read after Close succeeded")
	}
	if f := c.mem.mem; f != nil {
		if _, err := f.Stat(); err == nil {
			t.Error("/proc/PID/mem is still open after Close")
		}
	}
}

func TestLazyPagesFit(t *testing.T) {
	const gib = int64(1) << 30
	// The GPU machine: root without CAP_SYS_RESOURCE.
	device := pipeLimits{sysAdmin: true, hardFiles: 20000, nrOpen: 1 << 20, pipeMax: 1 << 20, userPages: 16384}
	root := device
	root.sysResource = true
	wider := device
	wider.pipeMax = 3 << 20 // pipes of 2 MiB: CRIU's doubling stops there
	quota := device
	quota.sysAdmin = false // past 64 MiB, pipes of two pages
	noQuota := quota
	noQuota.userPages = 0
	for _, c := range []struct {
		name   string
		limits pipeLimits
		mem    int64
		fit    bool
	}{
		{"8 GiB in 1 MiB pipes, 20000 files", device, 8 * gib, true},
		{"16 GiB in 1 MiB pipes, 20000 files", device, 16 * gib, false},
		// CRIU raises its limit to nr_open and grows its pipes to 3.2 MiB.
		{"16 GiB, CAP_SYS_RESOURCE", root, 16 * gib, true},
		{"1 TiB, CAP_SYS_RESOURCE", root, 1024 * gib, true},
		{"2 TiB, CAP_SYS_RESOURCE", root, 2048 * gib, false},
		{"16 GiB in 2 MiB pipes, 20000 files", wider, 16 * gib, true},
		{"32 GiB in 2 MiB pipes, 20000 files", wider, 32 * gib, false},
		{"no limit", pipeLimits{sysAdmin: true, hardFiles: unix.RLIM_INFINITY, pipeMax: 1 << 20}, 1024 * gib, true},
		// Without CAP_SYS_ADMIN either: 64 MiB in 64 pipes, then 8 KiB
		// pipes: 20000 descriptors take some 100 MiB.
		{"32 MiB within the user's pipe quota", quota, 32 << 20, true},
		{"1 GiB past the user's pipe quota", quota, gib, false},
		{"8 GiB, no pipe quota", noQuota, 8 * gib, true},
	} {
		if got := c.limits.fit(c.mem); got != c.fit {
			t.Errorf("%s: fit %v, want %v", c.name, got, c.fit)
		}
	}
}

// TestReadPipeLimits checks what readPipeLimits says of CAP_SYS_RESOURCE
// against the kernel: raising the hard open-file limit (below nr_open)
// works with it, and fails without it.
func TestReadPipeLimits(t *testing.T) {
	l := readPipeLimits()
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if l.hardFiles != lim.Max || l.nrOpen == 0 || l.pipeMax < PageSize {
		t.Fatalf("limits %+v (RLIMIT_NOFILE %+v)", l, lim)
	}
	if lim.Max == unix.RLIM_INFINITY || lim.Max >= l.nrOpen {
		t.Skipf("the hard limit (%d) cannot be raised here by anyone", lim.Max)
	}
	up := unix.Rlimit{Cur: lim.Cur, Max: lim.Max + 1}
	err := unix.Prlimit(0, unix.RLIMIT_NOFILE, &up, nil)
	if err == nil {
		defer unix.Prlimit(0, unix.RLIMIT_NOFILE, &lim, nil)
	}
	if raised := err == nil; raised != l.sysResource {
		t.Fatalf("readPipeLimits says CAP_SYS_RESOURCE %v; raising the hard limit: %v", l.sysResource, err)
	}
}

func TestLazyPagesCapacity(t *testing.T) {
	device := pipeLimits{sysAdmin: true, hardFiles: 20000, nrOpen: 1 << 20, pipeMax: 1 << 20, userPages: 16384}
	mem, pipe, files := device.capacity()
	// (20000 - 1024) / 2 pipes of 1 MiB.
	if want := int64(9488) << 20; pipe != 1<<20 || files != 20000 || mem < want-PageSize || mem > want {
		t.Errorf("the GPU machine's limits: %d bytes in pipes of %d, %d files; want about %d", mem, pipe, files, want)
	}
	if !device.fit(mem) || device.fit(mem+PageSize) {
		t.Errorf("capacity %d is not the edge of fit", mem)
	}
	root := device
	root.sysResource = true
	if _, pipe, files := root.capacity(); pipe != criuPipeMax*PageSize || files != 1<<20 {
		t.Errorf("with CAP_SYS_RESOURCE: pipes of %d, %d files", pipe, files)
	}
	if mem, _, _ := (pipeLimits{sysAdmin: true, hardFiles: unix.RLIM_INFINITY, pipeMax: 1 << 20}).capacity(); mem != math.MaxInt64 {
		t.Errorf("no limit: capacity %d", mem)
	}
}
