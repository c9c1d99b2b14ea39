package restore

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"unsafe"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/criu"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

const (
	page = criu.PageSize

	protRW = unix.PROT_READ | unix.PROT_WRITE
	protR  = unix.PROT_READ

	stAnon       = criu.VMARegular | criu.VMAAnonPrivate
	stFilePriv   = criu.VMARegular | 1<<6 // VMA_FILE_PRIVATE
	stFileShared = criu.VMARegular | 1<<7 // VMA_FILE_SHARED
	stAnonShared = criu.VMARegular | 1<<8 // VMA_ANON_SHARED
)

func mapping(start, end uint64, prot, status uint32) *criu.VMA {
	return &criu.VMA{Start: proto.Uint64(start), End: proto.Uint64(end), Pgoff: proto.Uint64(0), Shmid: proto.Uint64(0),
		Prot: proto.Uint32(prot), Flags: proto.Uint32(unix.MAP_PRIVATE | unix.MAP_ANONYMOUS), Status: proto.Uint32(status), Fd: proto.Int64(-1)}
}

// pages is a pagemap entry; flags nil leaves the field out (images older
// than it), inParent nil leaves in_parent out.
func pages(vaddr uint64, n uint32, flags *uint32, inParent *bool) *criu.PagemapEntry {
	return &criu.PagemapEntry{Vaddr: proto.Uint64(vaddr), NrPages: proto.Uint32(n), Flags: flags, InParent: inParent}
}

func TestFillableStatuses(t *testing.T) {
	for _, c := range []struct {
		name   string
		prot   uint32
		status uint32
		want   bool
	}{
		{"private anonymous", protRW, stAnon, true},
		{"heap", protRW, stAnon | criu.VMAHeap, true},
		{"stack", protRW, stAnon | criu.VMAStack, true},
		{"write only", unix.PROT_WRITE, stAnon, true},
		{"executable and writable", protRW | unix.PROT_EXEC, stAnon, true},
		{"read-only", protR, stAnon, false},
		{"read-only heap", protR, stAnon | criu.VMAHeap, false},
		{"no access", unix.PROT_NONE, stAnon, false},
		{"private file", protRW, stFilePriv, false},
		{"shared file", protRW, stFileShared, false},
		{"shared anonymous", protRW, stAnonShared, false},
		{"vsyscall", protRW, stAnon | 1<<2, false},
		{"vDSO", protRW, stAnon | 1<<3, false},
		{"SysV shared memory", protRW, stAnon | 1<<10, false},
		{"socket", protRW, stAnon | 1<<11, false},
		{"vvar", protRW, stAnon | 1<<12, false},
		{"AIO ring", protRW, stAnon | 1<<13, false},
		{"memfd", protRW, stAnon | 1<<14, false},
		{"unsupported", protRW, stAnon | 1<<31, false},
		{"anonymous, not regular", protRW, criu.VMAAnonPrivate, false},
		{"regular, not anonymous", protRW, criu.VMARegular, false},
		{"no status", protRW, 0, false},
	} {
		if got := fillable(mapping(0x1000, 0x2000, c.prot, c.status)); got != c.want {
			t.Errorf("%s (prot %#x status %#x): fillable = %v, want %v", c.name, c.prot, c.status, got, c.want)
		}
	}
}

// fillCut and keepCut are what a test sees of a piece.
type fillCut struct {
	file      int
	off, n    int64
	pid       int
	addr      uint64
	hasOutput bool
}

type keepCut struct {
	file   int
	off, n int64
	out    string // the pages image it is written into
	outOff int64
}

func cutsOf(p *fillPlan) (fills []fillCut, keeps []keepCut) {
	for _, pc := range p.fill {
		fills = append(fills, fillCut{pc.File, pc.Offset, pc.Size, pc.pid, pc.addr, pc.out != nil})
	}
	for _, pc := range p.keep {
		out := ""
		if pc.out != nil {
			out = filepath.Base(pc.out.Name())
		}
		keeps = append(keeps, keepCut{pc.File, pc.Offset, pc.Size, out, pc.outOff})
	}
	return fills, keeps
}

