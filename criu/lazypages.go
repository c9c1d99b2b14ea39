package criu

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
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
// page pipes: two descriptors for each pipe of up to 3.2 MiB (CRIU's
// PIPE_MAX_SIZE), within the open-file limit it will have: the hard limit
// stasis passes on (raiseOpenFileLimit), or more where CRIU may raise it
// (CAP_SYS_RESOURCE). It rules out what plainly cannot work, no more: CRIU
// as root has still run out of descriptors for 12.9 GB of a CUDA
// process's memory.
func LazyPagesFit(memBytes int64) bool {
	if hasCapability(unix.CAP_SYS_RESOURCE) {
		return true
	}
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) != nil {
		return false
	}
	need := 2*(memBytes/(3<<20)+1) + 1024
	return lim.Max == unix.RLIM_INFINITY || int64(lim.Max) >= need
}

// hasCapability says whether this process has capability bit c in its
// effective set.
func hasCapability(c int) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if unix.Capget(&hdr, &data[0]) != nil {
		return false
	}
	return data[c/32].Effective&(1<<(uint(c)%32)) != 0
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
