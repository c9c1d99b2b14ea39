package cuda

/*
#include <stdint.h>
#include <stdlib.h>
*/
import "C"

import (
	_ "embed"
	"fmt"
	"os"
	"unsafe"
)

// crc32cPTX is kernels/crc32c.ptx, generated from kernels/crc32c.cu by
// `make -C cuda/kernels` on a machine with nvcc. The driver compiles it for
// the GPU at hand when the module is loaded.
//
//go:embed kernels/crc32c.ptx
var crc32cPTX []byte

// PTXEnv names a PTX file to load the CRC32C kernel from instead of the
// one built in: a kernel regenerated from crc32c.cu can be tried without
// rebuilding stasis.
const PTXEnv = "STASIS_CRC32C_PTX"

const crc32cKernel = "stasis_crc32c_blocks"

// CRC32C checksums GPU memory on the GPU, in one context: the kernel of
// kernels/crc32c.cu checksums each 4 KiB block and the host joins the
// block checksums (JoinBlockCRCs). Checksum may be called from several
// goroutines at once; each call takes a slot (a stream and result
// buffers) of its own.
type CRC32C struct {
	d      *Driver
	ctx    Context
	module unsafe.Pointer
	fn     unsafe.Pointer
	slots  chan *crcSlot
	all    []*crcSlot
}

// crcSlot is what one checksum in flight needs.
type crcSlot struct {
	stream unsafe.Pointer
	dev    uintptr // device memory for the block checksums
	host   *C.uint32_t
	blocks int // room for this many block checksums
}

func (d *Driver) hasKernelAPI() error {
	if err := d.hasMemoryAPI(); err != nil {
		return err
	}
	if d.d.moduleLoadData == nil || d.d.moduleUnload == nil || d.d.moduleGetFunction == nil || d.d.launchKernel == nil ||
		d.d.streamCreate == nil || d.d.streamDestroy == nil || d.d.streamSynchronize == nil || d.d.memcpyDtoHAsync == nil {
		return fmt.Errorf("%w: %s lacks the module, launch or stream calls the GPU checksums need", ErrUnavailable, d.Path)
	}
	return nil
}

// NewCRC32C loads the checksum kernel into ctx, with room for slots
// checksums at once.
func (d *Driver) NewCRC32C(ctx Context, slots int) (*CRC32C, error) {
	if err := d.hasKernelAPI(); err != nil {
		return nil, err
	}
	ptx := crc32cPTX
	if path := os.Getenv(PTXEnv); path != "" {
		var err error
		if ptx, err = os.ReadFile(path); err != nil {
			return nil, fmt.Errorf("$%s: %w", PTXEnv, err)
		}
	}
	image := C.CBytes(append(append([]byte(nil), ptx...), 0)) // a NUL-terminated string
	defer C.free(image)
	k := &CRC32C{d: d, ctx: ctx, slots: make(chan *crcSlot, max(slots, 1))}
	var err error
	if k.module, k.fn, err = d.loadModule(ctx, image, crc32cKernel); err != nil {
		return nil, err
	}
	for range max(slots, 1) {
		s := &crcSlot{}
		if s.stream, err = d.newStream(ctx); err != nil {
			k.Close()
			return nil, err
		}
		k.all = append(k.all, s)
		k.slots <- s
	}
	return k, nil
}

// Checksum returns the CRC32C of n bytes of GPU memory at src, computed on
// the GPU. The kernel runs on a stream of its own, after the work queued
// on the legacy default stream.
func (k *CRC32C) Checksum(src uintptr, n int64) (uint32, error) {
	if n <= 0 {
		return 0, nil
	}
	s := <-k.slots
	defer func() { k.slots <- s }()
	blocks := int((n + CRCBlockSize - 1) / CRCBlockSize)
	if blocks > s.blocks {
		if err := s.grow(k, blocks); err != nil {
			return 0, err
		}
	}
	if err := k.d.crcBlocks(k.ctx, k.fn, s.stream, src, n, s.dev, unsafe.Pointer(s.host), crc32cKernel); err != nil {
		return 0, err
	}
	host := unsafe.Slice((*uint32)(unsafe.Pointer(s.host)), blocks)
	return JoinBlockCRCs(host, n), nil
}

// grow makes room for at least blocks block checksums.
func (s *crcSlot) grow(k *CRC32C, blocks int) error {
	s.release(k)
	dev, err := k.d.Alloc(k.ctx, 4*blocks)
	if err != nil {
		return err
	}
	s.dev = dev
	s.host = (*C.uint32_t)(C.malloc(C.size_t(4 * blocks)))
	s.blocks = blocks
	return nil
}

func (s *crcSlot) release(k *CRC32C) {
	if s.dev != 0 {
		k.d.Free(k.ctx, s.dev)
		s.dev = 0
	}
	if s.host != nil {
		C.free(unsafe.Pointer(s.host))
		s.host = nil
	}
	s.blocks = 0
}

// Close frees the streams, buffers and module; no Checksum may be in
// flight.
func (k *CRC32C) Close() {
	for _, s := range k.all {
		s.release(k)
		k.d.destroyStream(k.ctx, s.stream)
	}
	k.all = nil
	if k.module != nil {
		k.d.unloadModule(k.ctx, k.module)
		k.module = nil
	}
}
