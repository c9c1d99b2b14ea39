package criu

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/stasis-ckpt/stasis/internal/procmaps"
	"golang.org/x/sys/unix"
)

// A dump with lazy pages leaves most of a process's memory for the caller
// to copy at post-dump (PageCopy). The caller may start on the largest
// stretch of it sooner, while CRIU still dumps: PredictLazyRun reads,
// from /proc, which pages CRIU's rules will list as one run of
// consecutive lazy pages of the pages image, and at post-dump
// PageCopy.Locate says whether CRIU did, and where in the image they
// are. A prediction can be wrong (the process changed its memory map
// before CRIU froze it, a rule /proc does not show); Locate is what tells.

// Segment is a range of a process's memory, Len bytes from Vaddr.
type Segment struct {
	Vaddr uint64
	Len   int64
}

// LazyRun is pages a dump with lazy pages is predicted to list one after
// the other, all lazy, in its pages image.
type LazyRun struct {
	Segments []Segment // in address order
	Size     int64     // the segments' bytes
	Before   int64     // predicted bytes of the pages image before the run
}

// pagemap entry bits (the kernel's Documentation/admin-guide/mm/pagemap.rst).
const (
	pmePresent  = 1 << 63
	pmeSwap     = 1 << 62
	pmeFile     = 1 << 61
	pmePFNMask  = 1<<55 - 1
	pagemapRead = 64 << 10 // entries read at once
)

var zeroPFN = sync.OnceValues(findZeroPFN)

// findZeroPFN finds the page frame of the kernel's shared zero page, which
// CRIU leaves out of its images: the frame a read of untouched anonymous
// memory maps. Frame numbers read as 0 without CAP_SYS_ADMIN.
func findZeroPFN() (uint64, error) {
	mem, err := unix.Mmap(-1, 0, PageSize, unix.PROT_READ, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return 0, err
	}
	defer unix.Munmap(mem)
	if mem[0] != 0 { // the read maps the zero page
		return 0, errors.New("fresh anonymous memory is not zero")
	}
	f, err := os.Open("/proc/self/pagemap")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var b [8]byte
	if _, err := f.ReadAt(b[:], int64(uintptr(addrOf(mem))/PageSize*8)); err != nil {
		return 0, err
	}
	pfn := binary.LittleEndian.Uint64(b[:]) & pmePFNMask
	if pfn == 0 {
		return 0, errors.New("page frame numbers are hidden in /proc/PID/pagemap (they need CAP_SYS_ADMIN)")
	}
	return pfn, nil
}

// PredictLazyRun returns the longest run of pages of one mapping of
// process pid that a dump with lazy pages would list as consecutive lazy
// pages, were it to run now, following CRIU's rules: pages present or
// swapped (not the zero page) of private mappings, lazy in anonymous ones
// except the page under each thread's stack pointer, the vDSO whole and
// not lazy; private file pages not written to, and shared memory, are not
// in the pages image.
func PredictLazyRun(pid int) (LazyRun, error) {
	var best LazyRun
	err := lazyRuns(pid, func(r LazyRun) {
		if r.Size > best.Size {
			best = r
		}
	})
	return best, err
}

// lazyRuns calls found with each predicted run of pid's pages, in address
// order (PredictLazyRun).
func lazyRuns(pid int, found func(LazyRun)) error {
	zero, err := zeroPFN()
	if err != nil {
		return err
	}
	stackPages, err := threadStackPages(pid)
	if err != nil {
		return err
	}
	maps, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return err
	}
	defer maps.Close()
	pagemap, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		return err
	}
	defer pagemap.Close()

	var cur LazyRun
	var image int64 // predicted bytes of the image so far
	end := func() {
		if cur.Size > 0 {
			found(cur)
		}
		cur = LazyRun{}
	}
	add := func(vaddr uint64) {
		if cur.Size == 0 {
			cur.Before = image
		}
		if n := len(cur.Segments); n > 0 && cur.Segments[n-1].Vaddr+uint64(cur.Segments[n-1].Len) == vaddr {
			cur.Segments[n-1].Len += PageSize
		} else {
			cur.Segments = append(cur.Segments, Segment{Vaddr: vaddr, Len: PageSize})
		}
		cur.Size += PageSize
		image += PageSize
	}
	entries := make([]byte, pagemapRead*8)
	sc := bufio.NewScanner(maps)
	for sc.Scan() {
		v, err := procmaps.Parse(sc.Text())
		if err != nil {
			return fmt.Errorf("/proc/%d/maps: %w", pid, err)
		}
		anon := v.Anonymous()
		switch {
		case v.Path == "[vdso]":
			end()
			image += int64(v.End - v.Start)
			continue
		case !v.Private() || strings.HasPrefix(v.Path, "[vvar") || v.Path == "[vsyscall]":
			continue
		}
		// A run stays within one mapping: the next one may be memory the
		// job changes all the time (the heap of its allocator), where
		// the run's copy would not hold.
		end()
		for at := v.Start; at < v.End; {
			n := min((v.End-at)/PageSize, pagemapRead)
			buf := entries[:n*8]
			if _, err := pagemap.ReadAt(buf, int64(at/PageSize*8)); err != nil {
				return fmt.Errorf("/proc/%d/pagemap: %w", pid, err)
			}
			for i := range n {
				pme := binary.LittleEndian.Uint64(buf[i*8:])
				vaddr := at + i*PageSize
				switch {
				case pme&(pmePresent|pmeSwap) == 0, pme&pmePFNMask == zero && pme&pmePresent != 0:
				case !anon && pme&pmeFile != 0:
				case anon && !stackPages[vaddr]:
					add(vaddr)
				default:
					end()
					image += PageSize
				}
			}
			at += n * PageSize
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("/proc/%d/maps: %w", pid, err)
	}
	end()
	return nil
}

