package criu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// testVMA is a mapping with every field CRIU requires set.
func testVMA(start, end uint64, prot, status uint32) *VMA {
	return &VMA{Start: proto.Uint64(start), End: proto.Uint64(end), Pgoff: proto.Uint64(0), Shmid: proto.Uint64(0),
		Prot: proto.Uint32(prot), Flags: proto.Uint32(unix.MAP_PRIVATE | unix.MAP_ANONYMOUS), Status: proto.Uint32(status), Fd: proto.Int64(-1)}
}

func TestPagemapWriteRead(t *testing.T) {
	for _, c := range []struct {
		name string
		pm   *Pagemap
	}{
		{"head only", &Pagemap{PagesID: 1}},
		{"flags", &Pagemap{PagesID: 2, Entries: []*PagemapEntry{
			{Vaddr: proto.Uint64(0x7f0000000000), NrPages: proto.Uint32(512), Flags: proto.Uint32(PagePresent)},
			{Vaddr: proto.Uint64(0x7f0000200000), NrPages: proto.Uint32(1), Flags: proto.Uint32(PagePresent | PageLazy)},
			{Vaddr: proto.Uint64(0x7f0000300000), NrPages: proto.Uint32(3), Flags: proto.Uint32(PageInParent)},
			{Vaddr: proto.Uint64(0x7f0000400000), NrPages: proto.Uint32(2), Flags: proto.Uint32(0)},
		}}},
		{"no flags, in_parent", &Pagemap{PagesID: 1 << 31, Entries: []*PagemapEntry{
			{Vaddr: proto.Uint64(0x1000), NrPages: proto.Uint32(1)},
			{Vaddr: proto.Uint64(0x2000), NrPages: proto.Uint32(4), InParent: proto.Bool(true)},
			{Vaddr: proto.Uint64(0x6000), NrPages: proto.Uint32(2), InParent: proto.Bool(false)},
			{Vaddr: proto.Uint64(0xffff_ffff_f000), NrPages: proto.Uint32(1), InParent: proto.Bool(true), Flags: proto.Uint32(PageInParent)},
		}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "pagemap-1.img")
			if err := WritePagemap(path, c.pm); err != nil {
				t.Fatal(err)
			}
			got, err := ReadPagemap(path)
			if err != nil {
				t.Fatal(err)
			}
			if got.PagesID != c.pm.PagesID {
				t.Errorf("pages id %d, wrote %d", got.PagesID, c.pm.PagesID)
			}
			if len(got.Entries) != len(c.pm.Entries) {
				t.Fatalf("%d entries read back, wrote %d", len(got.Entries), len(c.pm.Entries))
			}
			for i, e := range got.Entries {
				// proto.Equal tells an unset field from one set to its
				// zero value: Flags 0 and InParent false survive as set.
				if !proto.Equal(e, c.pm.Entries[i]) {
					t.Errorf("entry %d read back as %v, wrote %v", i, e, c.pm.Entries[i])
				}
				if (e.Flags == nil) != (c.pm.Entries[i].Flags == nil) || (e.InParent == nil) != (c.pm.Entries[i].InParent == nil) {
					t.Errorf("entry %d: which optional fields are set changed: %v, wrote %v", i, e, c.pm.Entries[i])
				}
			}
			// The file is what CRIU reads: the two magics, then
			// length-prefixed messages.
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if binary.LittleEndian.Uint32(data) != 0x54564319 || binary.LittleEndian.Uint32(data[4:]) != 0x56084025 {
				t.Errorf("file starts % x", data[:8])
			}
		})
	}
}

