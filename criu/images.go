package criu

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	criu_core "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/memfd"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/mm"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/vma"
	"github.com/checkpoint-restore/go-criu/v7/magic"
	"google.golang.org/protobuf/proto"
)

// CRIU's image files (images/*.img) begin with two 32-bit magics, the
// common one and the image's own, followed by entries, each a 32-bit
// little-endian length and a protobuf message. A pagemap image's first
// entry is a pagemap_head, every other a pagemap_entry.
const (
	magicCommon  = 0x54564319
	magicPagemap = 0x56084025
	magicMM      = 0x57492820
	magicPstree  = 0x50273030
)

// Flags of a pagemap entry (criu/include/pagemap.h).
const (
	PageInParent = 1 << 0 // the pages are in a parent (incremental) image
	PageLazy     = 1 << 1 // the pages may be restored lazily
	PagePresent  = 1 << 2 // the pages are in this checkpoint's pages image
)

// Bits of a VMA's status (criu/include/image.h).
const (
	VMARegular     = 1 << 0
	VMAStack       = 1 << 1
	VMAHeap        = 1 << 5
	VMAAnonPrivate = 1 << 9
)

// PageSize is the page size CRIU's images count in (x86-64, arm64 with
// 4 KiB pages).
const PageSize = 4096

// PagemapEntry is one run of pages of a pagemap image.
type PagemapEntry = pagemap.PagemapEntry

// VMA is one mapping of a process as CRIU recorded it.
type VMA = vma.VmaEntry

// Present says whether the pages of e are in the pages image (rather than
// in a parent image, or nowhere); images older than the flags field mark
// parent pages with in_parent only.
func Present(e *PagemapEntry) bool {
	if e.Flags != nil {
		return e.GetFlags()&PagePresent != 0
	}
	return !e.GetInParent()
}

// Pagemap is a pagemap-PID.img: which pages of a process were dumped, in
// the order their bytes lie in pages-PagesID.img.
type Pagemap struct {
	PagesID uint32
	Entries []*PagemapEntry
}

// ReadPagemap reads a pagemap image.
func ReadPagemap(path string) (*Pagemap, error) {
	var pm *Pagemap
	err := readImage(path, magicPagemap, func(i int, payload []byte) error {
		if i == 0 {
			var head pagemap.PagemapHead
			if err := proto.Unmarshal(payload, &head); err != nil {
				return err
			}
			pm = &Pagemap{PagesID: head.GetPagesId()}
			return nil
		}
		e := &pagemap.PagemapEntry{}
		if err := proto.Unmarshal(payload, e); err != nil {
			return err
		}
		pm.Entries = append(pm.Entries, e)
		return nil
	})
	if err == nil && pm == nil {
		err = fmt.Errorf("%s: no pagemap head", path)
	}
	return pm, err
}

// WritePagemap writes pm as a pagemap image at path, replacing what is
// there.
func WritePagemap(path string, pm *Pagemap) error {
	msgs := []proto.Message{&pagemap.PagemapHead{PagesId: proto.Uint32(pm.PagesID)}}
	for _, e := range pm.Entries {
		msgs = append(msgs, e)
	}
	return writeImage(path, magicPagemap, msgs)
}

// ReadVMAs reads the mappings of a process from its mm-PID.img.
func ReadVMAs(path string) ([]*VMA, error) {
	var vmas []*VMA
	err := readImage(path, magicMM, func(_ int, payload []byte) error {
		var e mm.MmEntry
		if err := proto.Unmarshal(payload, &e); err != nil {
			return err
		}
		vmas = append(vmas, e.GetVmas()...)
		return nil
	})
	return vmas, err
}

// WriteVMAs writes an mm image holding only the mappings vmas (tests
// build images with it).
func WriteVMAs(path string, vmas []*VMA) error {
	var zero uint64
	e := &mm.MmEntry{Vmas: vmas, MmStartCode: &zero, MmEndCode: &zero, MmStartData: &zero, MmEndData: &zero,
		MmStartStack: &zero, MmStartBrk: &zero, MmBrk: &zero, MmArgStart: &zero, MmArgEnd: &zero, MmEnvStart: &zero, MmEnvEnd: &zero, ExeFileId: new(uint32)}
	return writeImage(path, magicMM, []proto.Message{e})
}

// WritePstree writes a pstree image of the processes pids, each its own
// session and group leader, the first the parent of the others (tests
// build images with it).
func WritePstree(path string, pids []int) error {
	var msgs []proto.Message
	for i, pid := range pids {
		ppid := uint32(0)
		if i > 0 {
			ppid = uint32(pids[0])
		}
		p := uint32(pid)
		msgs = append(msgs, &pstree.PstreeEntry{Pid: &p, Ppid: &ppid, Pgid: &p, Sid: &p, Threads: []uint32{p}})
	}
	return writeImage(path, magicPstree, msgs)
}

// ReadPstree reads the PIDs of a dumped tree from pstree.img, parents
// before their children.
func ReadPstree(path string) ([]int, error) {
	var pids []int
	err := readImage(path, magicPstree, func(_ int, payload []byte) error {
		var e pstree.PstreeEntry
		if err := proto.Unmarshal(payload, &e); err != nil {
			return err
		}
		pids = append(pids, int(e.GetPid()))
		return nil
	})
	return pids, err
}

// maxImageEntry bounds one entry of an image read here: an mm image of a
// process with many mappings is the largest, at some hundred bytes per
// mapping.
const maxImageEntry = 256 << 20

