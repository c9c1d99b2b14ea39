package tensors

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/cuda"
	"github.com/stasis-ckpt/stasis/gdswriter"
)

// The I/O paths a save or load may be asked for (SaveOptions.IO,
// LoadOptions.IO, else $STASIS_IO, else auto).
const (
	// IOAuto uses cuFile where it does GPUDirect Storage (nvidia-fs) and
	// the save is uncompressed, and stasis's own pinned pipeline
	// otherwise: in compat mode cuFile is POSIX I/O underneath, slower
	// than the pipeline.
	IOAuto = "auto"
	// IOCuFile uses cuFile for every chunk it can take, compat mode
	// included, and fails (ErrCuFileUnavailable) where cuFile cannot work.
	IOCuFile = "cufile"
	// IOPinned uses stasis's own pipeline only.
	IOPinned = "pinned"
)

// IOEnv names the environment variable that chooses the I/O path when
// the caller does not.
const IOEnv = "STASIS_IO"

// ErrCuFileUnavailable is wrapped by the error of a save or load that asked
// for cuFile (IOCuFile) where cuFile cannot work.
var ErrCuFileUnavailable = errors.New("cuFile is unavailable")

// ParseIO checks the name of an I/O path; "" stands for $STASIS_IO, and
// for auto when that is unset.
func ParseIO(name string) (string, error) {
	from := "I/O path"
	if name == "" {
		name, from = os.Getenv(IOEnv), "$"+IOEnv
	}
	switch name {
	case "":
		return IOAuto, nil
	case IOAuto, IOCuFile, IOPinned:
		return name, nil
	}
	return "", fmt.Errorf("%w: %s %q: use auto, cufile or pinned", catalog.ErrInvalid, from, name)
}

// openCuFile is cuda.OpenCuFile; tests replace it.
var openCuFile = cuda.OpenCuFile

// cuFileFor decides whether GPU memory goes through cuFile in mode (a
// ParseIO result): it returns the library, or nil and why not. It fails
// only where cuFile was asked for and cannot work.
func cuFileFor(mode string, compressed bool, drv *cuda.Driver) (*cuda.CuFile, string, error) {
	switch {
	case mode == IOPinned:
		return nil, "the pinned I/O path was asked for", nil
	case mode == IOAuto && compressed:
		return nil, "compression was asked for, and cuFile writes raw bytes only", nil
	}
	cf, err := openCuFile(drv)
	if err != nil {
		if mode == IOCuFile {
			return nil, "", fmt.Errorf("%w: the cufile I/O path was asked for: %v", ErrCuFileUnavailable, err)
		}
		return nil, err.Error(), nil
	}
	if mode == IOAuto && !cf.GDS {
		return nil, compatWhy(cf), nil
	}
	return cf, "", nil
}

// compatWhy is why auto passes cuFile over in compat mode.
func compatWhy(cf *cuda.CuFile) string {
	return cf.ModeWhy + "; that is POSIX I/O underneath, slower than stasis's own pipeline (" + IOEnv + "=cufile uses it all the same)"
}

// ioPathName is what the manifest records for a save that went through
// cuFile.
func ioPathName(cf *cuda.CuFile) string {
	if cf.GDS {
		return "cufile"
	}
	return "cufile-compat"
}

// cufileIO is gdswriter.DeviceIO over cuFile: files are registered with
// cuFile, and each chunk is checksummed on the GPU by the CRC32C kernel and
// moved by cuFileWrite or cuFileRead, in the context of the buffer it
// belongs to. GPU buffers are registered with cuFile once, up front.
type cufileIO struct {
	cf      *cuda.CuFile
	drv     *cuda.Driver
	fileCtx cuda.Context             // the context files are registered in
	ctxOf   map[uintptr]cuda.Context // a buffer's start -> its context
	slots   int                      // checksums in flight at once, per context

	mu         sync.Mutex
	crcs       map[cuda.Context]*cuda.CRC32C
	registered map[uintptr]cuda.Context
	refused    int   // buffers cuFileBufRegister refused
	refusedErr error // the first refusal
}

func newCuFileIO(cf *cuda.CuFile, drv *cuda.Driver, fileCtx cuda.Context, ctxOf map[uintptr]cuda.Context, slots int) *cufileIO {
	return &cufileIO{cf: cf, drv: drv, fileCtx: fileCtx, ctxOf: ctxOf, slots: slots,
		crcs: map[cuda.Context]*cuda.CRC32C{}, registered: map[uintptr]cuda.Context{}}
}

