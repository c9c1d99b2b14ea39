package gdswriter

import (
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Alignment is the offset and length granularity of every stored extent. It
// satisfies O_DIRECT on the file systems stasis targets (logical block sizes
// of 512 and 4096 bytes).
const Alignment = 4096

// alignUp rounds n up to the next multiple of Alignment.
func alignUp(n int64) int64 {
	return (n + Alignment - 1) &^ (Alignment - 1)
}

// alignedBuffer is memory from an anonymous mapping: page aligned, as
// O_DIRECT needs, and returned to the kernel on free rather than left to the
// garbage collector.
type alignedBuffer struct {
	mem []byte
}

func newAlignedBuffer(size int) (*alignedBuffer, error) {
	size = int(alignUp(int64(size)))
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("allocate %d bytes of aligned memory: %w", size, err)
	}
	return &alignedBuffer{mem: mem}, nil
}

// hugePage is the size of a transparent huge page on x86-64 and arm64
// (4 KiB base pages).
const hugePage = 2 << 20

// newHugeBuffer allocates size bytes (a multiple of hugePage) aligned to a
// huge page and asks for transparent huge pages: faulting them in, and
// unmapping them, takes a 512th of the page faults. Where the kernel does
// not give huge pages, they are plain pages.
func newHugeBuffer(size int) (*alignedBuffer, error) {
	if size%hugePage != 0 {
		return newAlignedBuffer(size)
	}
	mem, err := unix.Mmap(-1, 0, size+hugePage, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("allocate %d bytes of aligned memory: %w", size, err)
	}
	start := int(uintptr(hugePage)-uintptr(unsafe.Pointer(&mem[0]))%hugePage) % hugePage
	if start > 0 {
		_ = unix.Munmap(mem[:start])
	}
	if tail := mem[start+size:]; len(tail) > 0 {
		_ = unix.Munmap(tail)
	}
	mem = mem[start : start+size : start+size]
	_ = unix.Madvise(mem, unix.MADV_HUGEPAGE)
	return &alignedBuffer{mem: mem}, nil
}

func (b *alignedBuffer) free() {
	if b != nil && b.mem != nil {
		_ = unix.Munmap(b.mem)
		b.mem = nil
	}
}

// bufferPool hands out a bounded number of equally sized aligned buffers.
// Get blocks while all are in use, which is what bounds a pipeline's memory.
// A pool may grow (grow) from the buffers it starts with up to a limit:
// when Get finds none free, a goroutine of its own allocates more, and
// faults their pages in, while the caller waits for the first one free.
type bufferPool struct {
	free  chan *alignedBuffer
	size  int
	unpin func([]byte)

	mu    sync.Mutex
	all   []*alignedBuffer
	limit int           // the most buffers the pool may hold
	wake  chan struct{} // asks the growing goroutine for more (grow)
	grown sync.WaitGroup
}

// Pinning registers a buffer's memory with a device driver (pinned memory
// copies to and from a GPU at full speed) and returns how to undo it.
type Pinning func(b []byte) (unpin func([]byte), err error)

func newBufferPool(count, size int) (*bufferPool, error) {
	return newPinnedPool(count, size, nil)
}

func newPinnedPool(count, size int, pin Pinning) (*bufferPool, error) {
	p := &bufferPool{free: make(chan *alignedBuffer, count), size: size, limit: count}
	for i := 0; i < count; i++ {
		b, err := newAlignedBuffer(size)
		if err != nil {
			p.close()
			return nil, err
		}
		if pin != nil {
			unpin, err := pin(b.mem)
			if err != nil {
				b.free()
				p.close()
				return nil, fmt.Errorf("pin a %d-byte buffer: %w", size, err)
			}
			p.unpin = unpin
		}
		p.all = append(p.all, b)
		p.free <- b
	}
	return p, nil
}

// growBatch is how many buffers the pool adds at a time when it grows.
const growBatch = 8

// grow lets an unpinned pool hold up to limit buffers, added growBatch at a
// time whenever Get finds none free. Call it before the first Get.
func (p *bufferPool) grow(limit int) {
	if limit <= p.limit || p.unpin != nil {
		return
	}
	old := p.free
	p.free = make(chan *alignedBuffer, limit)
	for len(old) > 0 {
		p.free <- <-old
	}
	p.limit = limit
	p.wake = make(chan struct{}, 1)
	p.grown.Add(1)
	go func() {
		defer p.grown.Done()
		for range p.wake {
			for i := 0; i < growBatch; i++ {
				p.mu.Lock()
				full := len(p.all) >= p.limit
				p.mu.Unlock()
				if full {
					break
				}
				b, err := newHugeBuffer(p.size)
				if err != nil {
					break // the pool stays as it is
				}
				// Fault the pages in here, not in the caller's copy.
				if unix.Madvise(b.mem, unix.MADV_POPULATE_WRITE) != nil {
					for i := 0; i < len(b.mem); i += Alignment {
						b.mem[i] = 0
					}
				}
				p.mu.Lock()
				p.all = append(p.all, b)
				p.mu.Unlock()
				p.free <- b
			}
		}
	}()
}

func (p *bufferPool) get() *alignedBuffer {
	select {
	case b := <-p.free:
		return b
	default:
	}
	if p.wake != nil {
		select {
		case p.wake <- struct{}{}:
		default: // already asked
		}
	}
	return <-p.free
}

func (p *bufferPool) put(b *alignedBuffer) { p.free <- b }

// close unpins and unmaps every buffer; no buffer may be in use.
func (p *bufferPool) close() {
	if p.wake != nil {
		close(p.wake)
		p.grown.Wait()
		p.wake = nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, b := range p.all {
		if p.unpin != nil {
			p.unpin(b.mem)
		}
		b.free()
	}
	p.all = nil
}