func readImage(path string, magic uint32, fn func(i int, payload []byte) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<16)
	var head [8]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if got, want := [2]uint32{binary.LittleEndian.Uint32(head[:4]), binary.LittleEndian.Uint32(head[4:])}, [2]uint32{magicCommon, magic}; got != want {
		return fmt.Errorf("%s: magic %#x/%#x, want %#x/%#x", path, got[0], got[1], want[0], want[1])
	}
	for i := 0; ; i++ {
		var size [4]byte
		if _, err := io.ReadFull(r, size[:]); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("%s: entry %d: %w", path, i, err)
		}
		n := binary.LittleEndian.Uint32(size[:])
		if n > maxImageEntry {
			return fmt.Errorf("%s: entry %d claims %d bytes", path, i, n)
		}
		payload := make([]byte, n)
		if _, err := io.ReadFull(r, payload); err != nil {
			return fmt.Errorf("%s: entry %d: %w", path, i, err)
		}
		if err := fn(i, payload); err != nil {
			return fmt.Errorf("%s: entry %d: %w", path, i, err)
		}
	}
}

func writeImage(path string, magic uint32, msgs []proto.Message) error {
	out := binary.LittleEndian.AppendUint32(nil, magicCommon)
	out = binary.LittleEndian.AppendUint32(out, magic)
	for _, m := range msgs {
		payload, err := proto.Marshal(m)
		if err != nil {
			return err
		}
		out = binary.LittleEndian.AppendUint32(out, uint32(len(payload)))
		out = append(out, payload...)
	}
	return os.WriteFile(path, out, 0o600)
}

// Bits of a VMA's status that say what backs it (criu/include/image.h).
const (
	VMAVsyscall   = 1 << 2
	VMAVDSO       = 1 << 3
	VMAAnonShared = 1 << 8
	VMASysVIPC    = 1 << 10
	VMASocket     = 1 << 11
	VMAVVAR       = 1 << 12
	VMAAIORing    = 1 << 13
	VMAMemfd      = 1 << 14
	VMAShadowStk  = 1 << 15
)

// imageMagic is the magic of CRIU's image kind name, from go-criu's table.
func imageMagic(name string) uint32 {
	magicOnce.Do(func() { magics = magic.LoadMagic() })
	return uint32(magics.ByName[name])
}

var (
	magicOnce sync.Once
	magics    magic.MagicMap
)

// readEntries reads every entry of an image of kind name (its magic) as a
// T; a missing image reads as none.
func readEntries[T proto.Message](path, name string, newT func() T) ([]T, error) {
	var out []T
	err := readImage(path, imageMagic(name), func(_ int, payload []byte) error {
		e := newT()
		if err := proto.Unmarshal(payload, e); err != nil {
			return err
		}
		out = append(out, e)
		return nil
	})
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return out, err
}

// ReadMemfdShmids reads, from files.img and memfd.img, the shmid (the
// pagemap-shmem-SHMID.img holding its contents) of every memfd file
// of the tree, by the file's ID (what a memfd mapping's VMA names in its
// shmid, and what an fdinfo entry names).
func ReadMemfdShmids(images string) (map[uint32]uint32, error) {
	inodes, err := readEntries(filepath.Join(images, "memfd.img"), "MEMFD_INODE", func() *memfd.MemfdInodeEntry { return &memfd.MemfdInodeEntry{} })
	if err != nil {
		return nil, err
	}
	shmidOf := map[uint64]uint32{}
	for _, in := range inodes {
		shmidOf[in.GetInodeId()] = in.GetShmid()
	}
	files, err := readEntries(filepath.Join(images, "files.img"), "FILES", func() *fdinfo.FileEntry { return &fdinfo.FileEntry{} })
	if err != nil {
		return nil, err
	}
	out := map[uint32]uint32{}
	for _, f := range files {
		if f.GetType() != fdinfo.FdTypes_MEMFD || f.GetMemfd() == nil {
			continue
		}
		if shmid, ok := shmidOf[uint64(f.GetMemfd().GetInodeId())]; ok {
			out[f.GetId()] = shmid
		}
	}
	return out, nil
}

// ReadMemfdFds reads which descriptors of process pid (as in its images)
// are memfds: descriptor to file ID (see ReadMemfdShmids).
func ReadMemfdFds(images string, pid int) (map[int]uint32, error) {
	ids, err := readEntries(filepath.Join(images, fmt.Sprintf("ids-%d.img", pid)), "IDS", func() *criu_core.TaskKobjIdsEntry { return &criu_core.TaskKobjIdsEntry{} })
	if err != nil || len(ids) == 0 {
		return nil, err
	}
	fds, err := readEntries(filepath.Join(images, fmt.Sprintf("fdinfo-%d.img", ids[0].GetFilesId())), "FDINFO", func() *fdinfo.FdinfoEntry { return &fdinfo.FdinfoEntry{} })
	if err != nil {
		return nil, err
	}
	out := map[int]uint32{}
	for _, fd := range fds {
		if fd.GetType() == fdinfo.FdTypes_MEMFD {
			out[int(fd.GetFd())] = fd.GetId()
		}
	}
	return out, nil
}

// ShmemPagemapPrefix begins the names of the pagemaps of shared memory
// contents: pagemap-shmem-SHMID.img, whose entries' addresses are offsets
// into the shared memory object.
const ShmemPagemapPrefix = "pagemap-shmem-"
