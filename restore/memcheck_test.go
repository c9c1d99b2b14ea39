package restore

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
	"sort"
	"strings"
	"testing"
	"unsafe"

	"github.com/stasis-ckpt/stasis/criu"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// ownMemory is a memory map of this test process: a private mapping of
// six pages whose pagemap lists pages 1-2 and 4-5 (pages-1.img), and a
// memfd of three pages, mapped shared at its second page and held open
// (pages-2.img, pagemap-shmem-7.img).
type ownMemory struct {
	priv, shared []byte
	fd           int
	mm           *memoryMap
	digests      *pageDigests
}

func newOwnMemory(t *testing.T) *ownMemory {
	t.Helper()
	priv, err := unix.Mmap(-1, 0, 6*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(priv) })
	rand.Read(priv)
	clear(priv[4*page : 5*page]) // a page of zeros
	fd, err := unix.MemfdCreate("memcheck-test", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	contents := make([]byte, 3*page-100) // its last page ends early
	rand.Read(contents)
	if _, err := unix.Pwrite(fd, contents, 0); err != nil {
		t.Fatal(err)
	}
	shared, err := unix.Mmap(fd, page, 2*page, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(shared) })

	at := func(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }
	present := proto.Uint32(criu.PagePresent)
	const memfdFile = 3
	mm := &memoryMap{
		procs: []procMemory{{
			pid: 1,
			vmas: []*criu.VMA{
				mapping(at(priv), at(priv)+6*page, protRW, stAnon),
				{Start: proto.Uint64(at(shared)), End: proto.Uint64(at(shared) + 2*page), Pgoff: proto.Uint64(page), Shmid: proto.Uint64(memfdFile),
					Prot: proto.Uint32(protR), Status: proto.Uint32(criu.VMARegular | criu.VMAMemfd | 1<<7 /* VMA_FILE_SHARED */), Flags: proto.Uint32(unix.MAP_SHARED), Fd: proto.Int64(-1)},
			},
			pages: &criu.Pagemap{PagesID: 1, Entries: []*criu.PagemapEntry{
				pages(at(priv)+page, 2, present, nil), pages(at(priv)+4*page, 2, present, nil)}},
			memfds: map[int]uint32{fd: memfdFile},
		}},
		shmem:      map[uint64]*criu.Pagemap{7: {PagesID: 2, Entries: []*criu.PagemapEntry{pages(0, 3, present, nil)}}},
		memfdShmid: map[uint32]uint32{memfdFile: 7},
	}
	v := mm.procs[0].vmas
	sort.Slice(v, func(i, j int) bool { return v[i].GetStart() < v[j].GetStart() }) // as readMemoryMap does
	d := newPageDigests()
	d.addImage("pages-1.img", 4*page)
	d.addImage("pages-2.img", 3*page)
	// As the store hands bytes over: in parts that split pages.
	img1 := append(append([]byte(nil), priv[page:3*page]...), priv[4*page:6*page]...)
	d.record("pages-1.img", 0, img1[:page+10])
	d.record("pages-1.img", page+10, img1[page+10:])
	img2 := make([]byte, 3*page)
	copy(img2, contents)
	d.record("pages-2.img", 0, img2)
	return &ownMemory{priv: priv, shared: shared, fd: fd, mm: mm, digests: d}
}

func self(int) (int, error) { return os.Getpid(), nil }

