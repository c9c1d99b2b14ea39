package restore

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/criu"
	"github.com/stasis-ckpt/stasis/internal/failpoint"
	"golang.org/x/sys/unix"
)

// A filled restore (PagesFill) splits each process's memory in two. CRIU
// restores the pages of file mappings, read-only memory and the like from
// a pages image rewritten to hold only those, and the contents of shared
// memory (shared anonymous mappings, memfds) from their own pages images,
// whole; the pages of private
// anonymous writable memory (the heap, the stacks, what malloc and the
// CUDA checkpoint hold: nearly all of a training job's bytes) are left
// out of its pagemap, so it maps that memory fresh (all zeros), and
// stasis writes them into the tree itself once CRIU has rebuilt it and
// before it lets it run (CRIU's post-restore notification): chunks read,
// verified and decoded on every core, each written straight into its
// process with process_vm_writev. Pages that are all zeros are not
// written at all. CRIU alone copies a tree's memory on one thread.

// fillable says whether the pages of v are left to stasis: private
// anonymous memory the process may write, and nothing else CRIU marks
// (shared, file-backed, vDSO, AIO rings, shadow stacks and the like).
func fillable(v *criu.VMA) bool {
	const plain = criu.VMARegular | criu.VMAStack | criu.VMAHeap | criu.VMAAnonPrivate
	st := v.GetStatus()
	return st&criu.VMARegular != 0 && st&criu.VMAAnonPrivate != 0 && st&^plain == 0 &&
		v.GetProt()&unix.PROT_WRITE != 0
}

// piece is a run of bytes of a pages image, by where it lies in a data
// file's decoded stream, and where it goes: into process pid's memory at
// addr (fill), or into out at outOff (the pages CRIU restores).
type piece struct {
	catalog.Extent
	// image is the pages image the bytes are of, and imageOff where they
	// lie in it.
	image    string
	imageOff int64
	pid      int
	addr     uint64
	out      *os.File
	outOff   int64
}

// fillPlan is what a filled restore does with the memory images.
type fillPlan struct {
	fill []piece // written into the tree at post-restore (writeFilled)
	keep []piece // written to the rewritten pages images before CRIU runs
	// FillBytes and KeepBytes count the bytes of each.
	FillBytes, KeepBytes int64
	outs                 []*os.File
	// memory is where the images say each page lies, read before any is
	// rewritten, and digests the digest of each page, taken as the bytes
	// go by: checkMemory compares the two in the restored tree.
	memory  *memoryMap
	digests *pageDigests
}

func (p *fillPlan) close() {
	for _, f := range p.outs {
		f.Close()
	}
}

