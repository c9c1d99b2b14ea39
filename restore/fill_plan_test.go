package restore

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"unsafe"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/criu"
	"google.golang.org/protobuf/proto"
)

const pg = criu.PageSize

func vmaOf(start, end uint64, prot, status uint32) *criu.VMA {
	return &criu.VMA{Start: proto.Uint64(start), End: proto.Uint64(end), Pgoff: proto.Uint64(0), Shmid: proto.Uint64(0),
		Prot: proto.Uint32(prot), Flags: proto.Uint32(0x22), Status: proto.Uint32(status), Fd: proto.Int64(-1)}
}

func run(vaddr uint64, pages uint32, flags uint32) *criu.PagemapEntry {
	return &criu.PagemapEntry{Vaddr: proto.Uint64(vaddr), NrPages: proto.Uint32(pages), Flags: proto.Uint32(flags)}
}

const (
	rw       = 3 // PROT_READ | PROT_WRITE
	anon     = criu.VMARegular | criu.VMAAnonPrivate
	filePriv = criu.VMARegular | 1<<6
	anonShr  = criu.VMARegular | 1<<8
)

func TestFillable(t *testing.T) {
	for _, c := range []struct {
		name   string
		prot   uint32
		status uint32
		want   bool
	}{
		{"private anonymous", rw, anon, true},
		{"heap", rw, anon | criu.VMAHeap, true},
		{"stack", rw, anon | criu.VMAStack, true},
		{"read-only", 1, anon, false},
		{"private file", rw, filePriv, false},
		{"shared anonymous", rw, anonShr, false},
		{"vDSO", rw, anon | 1<<3, false},
		{"AIO ring", rw, anon | 1<<13, false},
		{"not regular", rw, criu.VMAAnonPrivate, false},
	} {
		if got := fillable(vmaOf(0, pg, c.prot, c.status)); got != c.want {
			t.Errorf("%s: fillable = %v", c.name, got)
		}
	}
}