func TestPagemapWriteReplaces(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pagemap-1.img")
	long := &Pagemap{PagesID: 1}
	for i := range 100 {
		long.Entries = append(long.Entries, &PagemapEntry{Vaddr: proto.Uint64(uint64(i) * PageSize), NrPages: proto.Uint32(1)})
	}
	short := &Pagemap{PagesID: 2, Entries: long.Entries[:1]}
	if err := WritePagemap(path, long); err != nil {
		t.Fatal(err)
	}
	if err := WritePagemap(path, short); err != nil {
		t.Fatal(err)
	}
	got, err := ReadPagemap(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.PagesID != 2 || len(got.Entries) != 1 || !proto.Equal(got.Entries[0], short.Entries[0]) {
		t.Errorf("after rewriting a shorter pagemap read back %d %v", got.PagesID, got.Entries)
	}
}

func TestVMAsWriteRead(t *testing.T) {
	for _, c := range []struct {
		name string
		vmas []*VMA
	}{
		{"none", nil},
		{"one", []*VMA{testVMA(0x1000, 0x4000, unix.PROT_READ|unix.PROT_WRITE, VMARegular|VMAAnonPrivate)}},
		{"several", func() []*VMA {
			file := testVMA(0x400000, 0x401000, unix.PROT_READ|unix.PROT_EXEC, VMARegular|1<<6)
			file.Shmid, file.Pgoff, file.Fd = proto.Uint64(12), proto.Uint64(0x2000), proto.Int64(3)
			file.Madv, file.Fdflags = proto.Uint64(1<<unix.MADV_DONTDUMP), proto.Uint32(unix.O_RDONLY)
			return []*VMA{
				file,
				testVMA(0x600000, 0x800000, unix.PROT_READ|unix.PROT_WRITE, VMARegular|VMAAnonPrivate|VMAHeap),
				testVMA(0x7ffc0000_0000, 0x7ffc0002_1000, unix.PROT_READ|unix.PROT_WRITE, VMARegular|VMAAnonPrivate|VMAStack),
			}
		}()},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "mm-1.img")
			if err := WriteVMAs(path, c.vmas); err != nil {
				t.Fatal(err)
			}
			got, err := ReadVMAs(path)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(c.vmas) {
				t.Fatalf("%d mappings read back, wrote %d", len(got), len(c.vmas))
			}
			for i := range got {
				if !proto.Equal(got[i], c.vmas[i]) {
					t.Errorf("mapping %d read back as %v, wrote %v", i, got[i], c.vmas[i])
				}
			}
		})
	}
	// A mapping without a field CRIU requires is not written.
	noStatus := testVMA(0x1000, 0x2000, unix.PROT_READ, VMARegular)
	noStatus.Status = nil
	if err := WriteVMAs(filepath.Join(t.TempDir(), "mm-1.img"), []*VMA{noStatus}); err == nil {
		t.Error("a mapping without a status was written")
	}
}

func TestPstreeWriteRead(t *testing.T) {
	for _, pids := range [][]int{{1}, {4242, 4243, 4300}, {1 << 22}} {
		t.Run(fmt.Sprint(pids), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "pstree.img")
			if err := WritePstree(path, pids); err != nil {
				t.Fatal(err)
			}
			got, err := ReadPstree(path)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(pids) {
				t.Errorf("read back %v, wrote %v", got, pids)
			}
			// Each process leads its own group and session, with itself
			// as its one thread; the first is the parent of the rest.
			var entries []*pstree.PstreeEntry
			if err := readImage(path, magicPstree, func(_ int, payload []byte) error {
				e := &pstree.PstreeEntry{}
				entries = append(entries, e)
				return proto.Unmarshal(payload, e)
			}); err != nil {
				t.Fatal(err)
			}
			for i, e := range entries {
				wantPPID := uint32(0)
				if i > 0 {
					wantPPID = uint32(pids[0])
				}
				p := uint32(pids[i])
				if e.GetPid() != p || e.GetPpid() != wantPPID || e.GetPgid() != p || e.GetSid() != p || len(e.GetThreads()) != 1 || e.GetThreads()[0] != p {
					t.Errorf("process %d: %v", pids[i], e)
				}
			}
		})
	}
}

func TestImageWrongMagic(t *testing.T) {
	dir := t.TempDir()
	pmPath, mmPath, psPath := filepath.Join(dir, "pagemap-1.img"), filepath.Join(dir, "mm-1.img"), filepath.Join(dir, "pstree.img")
	if err := WritePagemap(pmPath, &Pagemap{PagesID: 1}); err != nil {
		t.Fatal(err)
	}
	if err := WriteVMAs(mmPath, nil); err != nil {
		t.Fatal(err)
	}
	if err := WritePstree(psPath, []int{1}); err != nil {
		t.Fatal(err)
	}
	// The pages image of a lazy or streamed dump and a raw file have no
	// common magic at all.
	rawPath := filepath.Join(dir, "raw.img")
	if err := os.WriteFile(rawPath, []byte{0xde, 0xad, 0xbe, 0xef, 0x01, 0x02, 0x03, 0x04, 0, 0, 0, 0}, 0o600); err != nil {
		t.Fatal(err)
	}
	readPM := func(p string) error { _, err := ReadPagemap(p); return err }
	readMM := func(p string) error { _, err := ReadVMAs(p); return err }
	readPS := func(p string) error { _, err := ReadPstree(p); return err }
	for _, c := range []struct {
		name  string
		read  func(string) error
		path  string
		magic string // the magic found, as the error must name it
	}{
		{"mm as pagemap", readPM, mmPath, "0x57492820"},
		{"pstree as pagemap", readPM, psPath, "0x50273030"},
		{"pagemap as mm", readMM, pmPath, "0x56084025"},
		{"pstree as mm", readMM, psPath, "0x50273030"},
		{"pagemap as pstree", readPS, pmPath, "0x56084025"},
		{"raw as pagemap", readPM, rawPath, "0xefbeadde"},
		{"raw as pstree", readPS, rawPath, "0xefbeadde"},
	} {
		err := c.read(c.path)
		if err == nil {
			t.Errorf("%s: read without an error", c.name)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, "magic") || !strings.Contains(msg, c.magic) || !strings.Contains(msg, c.path) {
			t.Errorf("%s: %q does not name the file and its magic %s", c.name, msg, c.magic)
		}
	}
}

