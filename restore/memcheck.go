package restore

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/stasis-ckpt/stasis/criu"
	"golang.org/x/sys/unix"
)

// A filled restore checks, before the tree runs, that its memory is what
// was checkpointed: every page of every memory image (the pages stasis
// filled, the pages CRIU restored itself, the contents of shared memory
// and memfds), found in the restored processes where the images say it
// lies, not where the fill plan put it. Each page's digest is taken as its
// bytes come from the store (verified there against their chunk's
// checksum) on their way to the tree or to CRIU; the check then reads the
// restored processes' memory (/proc/PID/mem, which reads inaccessible
// mappings too; process_vm_readv first, which copies once) and compares. A page that differs, or that never came
// from the store, fails the restore, and CRIU undoes it.

// ErrMemoryMismatch is returned when the restored memory is not what was
// checkpointed.
var ErrMemoryMismatch = errors.New("restored memory differs from the checkpoint")

// pageDigests holds a digest of every page of the memory images, by
// image, taken as the bytes pass from the store to the tree or to CRIU.
type pageDigests struct {
	seed   maphash.Seed
	images map[string]*imageDigests
	mu     sync.Mutex
	// split holds the pages whose bytes come in two parts (a chunk of
	// the data file ends inside them) until both are there.
	split map[splitKey]*splitPage
}

type imageDigests struct {
	sums []uint64
	seen []bool // distinct goroutines set distinct pages
}

type splitKey struct {
	image string
	page  int64
}

type splitPage struct {
	buf  [criu.PageSize]byte
	have int
}

func newPageDigests() *pageDigests {
	return &pageDigests{seed: maphash.MakeSeed(), images: map[string]*imageDigests{}, split: map[splitKey]*splitPage{}}
}

// addImage makes room for the digests of a pages image of size bytes.
func (d *pageDigests) addImage(name string, size int64) {
	n := size / criu.PageSize
	d.images[name] = &imageDigests{sums: make([]uint64, n), seen: make([]bool, n)}
}

// record takes the digests of the pages b covers, b lying at off in image.
func (d *pageDigests) record(image string, off int64, b []byte) {
	img := d.images[image]
	if img == nil {
		return
	}
	for len(b) > 0 {
		page, in := off/criu.PageSize, int(off%criu.PageSize)
		n := min(len(b), criu.PageSize-in)
		if page >= int64(len(img.sums)) {
			return // beyond the image: planFill refused such an image
		}
		if n == criu.PageSize {
			img.sums[page], img.seen[page] = maphash.Bytes(d.seed, b[:n]), true
		} else {
			d.recordSplit(img, splitKey{image, page}, in, b[:n])
		}
		b, off = b[n:], off+int64(n)
	}
}

func (d *pageDigests) recordSplit(img *imageDigests, k splitKey, in int, part []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	sp := d.split[k]
	if sp == nil {
		sp = &splitPage{}
		d.split[k] = sp
	}
	copy(sp.buf[in:], part)
	if sp.have += len(part); sp.have == criu.PageSize {
		img.sums[k.page], img.seen[k.page] = maphash.Bytes(d.seed, sp.buf[:]), true
		delete(d.split, k)
	}
}

// memoryMap is where the memory images say each page of the tree lies:
// read from the images before the fill plan rewrites any of them.
type memoryMap struct {
	procs []procMemory
	// shmem holds the pagemaps of shared memory contents, by shmid, and
	// memfdShmid the shmid of each memfd file, by file ID.
	shmem      map[uint64]*criu.Pagemap
	memfdShmid map[uint32]uint32
}

type procMemory struct {
	pid   int
	vmas  []*criu.VMA // sorted by start
	pages *criu.Pagemap
	// memfds are the process's descriptors that are memfds, to file IDs.
	memfds map[int]uint32
}

// readMemoryMap reads the memory map of the tree from its images.
func readMemoryMap(images string, pids []int) (*memoryMap, error) {
	mm := &memoryMap{shmem: map[uint64]*criu.Pagemap{}}
	for _, pid := range pids {
		pm, err := criu.ReadPagemap(filepath.Join(images, fmt.Sprintf("pagemap-%d.img", pid)))
		if errors.Is(err, os.ErrNotExist) {
			continue // a zombie
		} else if err != nil {
			return nil, err
		}
		vmas, err := criu.ReadVMAs(filepath.Join(images, fmt.Sprintf("mm-%d.img", pid)))
		if err != nil {
			return nil, err
		}
		sort.Slice(vmas, func(i, j int) bool { return vmas[i].GetStart() < vmas[j].GetStart() })
		fds, err := criu.ReadMemfdFds(images, pid)
		if err != nil {
			return nil, err
		}
		mm.procs = append(mm.procs, procMemory{pid: pid, vmas: vmas, pages: pm, memfds: fds})
	}
	names, err := filepath.Glob(filepath.Join(images, criu.ShmemPagemapPrefix+"*.img"))
	if err != nil {
		return nil, err
	}
	for _, name := range names {
		id, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(name), criu.ShmemPagemapPrefix), ".img"), 10, 64)
		if err != nil {
			continue
		}
		if mm.shmem[id], err = criu.ReadPagemap(name); err != nil {
			return nil, err
		}
	}
	if mm.memfdShmid, err = criu.ReadMemfdShmids(images); err != nil {
		return nil, err
	}
	return mm, nil
}

