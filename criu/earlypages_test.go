package criu

import (
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestLocate: a run is found in the complete image where CRIU listed its
// pages lazily one after the other, across pagemap entries and segments
// cut at other places; a page CRIU wrote inside it, a page missing from
// it, or an image that ends too soon, is reported.
func TestLocate(t *testing.T) {
	const base = 0x7f0000000000
	page := func(n int) uint64 { return base + uint64(n)*PageSize }
	seg := func(from, pages int) Segment { return Segment{Vaddr: page(from), Len: int64(pages) * PageSize} }
	copyOf := func(entries ...*PagemapEntry) *PageCopy {
		t.Helper()
		pid := os.Getpid()
		written := 0
		for _, e := range entries {
			if Present(e) {
				written += int(e.GetNrPages()) * PageSize
			}
		}
		dir := writeLazyDump(t, pid, &Pagemap{PagesID: 1, Entries: entries}, make([]byte, written))
		c, err := CopyLazyPages(dir, pid)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// Image: 2 written pages, lazy 10-13, lazy 20-24 (a hole in between),
	// 1 written page, lazy 30-31.
	c := copyOf(pmEntry(page(0), 2, PagePresent), pmEntry(page(10), 4, PageLazy), pmEntry(page(20), 5, PageLazy),
		pmEntry(page(26), 1, PagePresent), pmEntry(page(30), 2, PageLazy))
	run := LazyRun{Segments: []Segment{seg(11, 2), seg(13, 1), seg(20, 3), seg(23, 2)}, Size: 8 * PageSize}
	at, err := c.Locate(run, run.Size)
	if err != nil || at != 3*PageSize {
		t.Fatalf("Locate = %d, %v; want %d", at, err, 3*PageSize)
	}
	if at, err := c.Locate(run, 2*PageSize); err != nil || at != 3*PageSize {
		t.Errorf("Locate of the first two pages = %d, %v", at, err)
	}
	for _, tc := range []struct {
		name string
		run  LazyRun
		want string
	}{
		{"across a written page", LazyRun{Segments: []Segment{seg(23, 2), seg(30, 2)}, Size: 4 * PageSize}, "a page CRIU wrote"},
		{"a page CRIU left out", LazyRun{Segments: []Segment{seg(12, 3)}, Size: 3 * PageSize}, "expected"},
		{"not lazy", LazyRun{Segments: []Segment{seg(0, 1)}, Size: PageSize}, "did not list"},
		{"past the end", LazyRun{Segments: []Segment{seg(30, 3)}, Size: 3 * PageSize}, "ends"},
	} {
		if _, err := c.Locate(tc.run, tc.run.Size); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Locate = %v, want an error with %q", tc.name, err, tc.want)
		}
	}
}

// TestPredictLazyRun reads this process's own memory map: 16 MiB of
// touched private anonymous memory lies inside a predicted run (none is
// longer than PredictLazyRun's), and
// pages only read (the zero page), or never touched, of a mapping right
// after it are not in it.
func TestPredictLazyRun(t *testing.T) {
	if _, err := zeroPFN(); err != nil {
		t.Skipf("needs page frame numbers (root): %v", err)
	}
	const pages = 4096
	mem, err := unix.Mmap(-1, 0, (pages+64)*PageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	for i := 0; i < pages*PageSize; i += PageSize {
		mem[i] = byte(i/PageSize) | 1
	}
	sum := 0
	for i := pages * PageSize; i < len(mem); i += 2 * PageSize {
		sum += int(mem[i]) // maps the zero page at every other page
	}
	if sum != 0 {
		t.Fatal("untouched memory is not zero")
	}
	start := uint64(addrOf(mem))
	var run LazyRun
	err = lazyRuns(os.Getpid(), func(r LazyRun) {
		for _, s := range r.Segments {
			if s.Vaddr <= start && start < s.Vaddr+uint64(s.Len) {
				run = r
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if best, err := PredictLazyRun(os.Getpid()); err != nil || best.Size < run.Size {
		t.Errorf("PredictLazyRun = %d bytes, %v; a run of %d bytes was found", best.Size, err, run.Size)
	}
	var total int64
	var in int64
	for _, s := range run.Segments {
		total += s.Len
		lo, hi := max(s.Vaddr, start), min(s.Vaddr+uint64(s.Len), start+uint64(len(mem)))
		if lo < hi {
			in += int64(hi - lo)
		}
		if hi > start+pages*PageSize && lo < hi {
			t.Errorf("the run holds %#x-%#x, pages of the zero page or never touched", max(lo, start+pages*PageSize), hi)
		}
	}
	if total != run.Size {
		t.Errorf("Size %d, segments %d bytes", run.Size, total)
	}
	if in != pages*PageSize {
		t.Errorf("the run holds %d bytes of the %d touched", in, pages*PageSize)
	}
}