// planFill reads the pstree, mm and pagemap images unpacked into images,
// rewrites each process's pagemap without its fillable pages, and creates
// its pages image for the pages left to CRIU (written by writeKept).
func planFill(m *catalog.Manifest, images string) (*fillPlan, error) {
	pagesEntries := map[string]catalog.Entry{}
	for _, e := range m.Entries {
		if memoryImage(e) {
			pagesEntries[e.Path] = e
		}
	}
	pids, err := criu.ReadPstree(filepath.Join(images, "pstree.img"))
	if err != nil {
		return nil, err
	}
	memory, err := readMemoryMap(images, pids)
	if err != nil {
		return nil, err
	}
	plan := &fillPlan{memory: memory, digests: newPageDigests()}
	for name, e := range pagesEntries {
		plan.digests.addImage(name, e.Size)
	}
	claimed := map[string]bool{}
	for i := range memory.procs {
		if err := plan.addProcess(images, &memory.procs[i], pagesEntries, claimed); err != nil {
			plan.close()
			return nil, err
		}
	}
	// The pages images no process's pagemap names hold the contents of
	// shared memory: MAP_SHARED|MAP_ANONYMOUS mappings, System V shared
	// memory and memfds (CRIU's pagemap-shmem-ID.img name them). CRIU
	// restores those itself, from the whole image.
	names := make([]string, 0, len(pagesEntries))
	for name := range pagesEntries {
		if !claimed[name] {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		if err := plan.keepWhole(images, pagesEntries[name]); err != nil {
			plan.close()
			return nil, err
		}
	}
	return plan, nil
}

// keepWhole has the pages image e written out whole for CRIU.
func (p *fillPlan) keepWhole(images string, e catalog.Entry) error {
	out, err := os.OpenFile(filepath.Join(images, e.Path), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	p.outs = append(p.outs, out)
	if e.Size > 0 {
		p.keep = append(p.keep, piece{Extent: catalog.Extent{File: e.File, Offset: e.Offset, Size: e.Size}, image: e.Path, out: out})
		p.KeepBytes += e.Size
	}
	return nil
}

// addProcess plans the memory of process proc (its pagemap and mappings as
// readMemoryMap read them: a zombie, without memory, is not there), and
// marks the pages image its pagemap names as claimed.
func (p *fillPlan) addProcess(images string, proc *procMemory, pagesEntries map[string]catalog.Entry, claimed map[string]bool) error {
	pid, pm, vmas := proc.pid, proc.pages, proc.vmas
	pmPath := filepath.Join(images, fmt.Sprintf("pagemap-%d.img", pid))
	pagesName := fmt.Sprintf("pages-%d.img", pm.PagesID)
	e, ok := pagesEntries[pagesName]
	if !ok {
		return fmt.Errorf("%w: process %d's memory image %s is not in the checkpoint", catalog.ErrBadManifest, pid, pagesName)
	}
	if claimed[pagesName] {
		return fmt.Errorf("%w: memory image %s is named by two pagemaps", catalog.ErrBadManifest, pagesName)
	}
	claimed[pagesName] = true
	out, err := os.OpenFile(filepath.Join(images, pagesName), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	p.outs = append(p.outs, out)
	rewritten := &criu.Pagemap{PagesID: pm.PagesID}
	var inImage, kept int64 // bytes of the pages image walked, and kept
	for _, pe := range pm.Entries {
		if !criu.Present(pe) {
			rewritten.Entries = append(rewritten.Entries, pe)
			continue
		}
		addr, end := pe.GetVaddr(), pe.GetVaddr()+uint64(pe.GetNrPages())*criu.PageSize
		for addr < end {
			// The run up to the end of the mapping that holds addr (or
			// to the next mapping, if none does: CRIU then refuses the
			// image, as it would have).
			i := sort.Search(len(vmas), func(i int) bool { return vmas[i].GetEnd() > addr })
			stop, fill := end, false
			if i < len(vmas) && vmas[i].GetStart() <= addr {
				stop, fill = min(end, vmas[i].GetEnd()), fillable(vmas[i])
			} else if i < len(vmas) {
				stop = min(end, vmas[i].GetStart())
			}
			n := int64(stop - addr)
			pc := piece{Extent: catalog.Extent{File: e.File, Offset: e.Offset + inImage, Size: n}, image: pagesName, imageOff: inImage}
			if fill {
				pc.pid, pc.addr = pid, addr
				p.fill = append(p.fill, pc)
				p.FillBytes += n
			} else {
				pc.out, pc.outOff = out, kept
				p.keep = append(p.keep, pc)
				p.KeepBytes += n
				kept += n
				va, pages := addr, uint32(n/criu.PageSize)
				rewritten.Entries = append(rewritten.Entries, &criu.PagemapEntry{Vaddr: &va, NrPages: &pages, InParent: pe.InParent, Flags: pe.Flags})
			}
			inImage += n
			addr = stop
		}
	}
	if inImage != e.Size {
		return fmt.Errorf("%w: process %d's pagemap lists %d bytes of pages, its image %s holds %d", catalog.ErrBadManifest, pid, inImage, pagesName, e.Size)
	}
	return criu.WritePagemap(pmPath, rewritten)
}

// eachPart reads, verifies and decodes the chunks the pieces lie in, on
// several goroutines, and calls put for every part of a piece a chunk
// holds (concurrently: pieces never overlap).
func eachPart(ctx context.Context, s *catalog.Store, m *catalog.Manifest, pieces []piece, ro catalog.ReadOptions, put func(pc *piece, at int64, b []byte) error) error {
	extents := make([]catalog.Extent, len(pieces))
	for k, pc := range pieces {
		extents[k] = pc.Extent
	}
	return s.EachExtent(ctx, m, extents, ro, func(k int, at int64, b []byte) error {
		return put(&pieces[k], at, b)
	})
}

// writeKept writes the pages left to CRIU into the rewritten pages images.
func (p *fillPlan) writeKept(ctx context.Context, s *catalog.Store, m *catalog.Manifest, ro catalog.ReadOptions) error {
	return eachPart(ctx, s, m, p.keep, ro, func(pc *piece, at int64, b []byte) error {
		p.digests.record(pc.image, pc.imageOff+at, b)
		_, err := pc.out.WriteAt(b, pc.outOff+at)
		return err
	})
}

// fillStats count what fill wrote and what it skipped.
type fillStats struct {
	Written, Zero int64
}

// writeFilled writes the fillable pages into the restored tree: hostPID gives the
// PID, as this process sees it, of the tree's process pid (the images'
// PID). Pages that are all zeros are skipped: CRIU mapped that memory
// fresh.
func (p *fillPlan) writeFilled(ctx context.Context, s *catalog.Store, m *catalog.Manifest, ro catalog.ReadOptions, hostPID func(pid int) (int, error)) (fillStats, error) {
	hosts := map[int]int{}
	for _, pc := range p.fill {
		if _, ok := hosts[pc.pid]; ok {
			continue
		}
		h, err := hostPID(pc.pid)
		if err != nil {
			return fillStats{}, err
		}
		hosts[pc.pid] = h
	}
	var written, zero atomic.Int64
	var wrongOnce sync.Once
	err := eachPart(ctx, s, m, p.fill, ro, func(pc *piece, at int64, b []byte) error {
		p.digests.record(pc.image, pc.imageOff+at, b)
		if failpoint.Active(failpoint.FillWrongPage) {
			wrongOnce.Do(func() { b = append([]byte(nil), b...); b[len(b)/2] ^= 0x5A })
		}
		w, z, err := writeMemory(hosts[pc.pid], pc.addr+uint64(at), b)
		written.Add(w)
		zero.Add(z)
		if err != nil {
			return fmt.Errorf("process %d (PID %d here): %w", pc.pid, hosts[pc.pid], err)
		}
		return nil
	})
	return fillStats{Written: written.Load(), Zero: zero.Load()}, err
}

// maxIov is how many ranges one process_vm_writev takes (UIO_MAXIOV).
const maxIov = 1024

// writeMemory writes b into process pid at addr, leaving out the pages
// (whole or in part, as b covers them) that are all zeros. It returns the
// bytes written and skipped.
func writeMemory(pid int, addr uint64, b []byte) (written, zero int64, err error) {
	var local []unix.Iovec
	var remote []unix.RemoteIovec
	var pending int
	flush := func() error {
		if len(local) == 0 {
			return nil
		}
		n, err := unix.ProcessVMWritev(pid, local, remote, 0)
		if err != nil {
			return fmt.Errorf("write %d bytes at %#x: %w", pending, remote[0].Base, err)
		}
		if n != pending {
			return fmt.Errorf("wrote %d of %d bytes at %#x", n, pending, remote[0].Base)
		}
		written += int64(n)
		local, remote, pending = local[:0], remote[:0], 0
		return nil
	}
	for len(b) > 0 {
		// Up to the next page boundary of the target.
		n := min(len(b), criu.PageSize-int(addr%criu.PageSize))
		part := b[:n]
		if catalog.AllZero(part) {
			zero += int64(n)
		} else if k := len(local); k > 0 && remote[k-1].Base+uintptr(remote[k-1].Len) == uintptr(addr) &&
			uintptr(unsafe.Pointer(local[k-1].Base))+uintptr(local[k-1].Len) == uintptr(unsafe.Pointer(&part[0])) {
			local[k-1].Len += uint64(n)
			remote[k-1].Len += n
			pending += n
		} else {
			if k == maxIov {
				if err := flush(); err != nil {
					return written, zero, err
				}
			}
			iov := unix.Iovec{Base: &part[0]}
			iov.SetLen(n)
			local = append(local, iov)
			remote = append(remote, unix.RemoteIovec{Base: uintptr(addr), Len: n})
			pending += n
		}
		b, addr = b[n:], addr+uint64(n)
	}
	return written, zero, flush()
}

// imagePIDs maps the tree's PIDs (as in its images) to this namespace's:
// the same PIDs, unless the tree went into a new PID namespace whose init
// is init.
func imagePIDs(init int) func(pid int) (int, error) {
	return func(pid int) (int, error) {
		if init == 0 {
			return pid, nil
		}
		if host, ok := hostPIDOf(init, pid); ok {
			return host, nil
		}
		return 0, fmt.Errorf("process %d of the restored tree is not found in its PID namespace", pid)
	}
}
