package criu

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// A dump with Options.LazyPages leaves the contents of the private
// anonymous memory of each process (nearly all of a job's memory) out of
// its pages image: the pagemap lists those pages flagged lazy but not
// present, and CRIU writes only the others (stacks, the changed pages of
// file mappings). The tree stays frozen until the post-dump action has
// run, so the caller reads the lazy pages from the processes themselves
// then, with as many goroutines as it likes (PageCopy), instead of CRIU's
// one thread writing them all. What it stores is the pages image a dump
// without lazy pages would have written, and the pagemap marks those
// pages present (as that dump would: present and lazy), so a restore sees
// an ordinary image.

// LazyPagesFit says whether CRIU could hold memBytes of lazy pages in its
// page pipes, which it keeps open until it ends: two descriptors per pipe,
// within the open-file limit CRIU will have. Both sides of that depend on
// CRIU's capabilities as the kernel checks them (in the initial user
// namespace; CRIU has this process's):
//   - with CAP_SYS_RESOURCE, CRIU raises its open-file limit to
//     fs.nr_open and grows each pipe to 3.2 MiB (CRIU's PIPE_MAX_SIZE;
//     the kernel rounds it up to 4 MiB);
//   - without it, CRIU keeps the hard limit (stasis raises its soft
//     limit to it, raiseOpenFileLimit), and a pipe grows no larger than
//     fs.pipe-max-size (1 MiB by default);
//   - without CAP_SYS_ADMIN as well, the user's pipes hold no more than
//     fs.pipe-user-pages-soft pages (64 MiB by default) before new ones
//     get two pages and cannot grow.
//
// On the GPU machine (root without CAP_SYS_RESOURCE, a hard limit of
// 20000) 8 GiB of memory fit and 16 GiB failed with CRIU's "Can't make
// pipe for page-pipe: Too many open files"; so did CUDA processes of 12.9
// GB, where 8.5 GB worked.
func LazyPagesFit(memBytes int64) bool {
	return readPipeLimits().fit(memBytes)
}

// criuPipeMax is the most pages a CRIU page pipe holds: its PIPE_MAX_SIZE,
// (1 << PAGE_ALLOC_COSTLY_ORDER) * PAGE_SIZE / sizeof(struct pipe_buffer).
const criuPipeMax = 8 * PageSize / 40

// pipeLimits are what bounds CRIU's page pipes.
type pipeLimits struct {
	sysResource bool   // CAP_SYS_RESOURCE: the open-file limit to nrOpen, pipes past pipeMax
	sysAdmin    bool   // CAP_SYS_ADMIN: pipes past userPages
	hardFiles   uint64 // RLIMIT_NOFILE's hard limit
	nrOpen      uint64 // fs.nr_open
	pipeMax     int64  // fs.pipe-max-size, bytes
	userPages   int64  // fs.pipe-user-pages-soft, pages; 0: no limit
}

func readPipeLimits() pipeLimits {
	l := pipeLimits{
		sysResource: capableInInitialNS(unix.CAP_SYS_RESOURCE),
		sysAdmin:    capableInInitialNS(unix.CAP_SYS_ADMIN),
		nrOpen:      1 << 20, pipeMax: 1 << 20, userPages: 16384,
	}
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) == nil {
		l.hardFiles = lim.Max
	}
	if n, err := readSysctl("/proc/sys/fs/nr_open"); err == nil {
		l.nrOpen = uint64(n)
	}
	if n, err := readSysctl("/proc/sys/fs/pipe-max-size"); err == nil {
		l.pipeMax = n
	}
	if n, err := readSysctl("/proc/sys/fs/pipe-user-pages-soft"); err == nil {
		l.userPages = n
	}
	return l
}

// fit says whether memBytes of lazy pages fit within l.
func (l pipeLimits) fit(memBytes int64) bool {
	pipeBytes := l.pipeBytes()
	pipes := ceilDiv(memBytes, pipeBytes)
	if quota := l.userPages * PageSize; !l.sysResource && !l.sysAdmin && quota > 0 && memBytes > quota {
		// Past the user's quota, pipes of two pages.
		pipes = ceilDiv(quota, pipeBytes) + ceilDiv(memBytes-quota, 2*PageSize)
	}
	need := 2*pipes + 1024 // and CRIU's own
	files := l.files()
	return files == unix.RLIM_INFINITY || files >= uint64(need)
}