// register registers a GPU buffer with cuFile, once. A refusal is counted,
// not an error: cuFile moves unregistered memory too, through bounce
// buffers of its own.
func (c *cufileIO) register(base uintptr, n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.registered[base]; ok {
		return
	}
	ctx := c.ctxOf[base]
	if err := c.cf.RegisterBuffer(ctx, base, n); err != nil {
		c.refused++
		if c.refusedErr == nil {
			c.refusedErr = err
		}
		return
	}
	c.registered[base] = ctx
}

// refusals says, for the manifest, which buffers went unregistered ("" when
// none).
func (c *cufileIO) refusals() string {
	if c.refused == 0 {
		return ""
	}
	return fmt.Sprintf("; %d GPU buffers went unregistered (%v)", c.refused, c.refusedErr)
}

// close deregisters the buffers and frees the checksum kernels; no I/O
// may be in flight.
func (c *cufileIO) close() {
	for base, ctx := range c.registered {
		c.cf.DeregisterBuffer(ctx, base)
	}
	c.registered = nil
	for _, k := range c.crcs {
		k.Close()
	}
	c.crcs = nil
}

// checksum is the CRC32C of n bytes of GPU memory at p in ctx, computed on
// the GPU.
func (c *cufileIO) checksum(ctx cuda.Context, p uintptr, n int64) (uint32, error) {
	c.mu.Lock()
	k := c.crcs[ctx]
	if k == nil {
		var err error
		if k, err = c.drv.NewCRC32C(ctx, c.slots); err != nil {
			c.mu.Unlock()
			return 0, fmt.Errorf("GPU checksum: %w", err)
		}
		c.crcs[ctx] = k
	}
	c.mu.Unlock()
	crc, err := k.Checksum(p, n)
	if err != nil {
		return 0, fmt.Errorf("GPU checksum: %w", err)
	}
	return crc, nil
}

func (c *cufileIO) Open(f *os.File) (gdswriter.DeviceFile, error) {
	h, err := c.cf.RegisterFile(c.fileCtx, int(f.Fd()))
	if err != nil {
		return nil, err
	}
	return &cufileFile{io: c, h: h}, nil
}

// cufileFile is a data file registered with cuFile.
type cufileFile struct {
	io *cufileIO
	h  *cuda.CuFileHandle
}

func (f *cufileFile) WriteAt(src gdswriter.DeviceSpan, off int64) (uint32, error) {
	ctx := f.io.ctxOf[src.Base]
	crc, err := f.io.checksum(ctx, src.Base+uintptr(src.Offset), src.Len)
	if err != nil {
		return 0, err
	}
	return crc, f.h.Write(ctx, src.Base, src.Offset, src.Len, off)
}

func (f *cufileFile) ReadAt(dst gdswriter.DeviceSpan, off int64) (uint32, error) {
	ctx := f.io.ctxOf[dst.Base]
	if err := f.h.Read(ctx, dst.Base, dst.Offset, dst.Len, off); err != nil {
		return 0, err
	}
	return f.io.checksum(ctx, dst.Base+uintptr(dst.Offset), dst.Len)
}

func (f *cufileFile) Close() error {
	f.h.Close()
	return nil
}

// holdsWholeChunk reports whether bytes [off, off+n) of a stream cut into
// chunks of chunkSize contain a whole chunk.
func holdsWholeChunk(off, n, chunkSize int64) bool {
	first := (off + chunkSize - 1) / chunkSize * chunkSize
	return first+chunkSize <= off+n
}

// AutoChoice says which I/O path auto takes on this machine for an
// uncompressed save of GPU memory ("cufile" or "pinned") and why, with the
// library when it loads: what `stasis doctor` reports. It opens libcuda
// and the cuFile driver.
func AutoChoice() (path, why string, cf *cuda.CuFile) {
	drv, err := cuda.LoadLibrary()
	if err != nil {
		return IOPinned, "libcuda does not load, so there is no GPU memory to move", nil
	}
	cf, err = openCuFile(drv)
	if err != nil {
		return IOPinned, err.Error(), nil
	}
	if !cf.GDS {
		return IOPinned, compatWhy(cf), cf
	}
	return IOCuFile, cf.ModeWhy + ": uncompressed saves and loads of GPU memory go through cuFile (compressed saves through the pinned pipeline)", cf
}