func TestImageTruncated(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "pagemap-1.img")
	if err := WritePagemap(good, &Pagemap{PagesID: 1, Entries: []*PagemapEntry{
		{Vaddr: proto.Uint64(0x1000), NrPages: proto.Uint32(1), Flags: proto.Uint32(PagePresent)},
		{Vaddr: proto.Uint64(0x5000), NrPages: proto.Uint32(7), Flags: proto.Uint32(PagePresent)},
	}}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	// Where the last entry starts: walk the length prefixes.
	var last int
	for at := 8; at < len(data); at += 4 + int(binary.LittleEndian.Uint32(data[at:])) {
		last = at
	}
	for _, c := range []struct {
		name string
		data []byte
		want error // what the error wraps, if anything in particular
	}{
		{"empty", nil, io.EOF},
		{"half a magic", data[:6], io.ErrUnexpectedEOF},
		{"magics only: no head", data[:8], nil},
		{"half a length", data[:last+2], io.ErrUnexpectedEOF},
		{"length without its message", data[:last+4], nil}, // io.ReadFull says EOF: no byte of it came
		{"message cut short", data[:len(data)-1], io.ErrUnexpectedEOF},
		{"length beyond any image", append(data[:last:last], 0xff, 0xff, 0xff, 0xff), nil},
		{"message not a pagemap entry", append(data[:last:last], 3, 0, 0, 0, 0x08, 0x80, 0x20), nil}, // vaddr only: nr_pages is required
	} {
		path := filepath.Join(dir, "bad.img")
		if err := os.WriteFile(path, c.data, 0o600); err != nil {
			t.Fatal(err)
		}
		pm, err := ReadPagemap(path)
		if err == nil {
			t.Errorf("%s: read without an error: %v", c.name, pm)
			continue
		}
		if c.name == "length beyond any image" && !strings.Contains(err.Error(), "4294967295") {
			t.Errorf("%s: %q does not name the length claimed", c.name, err)
		}
		if c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want it to wrap %v", c.name, err, c.want)
		}
		if !strings.Contains(err.Error(), path) {
			t.Errorf("%s: %q does not name the file", c.name, err)
		}
	}
	// The same cut short mm and pstree images.
	mm := filepath.Join(dir, "mm-1.img")
	if err := WriteVMAs(mm, []*VMA{testVMA(0x1000, 0x2000, unix.PROT_READ, VMARegular|VMAAnonPrivate)}); err != nil {
		t.Fatal(err)
	}
	ps := filepath.Join(dir, "pstree.img")
	if err := WritePstree(ps, []int{10, 11}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		read func(string) error
	}{
		{mm, func(p string) error { _, err := ReadVMAs(p); return err }},
		{ps, func(p string) error { _, err := ReadPstree(p); return err }},
	} {
		data, err := os.ReadFile(c.path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(c.path, data[:len(data)-3], 0o600); err != nil {
			t.Fatal(err)
		}
		if err := c.read(c.path); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("%s cut short: %v", filepath.Base(c.path), err)
		}
	}
}

func TestPresent(t *testing.T) {
	for _, c := range []struct {
		name     string
		flags    *uint32
		inParent *bool
		want     bool
	}{
		{"no flags, no in_parent", nil, nil, true},
		{"no flags, in_parent false", nil, proto.Bool(false), true},
		{"no flags, in_parent", nil, proto.Bool(true), false},
		{"present", proto.Uint32(PagePresent), nil, true},
		{"present and lazy", proto.Uint32(PagePresent | PageLazy), nil, true},
		{"lazy only", proto.Uint32(PageLazy), nil, false},
		{"in parent flag", proto.Uint32(PageInParent), nil, false},
		{"flags zero", proto.Uint32(0), nil, false},
		// With flags, they alone decide: the old in_parent field is
		// not looked at.
		{"flags zero, in_parent false", proto.Uint32(0), proto.Bool(false), false},
		{"present flag, in_parent", proto.Uint32(PagePresent), proto.Bool(true), true},
		{"in parent flag, in_parent", proto.Uint32(PageInParent), proto.Bool(true), false},
	} {
		e := &PagemapEntry{Vaddr: proto.Uint64(0x1000), NrPages: proto.Uint32(1), Flags: c.flags, InParent: c.inParent}
		if got := Present(e); got != c.want {
			t.Errorf("%s: Present = %v, want %v", c.name, got, c.want)
		}
	}
}
