package gdswriter

import (
	"fmt"

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

func (b *alignedBuffer) free() {
	if b != nil && b.mem != nil {
		_ = unix.Munmap(b.mem)
		b.mem = nil
	}
}

// bufferPool hands out a bounded number of equally sized aligned buffers.
// Get blocks while all are in use, which is what bounds a pipeline's memory.
type bufferPool struct {
	free  chan *alignedBuffer
	all   []*alignedBuffer
	unpin func([]byte)
}

// Pinning registers a buffer's memory with a device driver (pinned memory
// copies to and from a GPU at full speed) and returns how to undo it.
type Pinning func(b []byte) (unpin func([]byte), err error)

func newBufferPool(count, size int) (*bufferPool, error) {
	return newPinnedPool(count, size, nil)
}

func newPinnedPool(count, size int, pin Pinning) (*bufferPool, error) {
	p := &bufferPool{free: make(chan *alignedBuffer, count)}
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

func (p *bufferPool) get() *alignedBuffer  { return <-p.free }
func (p *bufferPool) put(b *alignedBuffer) { p.free <- b }

// close unpins and unmaps every buffer; no buffer may be in use.
func (p *bufferPool) close() {
	for _, b := range p.all {
		if p.unpin != nil {
			p.unpin(b.mem)
		}
		b.free()
	}
	p.all = nil
}