// files is how many descriptors CRIU may have open.
func (l pipeLimits) files() uint64 {
	if l.sysResource {
		return l.nrOpen
	}
	return l.hardFiles
}

// LazyPagesCapacity is the most memory LazyPagesFit lets stasis copy
// here (math.MaxInt64: no limit), with the size of CRIU's page pipes and
// the descriptors CRIU may have, as LazyPagesFit counts them.
func LazyPagesCapacity() (memBytes, pipeBytes int64, files uint64) {
	return readPipeLimits().capacity()
}

func (l pipeLimits) capacity() (memBytes, pipeBytes int64, files uint64) {
	pipeBytes, files = l.pipeBytes(), l.files()
	if l.fit(math.MaxInt64 - pipeBytes) {
		return math.MaxInt64, pipeBytes, files
	}
	lo, hi := int64(0), int64(math.MaxInt64-pipeBytes) // fit(lo), !fit(hi)
	for hi-lo > PageSize {
		mid := lo + (hi-lo)/2
		if l.fit(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo, pipeBytes, files
}

// pipeBytes is how much memory one of CRIU's page pipes holds.
func (l pipeLimits) pipeBytes() int64 {
	if l.sysResource {
		return criuPipeMax * PageSize
	}
	// CRIU doubles a pipe's size until the kernel refuses: the largest
	// power of two pages within pipe-max-size.
	pages := int64(1)
	for pages*2 <= criuPipeMax && pages*2*PageSize <= l.pipeMax {
		pages *= 2
	}
	return pages * PageSize
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// capableInInitialNS says whether this process has capability c in its
// effective set and runs in the initial user namespace, where the kernel
// checks the limits above (capable()).
func capableInInitialNS(c int) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if unix.Capget(&hdr, &data[0]) != nil || data[c/32].Effective&(1<<(uint(c)%32)) == 0 {
		return false
	}
	uidMap, err := os.ReadFile("/proc/self/uid_map")
	f := strings.Fields(string(uidMap))
	return err == nil && len(f) == 3 && f[0] == "0" && f[1] == "0" && f[2] == "4294967295"
}

// readSysctl reads a number from a file under /proc/sys.
func readSysctl(path string) (int64, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
}

// PageCopy is the complete pages image of one process dumped with lazy
// pages: in its pagemap's order, the pages CRIU wrote, from CRIU's pages
// image, and the lazy ones, from the process's memory.
type PageCopy struct {
	// Name is the pages image's file name (pages-ID.img).
	Name string
	// Written is the path of CRIU's pages image, which holds only the
	// pages it wrote; the caller stores ReadAt's bytes under Name instead.
	Written string

	pid     int
	written *os.File
	parts   []pagePart
	size    int64
	lazy    int64 // bytes read from memory
	mem     *MemoryReader
}

// pagePart is a run of the complete image: from CRIU's pages image at
// offset from, or (from < 0) from memory at vaddr.
type pagePart struct {
	at, n int64
	from  int64
	vaddr uint64
}

// CopyLazyPages prepares the complete pages image of the process whose
// pagemap is pagemap-PID.img in imagesDir, and rewrites that pagemap with
// its lazy pages marked present. The process must stay frozen until the
// copy's bytes are read. Close releases it.
func CopyLazyPages(imagesDir string, pid int) (*PageCopy, error) {
	pagemapPath := filepath.Join(imagesDir, "pagemap-"+strconv.Itoa(pid)+".img")
	pm, err := ReadPagemap(pagemapPath)
	if err != nil {
		return nil, err
	}
	c := &PageCopy{Name: fmt.Sprintf("pages-%d.img", pm.PagesID), pid: pid, mem: NewMemoryReader(pid)}
	c.Written = filepath.Join(imagesDir, c.Name)
	var fromFile int64
	for _, e := range pm.Entries {
		n := int64(e.GetNrPages()) * PageSize
		flags := e.GetFlags()
		switch {
		case e.GetInParent() || flags&PageInParent != 0:
			return nil, fmt.Errorf("%s: pages at %#x are in a parent image; a dump with lazy pages has none", pagemapPath, e.GetVaddr())
		case Present(e):
			c.parts = append(c.parts, pagePart{at: c.size, n: n, from: fromFile})
			fromFile += n
		case flags&PageLazy != 0:
			c.parts = append(c.parts, pagePart{at: c.size, n: n, from: -1, vaddr: e.GetVaddr()})
			e.Flags = proto.Uint32(flags | PagePresent)
			c.lazy += n
		default:
			continue // no contents anywhere
		}
		c.size += n
	}
	f, err := os.Open(c.Written)
	if err != nil {
		return nil, err
	}
	c.written = f
	st, err := f.Stat()
	if err != nil {
		c.Close()
		return nil, err
	}
	if st.Size() != fromFile {
		c.Close()
		return nil, fmt.Errorf("%s holds %d bytes; its pagemap lists %d bytes of pages written", c.Written, st.Size(), fromFile)
	}
	if c.lazy > 0 {
		if err := WritePagemap(pagemapPath, pm); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// Size is the complete image's size in bytes.
func (c *PageCopy) Size() int64 { return c.size }

// Lazy is how many of its bytes come from the process's memory.
func (c *PageCopy) Lazy() int64 { return c.lazy }

// ReadAt fills dst with the complete image's bytes from offset off. It is
// safe for concurrent use.
func (c *PageCopy) ReadAt(dst []byte, off int64) error {
	if off < 0 || off+int64(len(dst)) > c.size {
		return fmt.Errorf("pages of PID %d: read of %d bytes at %d is outside the %d-byte image", c.pid, len(dst), off, c.size)
	}
	i := sort.Search(len(c.parts), func(i int) bool { return c.parts[i].at+c.parts[i].n > off })
	for len(dst) > 0 {
		p := c.parts[i]
		skip := off - p.at
		piece := dst[:min(int64(len(dst)), p.n-skip)]
		var err error
		if p.from >= 0 {
			_, err = c.written.ReadAt(piece, p.from+skip)
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
		} else {
			err = c.mem.ReadAt(piece, p.vaddr+uint64(skip))
		}
		if err != nil {
			return err
		}
		dst = dst[len(piece):]
		off += int64(len(piece))
		i++
	}
	return nil
}

// MemoryReader reads another process's memory. It is safe for concurrent
// use.
type MemoryReader struct {
	pid int
	// mem is /proc/PID/mem, opened for the first page process_vm_readv
	// cannot read; mu guards it against Close, which may come while a
	// writer's workers still read (a failed checkpoint).
	mu     sync.Mutex
	mem    *os.File
	closed bool
}

// NewMemoryReader reads the memory of process pid.
func NewMemoryReader(pid int) *MemoryReader { return &MemoryReader{pid: pid} }

// ReadAt reads the process's memory at vaddr into dst: with
// process_vm_readv, which copies straight from its pages, and where that
// stops (pages the process itself may not read: PROT_NONE), through
// /proc/PID/mem, which reads them as a debugger would.
func (m *MemoryReader) ReadAt(dst []byte, vaddr uint64) error {
	for len(dst) > 0 {
		local := []unix.Iovec{{Base: &dst[0]}}
		local[0].SetLen(len(dst))
		remote := []unix.RemoteIovec{{Base: uintptr(vaddr), Len: len(dst)}}
		n, err := unix.ProcessVMReadv(m.pid, local, remote, 0)
		if n <= 0 {
			if errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("read the memory of PID %d: the process is gone", m.pid)
			}
			return m.readFile(dst, vaddr)
		}
		dst = dst[n:]
		vaddr += uint64(n)
	}
	return nil
}

func (m *MemoryReader) readFile(dst []byte, vaddr uint64) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return fmt.Errorf("read the memory of PID %d: %w", m.pid, os.ErrClosed)
	}
	if m.mem == nil {
		f, err := os.Open(filepath.Join("/proc", strconv.Itoa(m.pid), "mem"))
		if err != nil {
			m.mu.Unlock()
			return fmt.Errorf("read the memory of PID %d: %w", m.pid, err)
		}
		m.mem = f
	}
	mem := m.mem
	m.mu.Unlock()
	if _, err := mem.ReadAt(dst, int64(vaddr)); err != nil {
		return fmt.Errorf("read %d bytes of the memory of PID %d at %#x: %w", len(dst), m.pid, vaddr, err)
	}
	return nil
}

// Close releases /proc/PID/mem; reads still under way then fail.
func (m *MemoryReader) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	if m.mem != nil {
		m.mem.Close()
	}
}

// Close releases the files the copy reads. Reads still under way then
// fail.
func (c *PageCopy) Close() error {
	err := c.written.Close()
	c.mem.Close()
	return err
}