func TestCheckMemory(t *testing.T) {
	o := newOwnMemory(t)
	st, err := checkMemory(context.Background(), o.mm, o.digests, self)
	if err != nil {
		t.Fatal(err)
	}
	// Four private pages, the two memfd pages mapped, its three pages
	// through the descriptor.
	if st.Bytes != 9*page || st.UnmappedShared != 0 {
		t.Errorf("checked %d bytes, %d unmapped shared; want %d and 0", st.Bytes, st.UnmappedShared, 9*page)
	}

	// A page not in the pagemap may change; one in it may not.
	o.priv[3*page] ^= 1
	if _, err := checkMemory(context.Background(), o.mm, o.digests, self); err != nil {
		t.Errorf("a page the pagemap leaves out changed: %v", err)
	}
	o.priv[5*page+77] ^= 1
	_, err = checkMemory(context.Background(), o.mm, o.digests, self)
	if !errors.Is(err, ErrMemoryMismatch) || !strings.Contains(err.Error(), "page at 0x") {
		t.Fatalf("a wrong byte in a listed page: %v, want ErrMemoryMismatch naming the page", err)
	}
	o.priv[5*page+77] ^= 1

	// Shared memory that differs.
	if _, err := unix.Pwrite(o.fd, []byte{0xff ^ o.shared[page+5]}, 2*page+5); err != nil {
		t.Fatal(err)
	}
	if _, err := checkMemory(context.Background(), o.mm, o.digests, self); !errors.Is(err, ErrMemoryMismatch) || !strings.Contains(err.Error(), "shared mapping") && !strings.Contains(err.Error(), "memfd") {
		t.Errorf("wrong shared memory: %v", err)
	}
}

// TestCheckMemoryUnseenPage: a page whose bytes never came from the store
// (a pages image nothing wrote out) fails the check whatever it holds.
func TestCheckMemoryUnseenPage(t *testing.T) {
	o := newOwnMemory(t)
	o.digests.images["pages-2.img"].seen[1] = false
	if _, err := checkMemory(context.Background(), o.mm, o.digests, self); !errors.Is(err, ErrMemoryMismatch) || !strings.Contains(err.Error(), "never came from the store") {
		t.Errorf("%v, want ErrMemoryMismatch: never came from the store", err)
	}
	// Shared memory nobody maps or holds is counted, not checked.
	o = newOwnMemory(t)
	var private []*criu.VMA
	for _, v := range o.mm.procs[0].vmas {
		if v.GetStatus()&criu.VMAMemfd == 0 {
			private = append(private, v)
		}
	}
	o.mm.procs[0].vmas = private
	o.mm.procs[0].memfds = nil
	st, err := checkMemory(context.Background(), o.mm, o.digests, self)
	if err != nil || st.UnmappedShared != 3*page || st.Bytes != 4*page {
		t.Errorf("checked %d, unmapped shared %d (%v); want %d and %d", st.Bytes, st.UnmappedShared, err, 4*page, 3*page)
	}
}

// TestCheckMemoryPrivateMemfd: a private mapping of a memfd (zdtm's
// shmemfd-priv) shows the process's own copies of the pages it wrote, not
// the memfd's contents: it is not checked against them.
func TestCheckMemoryPrivateMemfd(t *testing.T) {
	o := newOwnMemory(t)
	priv, err := unix.Mmap(o.fd, 0, 2*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(priv)
	priv[10] ^= 0xff // this process's copy now differs from the memfd
	start := uint64(uintptr(unsafe.Pointer(&priv[0])))
	v := &o.mm.procs[0].vmas
	*v = append(*v, &criu.VMA{Start: proto.Uint64(start), End: proto.Uint64(start + 2*page), Pgoff: proto.Uint64(0), Shmid: proto.Uint64(3),
		Prot: proto.Uint32(protRW), Status: proto.Uint32(criu.VMARegular | criu.VMAMemfd | 1<<6 /* VMA_FILE_PRIVATE */), Flags: proto.Uint32(unix.MAP_PRIVATE), Fd: proto.Int64(-1)})
	sort.Slice(*v, func(i, j int) bool { return (*v)[i].GetStart() < (*v)[j].GetStart() })
	st, err := checkMemory(context.Background(), o.mm, o.digests, self)
	if err != nil || st.Bytes != 9*page {
		t.Fatalf("checked %d bytes: %v; want %d, the private mapping left out", st.Bytes, err, 9*page)
	}
}