func sameSlices[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// fillTree is two processes' images: process 100 with every kind of
// mapping, its pagemap runs crossing their boundaries, and process 101
// with two.
type fillTree struct {
	images string
	pm100  *criu.Pagemap
	pm101  *criu.Pagemap
	m      *catalog.Manifest
}

const (
	base100 = 0x7f00_0000_0000 // process 100's mappings start here
	base101 = 0x5500_0000_0000 // and process 101's here
	off1    = 12345            // where pages-1.img lies in data file 0
	off2    = 1 << 20          // where pages-2.img lies in data file 1
)

func newFillTree(t *testing.T) *fillTree {
	t.Helper()
	images := t.TempDir()
	b := uint64(base100)
	// Written out of order: planFill sorts them.
	vmas100 := []*criu.VMA{
		mapping(b+20*page, b+22*page, protRW, stAnon|criu.VMAStack), // V5: fill
		mapping(b+11*page, b+13*page, protRW, stAnon|criu.VMAHeap),  // V4: fill
		mapping(b, b+4*page, protRW, stAnon),                        // V0: fill
		mapping(b+4*page, b+6*page, protR, stAnon),                  // V1: read-only
		mapping(b+6*page, b+8*page, protRW, stFilePriv),             // V2: private file
		// b+8*page: no mapping
		mapping(b+9*page, b+11*page, protRW, stAnonShared), // V3: shared anonymous
	}
	present, lazy := proto.Uint32(criu.PagePresent), proto.Uint32(criu.PagePresent|criu.PageLazy)
	pm100 := &criu.Pagemap{PagesID: 1, Entries: []*criu.PagemapEntry{
		pages(b-page, 1, present, nil),                        // below every mapping
		pages(b+2*page, 3, present, nil),                      // V0[2:4] V1[0:1]
		pages(b+5*page, 1, nil, proto.Bool(true)),             // V1[1]: in a parent image
		pages(b+6*page, 1, nil, nil),                          // V2[0]: no flags, present
		pages(b+7*page, 6, lazy, nil),                         // V2[1] gap V3 V4
		pages(b+14*page, 1, proto.Uint32(criu.PageLazy), nil), // not in the image
		pages(b+21*page, 1, present, proto.Bool(false)),       // V5[1]
		pages(b+30*page, 1, present, proto.Bool(false)),       // above every mapping
	}}
	c := uint64(base101)
	vmas101 := []*criu.VMA{
		mapping(c, c+2*page, protRW, stAnon),
		mapping(c+2*page, c+3*page, protR, stAnon),
	}
	pm101 := &criu.Pagemap{PagesID: 2, Entries: []*criu.PagemapEntry{
		pages(c, 3, present, nil), // both mappings
	}}
	for _, f := range []func() error{
		func() error { return criu.WritePstree(filepath.Join(images, "pstree.img"), []int{100, 101}) },
		func() error { return criu.WriteVMAs(filepath.Join(images, "mm-100.img"), vmas100) },
		func() error { return criu.WriteVMAs(filepath.Join(images, "mm-101.img"), vmas101) },
		func() error { return criu.WritePagemap(filepath.Join(images, "pagemap-100.img"), pm100) },
		func() error { return criu.WritePagemap(filepath.Join(images, "pagemap-101.img"), pm101) },
	} {
		if err := f(); err != nil {
			t.Fatal(err)
		}
	}
	m := &catalog.Manifest{Entries: []catalog.Entry{
		{Path: "pstree.img", Type: catalog.EntryFile, Size: 100, File: 0, Offset: 0},
		{Path: "pages-2.img", Type: catalog.EntryFile, Size: 3 * page, File: 1, Offset: off2},
		{Path: "pages-1.img", Type: catalog.EntryFile, Size: 13 * page, File: 0, Offset: off1},
		{Path: "old/pages-1.img", Type: catalog.EntryFile, Size: 1, File: 0, Offset: 1},
	}}
	return &fillTree{images: images, pm100: pm100, pm101: pm101, m: m}
}

func TestPlanFillPieces(t *testing.T) {
	tr := newFillTree(t)
	// Whatever lies where the pages images go is replaced.
	for _, name := range []string{"pages-1.img", "pages-2.img"} {
		if err := os.WriteFile(filepath.Join(tr.images, name), []byte("stale bytes"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	plan, err := planFill(tr.m, tr.images)
	if err != nil {
		t.Fatal(err)
	}
	defer plan.close()

	b, c := uint64(base100), uint64(base101)
	fills, keeps := cutsOf(plan)
	// Pieces lie in the data file at the entry's offset plus where they
	// lie in the pages image, which holds every present page in pagemap
	// order: process 100's image is [b-1] [b+2 b+3 | b+4] [b+6] [b+7 |
	// b+8 | b+9 b+10 | b+11 b+12] [b+21] [b+30], pages 0 to 12.
	wantFills := []fillCut{
		{0, off1 + 1*page, 2 * page, 100, b + 2*page, false},  // V0[2:4], cut at V0's end
		{0, off1 + 9*page, 2 * page, 100, b + 11*page, false}, // V4, the heap
		{0, off1 + 11*page, page, 100, b + 21*page, false},    // V5[1], the stack
		{1, off2, 2 * page, 101, c, false},                    // process 101's writable mapping
	}
	wantKeeps := []keepCut{
		{0, off1, page, "pages-1.img", 0},                     // below every mapping
		{0, off1 + 3*page, page, "pages-1.img", page},         // V1[0], read-only
		{0, off1 + 4*page, page, "pages-1.img", 2 * page},     // V2[0], private file, an entry without flags
		{0, off1 + 5*page, page, "pages-1.img", 3 * page},     // V2[1]
		{0, off1 + 6*page, page, "pages-1.img", 4 * page},     // between V2 and V3
		{0, off1 + 7*page, 2 * page, "pages-1.img", 5 * page}, // V3, shared anonymous
		{0, off1 + 12*page, page, "pages-1.img", 7 * page},    // above every mapping
		{1, off2 + 2*page, page, "pages-2.img", 0},            // process 101's read-only mapping
	}
	if !sameSlices(fills, wantFills) {
		t.Errorf("filled:\n got  %+v\n want %+v", fills, wantFills)
	}
	if !sameSlices(keeps, wantKeeps) {
		t.Errorf("kept:\n got  %+v\n want %+v", keeps, wantKeeps)
	}
	if plan.FillBytes != 7*page || plan.KeepBytes != 9*page {
		t.Errorf("FillBytes %d KeepBytes %d, want %d and %d", plan.FillBytes, plan.KeepBytes, 7*page, 9*page)
	}
	// Every present byte goes one way or the other.
	if plan.FillBytes+plan.KeepBytes != tr.m.Entries[1].Size+tr.m.Entries[2].Size {
		t.Errorf("%d bytes planned of %d", plan.FillBytes+plan.KeepBytes, tr.m.Entries[1].Size+tr.m.Entries[2].Size)
	}
	// The pieces kept for one process share its open pages image.
	outs := map[string]*os.File{}
	for _, pc := range plan.keep {
		if pc.out == nil {
			continue // reported above
		}
		name := filepath.Base(pc.out.Name())
		if f, ok := outs[name]; ok && f != pc.out {
			t.Errorf("kept piece at %d: a second %s open", pc.Offset, name)
		}
		outs[name] = pc.out
	}

	// The rewritten pagemaps list the kept runs, each within one mapping,
	// in order, and the runs not in the image as they were.
	present, lazy := proto.Uint32(criu.PagePresent), proto.Uint32(criu.PagePresent|criu.PageLazy)
	want100 := []*criu.PagemapEntry{
		pages(b-page, 1, present, nil),
		pages(b+4*page, 1, present, nil),
		pages(b+5*page, 1, nil, proto.Bool(true)),
		pages(b+6*page, 1, nil, nil),
		pages(b+7*page, 1, lazy, nil),
		pages(b+8*page, 1, lazy, nil),
		pages(b+9*page, 2, lazy, nil),
		pages(b+14*page, 1, proto.Uint32(criu.PageLazy), nil),
		pages(b+30*page, 1, present, proto.Bool(false)),
	}
	want101 := []*criu.PagemapEntry{pages(c+2*page, 1, present, nil)}
	for _, w := range []struct {
		pid     int
		pagesID uint32
		entries []*criu.PagemapEntry
	}{{100, 1, want100}, {101, 2, want101}} {
		got, err := criu.ReadPagemap(filepath.Join(tr.images, fmt.Sprintf("pagemap-%d.img", w.pid)))
		if err != nil {
			t.Fatal(err)
		}
		if got.PagesID != w.pagesID {
			t.Errorf("process %d: rewritten pagemap names pages-%d.img, want pages-%d.img", w.pid, got.PagesID, w.pagesID)
		}
		same := len(got.Entries) == len(w.entries)
		for i := 0; same && i < len(got.Entries); i++ {
			same = proto.Equal(got.Entries[i], w.entries[i])
		}
		if !same {
			t.Errorf("process %d: rewritten pagemap\n got  %v\n want %v", w.pid, got.Entries, w.entries)
		}
		// The kept runs' pages, in the rewritten image's order, are the
		// kept pieces', in theirs.
		var presentBytes int64
		for _, e := range got.Entries {
			if criu.Present(e) {
				presentBytes += int64(e.GetNrPages()) * page
			}
		}
		var keptBytes int64
		for _, k := range keeps {
			if k.out == fmt.Sprintf("pages-%d.img", w.pagesID) {
				keptBytes += k.n
			}
		}
		if presentBytes != keptBytes {
			t.Errorf("process %d: the rewritten pagemap lists %d bytes, %d are kept", w.pid, presentBytes, keptBytes)
		}
	}
	// The pages images CRIU reads are created empty, for writeKept.
	for _, name := range []string{"pages-1.img", "pages-2.img"} {
		if st, err := os.Stat(filepath.Join(tr.images, name)); err != nil || st.Size() != 0 {
			t.Errorf("%s: %v, %v; want an empty file", name, st, err)
		}
	}
	if len(plan.outs) != 2 {
		t.Errorf("%d pages images open, want 2", len(plan.outs))
	}
}

// TestPlanFillOnlyFillable: a process whose memory is all private
// anonymous keeps an empty pagemap and an empty pages image.
func TestPlanFillOnlyFillable(t *testing.T) {
	images := t.TempDir()
	const b = 0x10000
	if err := criu.WritePstree(filepath.Join(images, "pstree.img"), []int{5}); err != nil {
		t.Fatal(err)
	}
	if err := criu.WriteVMAs(filepath.Join(images, "mm-5.img"), []*criu.VMA{mapping(b, b+8*page, protRW, stAnon)}); err != nil {
		t.Fatal(err)
	}
	present := proto.Uint32(criu.PagePresent)
	pm := filepath.Join(images, "pagemap-5.img")
	if err := criu.WritePagemap(pm, &criu.Pagemap{PagesID: 9, Entries: []*criu.PagemapEntry{
		pages(b, 2, present, nil), pages(b+4*page, 4, present, nil),
	}}); err != nil {
		t.Fatal(err)
	}
	m := &catalog.Manifest{Entries: []catalog.Entry{{Path: "pages-9.img", Type: catalog.EntryFile, Size: 6 * page, Offset: 7 * page}}}
	plan, err := planFill(m, images)
	if err != nil {
		t.Fatal(err)
	}
	defer plan.close()
	fills, keeps := cutsOf(plan)
	want := []fillCut{{0, 7 * page, 2 * page, 5, b, false}, {0, 9 * page, 4 * page, 5, b + 4*page, false}}
	if !sameSlices(fills, want) || len(keeps) != 0 {
		t.Errorf("fill %+v keep %+v; want fill %+v, nothing kept", fills, keeps, want)
	}
	if plan.FillBytes != 6*page || plan.KeepBytes != 0 {
		t.Errorf("FillBytes %d KeepBytes %d", plan.FillBytes, plan.KeepBytes)
	}
	got, err := criu.ReadPagemap(pm)
	if err != nil {
		t.Fatal(err)
	}
	if got.PagesID != 9 || len(got.Entries) != 0 {
		t.Errorf("rewritten pagemap: pages %d, entries %v; want pages 9, none", got.PagesID, got.Entries)
	}
}

// TestPlanFillKeepsSharedMemory: the pages images no process's pagemap
// names (the contents of shared anonymous memory and memfds, which CRIU's
// pagemap-shmem-ID.img name) are kept whole for CRIU, each in its own
// file; the processes' pieces are planned as before. A pages image that
// two pagemaps name is refused.
func TestPlanFillKeepsSharedMemory(t *testing.T) {
	tr := newFillTree(t)
	tr.m.Entries = append(tr.m.Entries,
		catalog.Entry{Path: "pages-3.img", Type: catalog.EntryFile, Size: 5 * page, File: 1, Offset: off2 + 3*page},
		catalog.Entry{Path: "pages-4.img", Type: catalog.EntryFile, Size: 0, File: 1, Offset: off2 + 8*page})
	plan, err := planFill(tr.m, tr.images)
	if err != nil {
		t.Fatal(err)
	}
	defer plan.close()
	_, keeps := cutsOf(plan)
	var shm []keepCut
	for _, k := range keeps {
		if k.out == "pages-3.img" || k.out == "pages-4.img" {
			shm = append(shm, k)
		}
	}
	if want := []keepCut{{1, off2 + 3*page, 5 * page, "pages-3.img", 0}}; !sameSlices(shm, want) {
		t.Errorf("shared memory kept as %+v, want %+v", shm, want)
	}
	if plan.FillBytes != 7*page || plan.KeepBytes != 14*page || len(plan.outs) != 4 {
		t.Errorf("FillBytes %d KeepBytes %d with %d pages images; want %d, %d, 4", plan.FillBytes, plan.KeepBytes, len(plan.outs), 7*page, 14*page)
	}
	for _, name := range []string{"pages-3.img", "pages-4.img"} {
		if st, err := os.Stat(filepath.Join(tr.images, name)); err != nil || st.Size() != 0 {
			t.Errorf("%s: %v, %v; want an empty file, for writeKept", name, st, err)
		}
	}

	tr = newFillTree(t)
	tr.pm101.PagesID = 1
	if err := criu.WritePagemap(filepath.Join(tr.images, "pagemap-101.img"), tr.pm101); err != nil {
		t.Fatal(err)
	}
	if plan, err := planFill(tr.m, tr.images); !errors.Is(err, catalog.ErrBadManifest) {
		if plan != nil {
			plan.close()
		}
		t.Errorf("two pagemaps naming pages-1.img: %v, want ErrBadManifest", err)
	}
}

// TestPlanFillZombie: a process without a pagemap (a zombie) has nothing
// to plan and no pages image is asked for.
func TestPlanFillZombie(t *testing.T) {
	tr := newFillTree(t)
	if err := criu.WritePstree(filepath.Join(tr.images, "pstree.img"), []int{100, 101, 102}); err != nil {
		t.Fatal(err)
	}
	plan, err := planFill(tr.m, tr.images)
	if err != nil {
		t.Fatal(err)
	}
	defer plan.close()
	for _, pc := range plan.fill {
		if pc.pid == 102 {
			t.Errorf("a piece for the zombie: %+v", pc)
		}
	}
	if plan.FillBytes != 7*page || plan.KeepBytes != 9*page || len(plan.outs) != 2 {
		t.Errorf("FillBytes %d KeepBytes %d with %d pages images", plan.FillBytes, plan.KeepBytes, len(plan.outs))
	}
}

func TestPlanFillErrors(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(m *catalog.Manifest) // m.Entries[2] is pages-1.img
		// created says whether pages-1.img is created before the error.
		created bool
	}{
		{"image longer than the pagemap", func(m *catalog.Manifest) { m.Entries[2].Size += page }, true},
		{"image shorter than the pagemap", func(m *catalog.Manifest) { m.Entries[2].Size -= page }, true},
		{"image a byte short", func(m *catalog.Manifest) { m.Entries[2].Size-- }, true},
		{"no pages image", func(m *catalog.Manifest) { m.Entries = append(m.Entries[:2], m.Entries[3:]...) }, false},
		{"pages image only in a directory", func(m *catalog.Manifest) { m.Entries[2].Path = "sub/pages-1.img" }, false},
		{"pages image is a directory", func(m *catalog.Manifest) {
			m.Entries[2] = catalog.Entry{Path: "pages-1.img", Type: catalog.EntryDir}
		}, false},
		{"another process's pages image", func(m *catalog.Manifest) { m.Entries[2].Path = "pages-3.img" }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr := newFillTree(t)
			c.change(tr.m)
			plan, err := planFill(tr.m, tr.images)
			if !errors.Is(err, catalog.ErrBadManifest) {
				if plan != nil {
					plan.close()
				}
				t.Fatalf("planFill: %v, want an error wrapping %v", err, catalog.ErrBadManifest)
			}
			if plan != nil {
				t.Errorf("a plan with the error: %+v", plan)
			}
			// Process 100's pagemap is left as it was.
			got, err := criu.ReadPagemap(filepath.Join(tr.images, "pagemap-100.img"))
			if err != nil {
				t.Fatal(err)
			}
			same := len(got.Entries) == len(tr.pm100.Entries)
			for i := 0; same && i < len(got.Entries); i++ {
				same = proto.Equal(got.Entries[i], tr.pm100.Entries[i])
			}
			if !same {
				t.Errorf("pagemap-100.img was rewritten: %v", got.Entries)
			}
			if _, err := os.Stat(filepath.Join(tr.images, "pages-1.img")); (err == nil) != c.created {
				t.Errorf("pages-1.img: %v", err)
			}
		})
	}
	// Images that cannot be read.
	for _, c := range []struct {
		name    string
		breakIt func(images string) error
	}{
		{"no pstree", func(images string) error { return os.Remove(filepath.Join(images, "pstree.img")) }},
		{"no mm image", func(images string) error { return os.Remove(filepath.Join(images, "mm-101.img")) }},
		{"pagemap not a pagemap", func(images string) error {
			return os.Rename(filepath.Join(images, "mm-101.img"), filepath.Join(images, "pagemap-101.img"))
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr := newFillTree(t)
			if err := c.breakIt(tr.images); err != nil {
				t.Fatal(err)
			}
			if plan, err := planFill(tr.m, tr.images); err == nil {
				plan.close()
				t.Error("planned without an error")
			}
		})
	}
}

// alignedBuffer returns n bytes starting at a page boundary, and the
// buffer holding them (to keep alive).
func alignedBuffer(n int) (b, backing []byte) {
	backing = make([]byte, n+page)
	skip := (page - int(uintptr(unsafe.Pointer(&backing[0]))%page)) % page
	return backing[skip : skip+n], backing
}

// TestWriteMemoryZeroParts writes into this process's own memory, from a
// place that is not page aligned, a length that is not whole pages: the
// parts of pages of the target that are all zeros are left out and
// counted, the rest written whole, zero bytes and all.
func TestWriteMemoryZeroParts(t *testing.T) {
	const at = 100 // dst's offset from a page boundary
	const n = 4*page + 1000
	// src's parts, cut at the target's page boundaries: [0, 3996)
	// [3996, 8092) [8092, 12188) [12188, 16284) [16284, 17384).
	cuts := []int{0, page - at, 2*page - at, 3*page - at, 4*page - at, n}
	for _, c := range []struct {
		name string
		data []bool // which parts have a non-zero byte
	}{
		{"all zeros", []bool{false, false, false, false, false}},
		{"no zeros", []bool{true, true, true, true, true}},
		{"alternating", []bool{true, false, true, false, true}},
		{"zeros at the ends", []bool{false, true, true, false, false}},
	} {
		t.Run(c.name, func(t *testing.T) {
			mem, backing := alignedBuffer(6 * page)
			for i := range mem {
				mem[i] = 0xa5
			}
			src := make([]byte, n)
			want := bytes.Clone(mem)
			var wantWritten, wantZero int64
			for k, hasData := range c.data {
				part := src[cuts[k]:cuts[k+1]]
				if !hasData {
					wantZero += int64(len(part))
					continue
				}
				// One non-zero byte in the middle: the zeros around it
				// are written too.
				part[len(part)/2] = byte(k + 1)
				copy(want[at+cuts[k]:], part)
				wantWritten += int64(len(part))
			}
			written, zero, err := writeMemory(os.Getpid(), uint64(uintptr(unsafe.Pointer(&mem[at]))), src)
			if err != nil {
				t.Fatal(err)
			}
			if written != wantWritten || zero != wantZero {
				t.Errorf("written %d zero %d, want %d and %d", written, zero, wantWritten, wantZero)
			}
			if !bytes.Equal(mem, want) {
				for i := range mem {
					if mem[i] != want[i] {
						t.Fatalf("byte %d (src %d) is %#x, want %#x", i, i-at, mem[i], want[i])
					}
				}
			}
			runtime.KeepAlive(backing)
		})
	}
}

// TestWriteMemoryManyRanges writes more separate ranges than one
// process_vm_writev takes: every other page is zeros.
func TestWriteMemoryManyRanges(t *testing.T) {
	const nPages = 2*maxIov + 100
	mem, backing := alignedBuffer(nPages * page)
	for i := range mem {
		mem[i] = 0xff
	}
	src := make([]byte, nPages*page)
	want := bytes.Clone(mem)
	for p := 0; p < nPages; p += 2 {
		for i := p * page; i < (p+1)*page; i += 64 {
			src[i] = byte(p>>1) | 1
		}
		copy(want[p*page:(p+1)*page], src[p*page:(p+1)*page])
	}
	written, zero, err := writeMemory(os.Getpid(), uint64(uintptr(unsafe.Pointer(&mem[0]))), src)
	if err != nil {
		t.Fatal(err)
	}
	if wantWritten := int64((nPages + 1) / 2 * page); written != wantWritten || zero != int64(nPages*page)-wantWritten {
		t.Errorf("written %d zero %d, want %d and %d", written, zero, wantWritten, int64(nPages*page)-wantWritten)
	}
	if !bytes.Equal(mem, want) {
		t.Error("the memory differs from what was written and left out")
	}
	runtime.KeepAlive(backing)
}

// TestWriteMemoryUnmapped: a write to memory the process does not have
// fails and says where; zeros for it need no write and do not fail.
func TestWriteMemoryUnmapped(t *testing.T) {
	// The first page is never mapped (vm.mmap_min_addr).
	const addr = page
	src := make([]byte, 2*page)
	if written, zero, err := writeMemory(os.Getpid(), addr, src); err != nil || written != 0 || zero != 2*page {
		t.Errorf("zeros to an unmapped page: written %d zero %d, %v", written, zero, err)
	}
	src[page+1] = 7
	written, zero, err := writeMemory(os.Getpid(), addr, src)
	if !errors.Is(err, unix.EFAULT) {
		t.Errorf("data to an unmapped page: %v, want EFAULT", err)
	}
	if written != 0 || zero != page {
		t.Errorf("written %d zero %d, want 0 and %d", written, zero, page)
	}
	if err != nil && !bytes.Contains([]byte(err.Error()), []byte(fmt.Sprintf("%#x", 2*page))) {
		t.Errorf("%q does not say where", err)
	}
}