// checked reports what checkMemory read.
type checked struct {
	Bytes int64
	// UnmappedShared counts the bytes of shared memory contents that no
	// process maps or holds open as a memfd (CRIU restores them only for
	// a SysV segment nobody attached): not checked.
	UnmappedShared int64
}

// pageRun is a run of pages to check: n pages of image, from page first
// on, at addr in process host (as this PID namespace sees it), or at
// offset addr of its descriptor fd when fd >= 0.
type pageRun struct {
	host, imagePID int
	fd             int
	addr           uint64
	image          string
	first, n       int64
	what           string
}

// skipCheck says whether the pages CRIU dumped of v are not restored as
// they were: the vDSO and its data (the running kernel's are mapped
// instead), AIO rings and shadow stacks (rebuilt by the kernel).
func skipCheck(v *criu.VMA) bool {
	return v.GetStatus()&(criu.VMAVDSO|criu.VMAVVAR|criu.VMAVsyscall|criu.VMAAIORing|criu.VMAShadowStk) != 0
}

// runs lists the runs of pages to check: every present page of every
// process's pagemap where its mapping holds it, and every page of shared
// memory wherever a process maps it or holds it open.
func (mm *memoryMap) runs(hostPID func(int) (int, error)) ([]pageRun, checked, error) {
	var out []pageRun
	var st checked
	const most = 1024 // pages a run holds at most: runs are checked in parallel
	add := func(r pageRun) {
		for r.n > 0 {
			k := min(r.n, most)
			c := r
			c.n = k
			out = append(out, c)
			r.first, r.n, r.addr = r.first+k, r.n-k, r.addr+uint64(k)*criu.PageSize
		}
	}
	shmemSeen := map[uint64]map[int64]bool{} // shmid: pages checked somewhere
	mark := func(shmid uint64, page int64) {
		if shmemSeen[shmid] == nil {
			shmemSeen[shmid] = map[int64]bool{}
		}
		shmemSeen[shmid][page] = true
	}
	for _, p := range mm.procs {
		host, err := hostPID(p.pid)
		if err != nil {
			return nil, st, err
		}
		image := fmt.Sprintf("pages-%d.img", p.pages.PagesID)
		var page int64 // in image
		for _, e := range p.pages.Entries {
			if !criu.Present(e) {
				continue
			}
			start, end := e.GetVaddr(), e.GetVaddr()+uint64(e.GetNrPages())*criu.PageSize
			for addr := start; addr < end; {
				i := sort.Search(len(p.vmas), func(i int) bool { return p.vmas[i].GetEnd() > addr })
				stop, v := end, (*criu.VMA)(nil)
				if i < len(p.vmas) && p.vmas[i].GetStart() <= addr {
					stop, v = min(end, p.vmas[i].GetEnd()), p.vmas[i]
				} else if i < len(p.vmas) {
					stop = min(end, p.vmas[i].GetStart())
				}
				n := int64(stop-addr) / criu.PageSize
				if v != nil && !skipCheck(v) {
					add(pageRun{host: host, imagePID: p.pid, fd: -1, addr: addr, image: image, first: page, n: n,
						what: fmt.Sprintf("mapping %#x-%#x", v.GetStart(), v.GetEnd())})
					st.Bytes += n * criu.PageSize
				}
				page += n
				addr = stop
			}
		}
		// Shared memory, where this process maps it shared (a private
		// mapping of a memfd shows the process's own copies of the
		// pages it wrote, which its pagemap holds).
		for _, v := range p.vmas {
			shmid, ok := uint64(0), false
			switch {
			case v.GetFlags()&unix.MAP_SHARED == 0:
			case v.GetStatus()&criu.VMAMemfd != 0:
				var s uint32
				s, ok = mm.memfdShmid[uint32(v.GetShmid())]
				shmid = uint64(s)
			case v.GetStatus()&criu.VMAAnonShared != 0:
				shmid, ok = v.GetShmid(), true
			}
			pm := mm.shmem[shmid]
			if !ok || pm == nil {
				continue
			}
			lo, hi := v.GetPgoff(), v.GetPgoff()+(v.GetEnd()-v.GetStart())
			eachShmemRun(pm, func(off uint64, page, n int64) {
				// The part of the run [off, off+n pages) the mapping holds.
				a, b := max(off, lo), min(off+uint64(n)*criu.PageSize, hi)
				if a >= b {
					return
				}
				skip, k := int64(a-off)/criu.PageSize, int64(b-a)/criu.PageSize
				for j := range k {
					mark(shmid, page+skip+j)
				}
				add(pageRun{host: host, imagePID: p.pid, fd: -1, addr: v.GetStart() + (a - lo), image: fmt.Sprintf("pages-%d.img", pm.PagesID),
					first: page + skip, n: k, what: fmt.Sprintf("shared mapping %#x-%#x", v.GetStart(), v.GetEnd())})
				st.Bytes += k * criu.PageSize
			})
		}
		// Memfds, through the process's descriptors.
		for fd, file := range p.memfds {
			s, ok := mm.memfdShmid[file]
			pm := mm.shmem[uint64(s)]
			if !ok || pm == nil {
				continue
			}
			eachShmemRun(pm, func(off uint64, page, n int64) {
				for j := range n {
					mark(uint64(s), page+j)
				}
				add(pageRun{host: host, imagePID: p.pid, fd: fd, addr: off, image: fmt.Sprintf("pages-%d.img", pm.PagesID),
					first: page, n: n, what: fmt.Sprintf("memfd at descriptor %d", fd)})
				st.Bytes += n * criu.PageSize
			})
		}
	}
	for shmid, pm := range mm.shmem {
		eachShmemRun(pm, func(_ uint64, page, n int64) {
			for j := range n {
				if !shmemSeen[shmid][page+j] {
					st.UnmappedShared += criu.PageSize
				}
			}
		})
	}
	return out, st, nil
}

