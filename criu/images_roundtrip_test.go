package criu

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
)

func TestImageRoundTrips(t *testing.T) {
	dir := t.TempDir()
	pm := &Pagemap{PagesID: 7, Entries: []*PagemapEntry{
		{Vaddr: proto.Uint64(0x1000), NrPages: proto.Uint32(3), Flags: proto.Uint32(PagePresent)},
		{Vaddr: proto.Uint64(0x9000), NrPages: proto.Uint32(1), InParent: proto.Bool(true)},
		{Vaddr: proto.Uint64(0xa000), NrPages: proto.Uint32(2)},
	}}
	path := filepath.Join(dir, "pagemap-1.img")
	if err := WritePagemap(path, pm); err != nil {
		t.Fatal(err)
	}
	got, err := ReadPagemap(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.PagesID != 7 || len(got.Entries) != 3 {
		t.Fatalf("read back pages id %d with %d entries", got.PagesID, len(got.Entries))
	}
	for i, e := range got.Entries {
		if !proto.Equal(e, pm.Entries[i]) {
			t.Errorf("entry %d read back as %v, wrote %v", i, e, pm.Entries[i])
		}
	}
	// Present: the flag when there are flags, otherwise not in a parent.
	for i, want := range []bool{true, false, true} {
		if Present(got.Entries[i]) != want {
			t.Errorf("entry %d: Present = %v", i, !want)
		}
	}
	if Present(&PagemapEntry{Flags: proto.Uint32(PageLazy)}) {
		t.Error("a lazy entry without the present flag is taken as present")
	}

	vmas := []*VMA{{Start: proto.Uint64(0x1000), End: proto.Uint64(0x4000), Pgoff: proto.Uint64(0), Shmid: proto.Uint64(0),
		Prot: proto.Uint32(3), Flags: proto.Uint32(0x22), Status: proto.Uint32(VMARegular | VMAAnonPrivate), Fd: proto.Int64(-1)}}
	if err := WriteVMAs(filepath.Join(dir, "mm-1.img"), vmas); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadVMAs(filepath.Join(dir, "mm-1.img")); err != nil || len(got) != 1 || !proto.Equal(got[0], vmas[0]) {
		t.Fatalf("mappings read back as %v, %v", got, err)
	}
	if err := WritePstree(filepath.Join(dir, "pstree.img"), []int{40, 41, 42}); err != nil {
		t.Fatal(err)
	}
	if pids, err := ReadPstree(filepath.Join(dir, "pstree.img")); err != nil || len(pids) != 3 || pids[0] != 40 || pids[2] != 42 {
		t.Fatalf("pstree read back as %v, %v", pids, err)
	}
}

func TestImageReadErrors(t *testing.T) {
	dir := t.TempDir()
	pm := filepath.Join(dir, "pagemap-1.img")
	if err := WritePagemap(pm, &Pagemap{PagesID: 1, Entries: []*PagemapEntry{{Vaddr: proto.Uint64(0x1000), NrPages: proto.Uint32(1)}}}); err != nil {
		t.Fatal(err)
	}
	// A pagemap is not an mm image: its magic says so.
	if _, err := ReadVMAs(pm); err == nil || !strings.Contains(err.Error(), "magic") {
		t.Errorf("a pagemap read as an mm image: %v", err)
	}
	data, err := os.ReadFile(pm)
	if err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string][]byte{
		"truncated entry":  data[:len(data)-2],
		"truncated magic":  data[:5],
		"oversized entry":  append(data[:8:8], 0xff, 0xff, 0xff, 0x7f),
		"no head":          data[:8],
		"garbled protobuf": append(data[:8:8], 2, 0, 0, 0, 0xff, 0xff),
	} {
		path := filepath.Join(dir, "bad.img")
		if err := os.WriteFile(path, bad, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadPagemap(path); err == nil {
			t.Errorf("%s: read without an error", name)
		}
	}
}