// TestPlanFill checks how a process's dumped pages are split: a run across
// two mappings is cut at their boundary, each part going its own way;
// pages of read-only, file and shared mappings, and pages outside any
// mapping, stay with CRIU; a run not in the pages image is kept as it is.
func TestPlanFill(t *testing.T) {
	images := t.TempDir()
	const base = 0x10000
	vmas := []*criu.VMA{
		vmaOf(base, base+4*pg, rw, anon),          // A: fill
		vmaOf(base+4*pg, base+6*pg, 1, anon),      // B: read-only
		vmaOf(base+6*pg, base+8*pg, rw, filePriv), // C: file
		vmaOf(base+8*pg, base+9*pg, rw, anonShr),  // D: shared
		vmaOf(base+10*pg, base+12*pg, rw, anon),   // E: fill, after a gap
	}
	entries := []*criu.PagemapEntry{
		run(base+2*pg, 5, criu.PagePresent),                           // A[2:4] B[0:2] C[0:1]
		run(base+7*pg, 1, criu.PageInParent),                          // in a parent image: no bytes
		run(base+8*pg, 3, criu.PagePresent),                           // D, the gap, E[0]
		{Vaddr: proto.Uint64(base + 11*pg), NrPages: proto.Uint32(1)}, // E[1], no flags
	}
	if err := criu.WritePstree(filepath.Join(images, "pstree.img"), []int{77}); err != nil {
		t.Fatal(err)
	}
	if err := criu.WriteVMAs(filepath.Join(images, "mm-77.img"), vmas); err != nil {
		t.Fatal(err)
	}
	pmPath := filepath.Join(images, "pagemap-77.img")
	writePM := func() {
		if err := criu.WritePagemap(pmPath, &criu.Pagemap{PagesID: 3, Entries: entries}); err != nil {
			t.Fatal(err)
		}
	}
	writePM()
	const off = 5000 // where the pages image lies in the data file
	m := &catalog.Manifest{Entries: []catalog.Entry{{Path: "pages-3.img", Type: catalog.EntryFile, Size: 9 * pg, File: 0, Offset: off}}}
	plan, err := planFill(m, images)
	if err != nil {
		t.Fatal(err)
	}
	defer plan.close()
	type cut struct {
		off, n int64
		addr   uint64
	}
	var fills, keeps []cut
	for _, p := range plan.fill {
		if p.pid != 77 || p.file != 0 {
			t.Errorf("a fill piece for process %d, file %d", p.pid, p.file)
		}
		fills = append(fills, cut{p.off, p.n, p.addr})
	}
	for _, p := range plan.keep {
		keeps = append(keeps, cut{p.off, p.n, uint64(p.outOff)})
	}
	wantFills := []cut{{off, 2 * pg, base + 2*pg}, {off + 7*pg, pg, base + 10*pg}, {off + 8*pg, pg, base + 11*pg}}
	// For kept pieces, addr holds the offset in the rewritten pages image.
	wantKeeps := []cut{{off + 2*pg, 2 * pg, 0}, {off + 4*pg, pg, 2 * pg}, {off + 5*pg, pg, 3 * pg}, {off + 6*pg, pg, 4 * pg}}
	if !equalCuts(fills, wantFills) || !equalCuts(keeps, wantKeeps) {
		t.Fatalf("fill %v keep %v; want fill %v keep %v", fills, keeps, wantFills, wantKeeps)
	}
	if plan.FillBytes != 4*pg || plan.KeepBytes != 5*pg {
		t.Errorf("FillBytes %d KeepBytes %d", plan.FillBytes, plan.KeepBytes)
	}
	got, err := criu.ReadPagemap(pmPath)
	if err != nil {
		t.Fatal(err)
	}
	type pmRun struct {
		vaddr   uint64
		pages   uint32
		present bool
	}
	var runs []pmRun
	for _, e := range got.Entries {
		runs = append(runs, pmRun{e.GetVaddr(), e.GetNrPages(), criu.Present(e)})
	}
	want := []pmRun{{base + 4*pg, 2, true}, {base + 6*pg, 1, true}, {base + 7*pg, 1, false}, {base + 8*pg, 1, true}, {base + 9*pg, 1, true}}
	if got.PagesID != 3 || len(runs) != len(want) {
		t.Fatalf("rewritten pagemap (pages %d): %v; want %v", got.PagesID, runs, want)
	}
	for i := range want {
		if runs[i] != want[i] {
			t.Fatalf("rewritten pagemap: %v; want %v", runs, want)
		}
	}
	if _, err := os.Stat(filepath.Join(images, "pages-3.img")); err != nil {
		t.Errorf("no pages image for CRIU: %v", err)
	}

	// A pages image of another size than the pagemap says, or none.
	writePM()
	m.Entries[0].Size = 8 * pg
	if _, err := planFill(m, images); !errors.Is(err, catalog.ErrBadManifest) {
		t.Errorf("a pages image shorter than its pagemap: %v", err)
	}
	writePM()
	m.Entries[0].Path = "pages-4.img"
	if _, err := planFill(m, images); !errors.Is(err, catalog.ErrBadManifest) {
		t.Errorf("no pages image: %v", err)
	}
}

func equalCuts[T comparable](a, b []T) bool {
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

// TestWriteMemory writes into this process's own memory, from and to
// addresses that are not page aligned: the pages (or parts of pages) of
// zeros are left out and counted, the rest written.
func TestWriteMemory(t *testing.T) {
	dst := make([]byte, 6*pg)
	for i := range dst {
		dst[i] = 0xee
	}
	want := bytes.Clone(dst) // what dst must hold after: built below
	// src goes to dst[100:], so its pieces are cut at dst's page
	// boundaries: the first piece is pg-100 bytes, the last a partial
	// page.
	src := make([]byte, 5*pg)
	copy(src[:10], "not zeros!")                   // first piece: data
	for i := pg - 100 + pg; i < pg-100+2*pg; i++ { // third piece: data
		src[i] = byte(i)
	}
	src[len(src)-1] = 1 // last piece: data
	addr := uint64(uintptr(unsafe.Pointer(&dst[100])))
	written, zero, err := writeMemory(os.Getpid(), addr, src)
	if err != nil {
		t.Fatal(err)
	}
	var wantWritten int64
	for start := 0; start < len(src); {
		end := min(len(src), start+pg-int((addr+uint64(start))%pg))
		if !bytes.Equal(src[start:end], make([]byte, end-start)) {
			copy(want[100+start:], src[start:end])
			wantWritten += int64(end - start)
		}
		start = end
	}
	if written != wantWritten || zero != int64(len(src))-wantWritten {
		t.Errorf("written %d, zero %d; want %d and %d", written, zero, wantWritten, int64(len(src))-wantWritten)
	}
	if wantWritten == int64(len(src)) || wantWritten == 0 {
		t.Fatal("the test data has no pages of zeros, or nothing else")
	}
	if !bytes.Equal(dst, want) {
		t.Error("the memory written differs from what was asked")
	}
	runtime.KeepAlive(dst)
}