// eachShmemRun calls fn for each run of present pages of a shared memory
// pagemap: the run's offset in the object, its first page in the pages
// image, and its length in pages.
func eachShmemRun(pm *criu.Pagemap, fn func(off uint64, page, n int64)) {
	var page int64
	for _, e := range pm.Entries {
		if !criu.Present(e) {
			continue
		}
		fn(e.GetVaddr(), page, int64(e.GetNrPages()))
		page += int64(e.GetNrPages())
	}
}

// checkMemory reads the restored tree's memory and compares every page
// the memory map lists with its digest.
func checkMemory(ctx context.Context, mm *memoryMap, d *pageDigests, hostPID func(int) (int, error)) (checked, error) {
	runs, st, err := mm.runs(hostPID)
	if err != nil {
		return st, err
	}
	files := map[[2]int]*os.File{} // {host PID, fd or -1}: open for reading
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for _, r := range runs {
		k := [2]int{r.host, r.fd}
		if _, ok := files[k]; ok {
			continue
		}
		path := fmt.Sprintf("/proc/%d/mem", r.host)
		if r.fd >= 0 {
			path = fmt.Sprintf("/proc/%d/fd/%d", r.host, r.fd)
		}
		f, err := os.Open(path)
		if err != nil {
			return st, fmt.Errorf("%w: process %d (PID %d here): %v", ErrMemoryMismatch, r.imagePID, r.host, err)
		}
		files[k] = f
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 1024*criu.PageSize)
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= int64(len(runs)) {
					return
				}
				if err := checkRun(runs[i], files[[2]int{runs[i].host, runs[i].fd}], d, buf); err != nil {
					cancel(err)
				}
			}
		}()
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return st, err
	}
	return st, nil
}

func checkRun(r pageRun, f *os.File, d *pageDigests, buf []byte) error {
	img := d.images[r.image]
	where := func(j int64) string {
		return fmt.Sprintf("process %d (PID %d here), %s, page at %#x", r.imagePID, r.host, r.what, r.addr+uint64(j)*criu.PageSize)
	}
	if img == nil || r.first+r.n > int64(len(img.sums)) {
		return fmt.Errorf("%w: %s: %s holds no such page", ErrMemoryMismatch, where(0), r.image)
	}
	b := buf[:r.n*criu.PageSize]
	n, err := readRun(r, f, b)
	if r.fd >= 0 && errors.Is(err, io.EOF) {
		// A memfd's last page, past its end: zeros in the image.
		clear(b[n:])
		n = len(b)
	}
	if n < len(b) {
		return fmt.Errorf("%w: %s: read %d of %d bytes: %v", ErrMemoryMismatch, where(int64(n)/criu.PageSize), n, len(b), err)
	}
	for j := range r.n {
		if !img.seen[r.first+j] {
			return fmt.Errorf("%w: %s: its bytes never came from the store", ErrMemoryMismatch, where(j))
		}
		if maphash.Bytes(d.seed, b[j*criu.PageSize:(j+1)*criu.PageSize]) != img.sums[r.first+j] {
			return fmt.Errorf("%w: %s", ErrMemoryMismatch, where(j))
		}
	}
	return nil
}

// readRun reads the bytes of run r into b: process memory with
// process_vm_readv (one copy), and what that cannot read (an inaccessible
// mapping) through /proc/PID/mem, which can; a memfd through its
// descriptor.
func readRun(r pageRun, f *os.File, b []byte) (int, error) {
	var n int
	if r.fd < 0 {
		local := []unix.Iovec{{Base: &b[0]}}
		local[0].SetLen(len(b))
		m, err := unix.ProcessVMReadv(r.host, local, []unix.RemoteIovec{{Base: uintptr(r.addr), Len: len(b)}}, 0)
		if err == nil {
			n = m
		}
		if n == len(b) {
			return n, nil
		}
		n -= n % criu.PageSize
	}
	m, err := f.ReadAt(b[n:], int64(r.addr)+int64(n))
	return n + m, err
}