// threadStackPages returns the pages under the stack pointers of pid's
// threads, as /proc/PID/task/TID/syscall shows them: CRIU dumps those
// pages at once, not lazily. A running thread's pointer is not shown (and
// moves); a prediction it spoils is found out by Locate.
func threadStackPages(pid int) (map[uint64]bool, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, err
	}
	pages := map[uint64]bool{}
	for _, t := range tasks {
		b, err := os.ReadFile(filepath.Join(fmt.Sprintf("/proc/%d/task", pid), t.Name(), "syscall"))
		if err != nil {
			continue // the thread is gone
		}
		// "NR ARG1 ... ARG6 SP PC" in a system call, "-1 SP PC" blocked
		// outside one, "running" when running.
		f := strings.Fields(string(b))
		if len(f) < 3 {
			continue
		}
		if sp, err := strconv.ParseUint(strings.TrimPrefix(f[len(f)-2], "0x"), 16, 64); err == nil {
			pages[sp&^(PageSize-1)] = true
		}
	}
	return pages, nil
}

// Locate says where the first n bytes of run lie in the complete image:
// the image offset of run's first byte, when CRIU listed those bytes as
// lazy pages, page for page, one after the other (the prediction held);
// an error naming the first difference otherwise.
func (c *PageCopy) Locate(run LazyRun, n int64) (int64, error) {
	if n > run.Size || len(run.Segments) == 0 {
		return 0, fmt.Errorf("%d bytes of a %d-byte run", n, run.Size)
	}
	v0 := run.Segments[0].Vaddr
	i := 0
	for ; i < len(c.parts); i++ {
		p := c.parts[i]
		if p.from < 0 && p.vaddr <= v0 && v0 < p.vaddr+uint64(p.n) {
			break
		}
	}
	if i == len(c.parts) {
		return 0, fmt.Errorf("PID %d: CRIU did not list the page at %#x as lazy", c.pid, v0)
	}
	at := c.parts[i].at + int64(v0-c.parts[i].vaddr)
	skip := int64(v0 - c.parts[i].vaddr)
	j, into := 0, int64(0)
	for left := n; left > 0; {
		if i == len(c.parts) {
			return 0, fmt.Errorf("PID %d: the pages image ends %d bytes into the run", c.pid, n-left)
		}
		p, s := c.parts[i], run.Segments[j]
		if p.from >= 0 || p.vaddr+uint64(skip) != s.Vaddr+uint64(into) {
			return 0, fmt.Errorf("PID %d: %d bytes into the run, CRIU listed %s where the page at %#x was expected", c.pid, n-left, p.describe(skip), s.Vaddr+uint64(into))
		}
		step := min(p.n-skip, s.Len-into, left)
		left -= step
		if skip += step; skip == p.n {
			i, skip = i+1, 0
		}
		if into += step; into == s.Len {
			j, into = j+1, 0
		}
	}
	return at, nil
}

// describe names what a part holds at skip bytes in.
func (p pagePart) describe(skip int64) string {
	if p.from >= 0 {
		return "a page CRIU wrote"
	}
	return fmt.Sprintf("the lazy page at %#x", p.vaddr+uint64(skip))
}

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }
