package cuda

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

// The few cuFile types stasis passes, laid out as the cuFile API reference
// describes them: CUfileError_t (a cuFile error number and a CUresult),
// CUfileDescr_t (a handle type, a union holding the descriptor, a table of
// file system operations, NULL here), and the head of CUfileDrvProps_t
// (the nvidia-fs version; the rest of the struct is not read, and the
// buffer passed is larger than the whole).
typedef struct { int err; int cu_err; } stasisFileError;
typedef struct { int type; union { int fd; void *handle; } handle; const void *fs_ops; } stasisFileDescr;
typedef struct { unsigned int major_version, minor_version; } stasisNvfsVersion;
#define STASIS_FILE_HANDLE_TYPE_OPAQUE_FD 1

typedef int (*fnCtxSet)(void *);
typedef stasisFileError (*fnFileVoid)(void);
typedef stasisFileError (*fnFileProps)(void *);
typedef stasisFileError (*fnFileVersion)(int *);
typedef stasisFileError (*fnFileHandleRegister)(void **, stasisFileDescr *);
typedef void (*fnFileHandleDeregister)(void *);
typedef stasisFileError (*fnFileBufRegister)(const void *, size_t, int);
typedef stasisFileError (*fnFileBufDeregister)(const void *);
typedef ssize_t (*fnFileIO)(void *, void *, size_t, off_t, off_t);
typedef const char *(*fnFileErrorText)(int);

typedef struct {
	void *handle;
	fnFileVoid driverOpen;
	fnFileVoid driverClose;
	fnFileProps driverGetProperties;
	fnFileVersion getVersion;
	fnFileHandleRegister handleRegister;
	fnFileHandleDeregister handleDeregister;
	fnFileBufRegister bufRegister;
	fnFileBufDeregister bufDeregister;
	fnFileIO read;
	fnFileIO write;
	fnFileErrorText errorText;
	fnCtxSet ctxSetCurrent; // libcuda's, so that each call runs in the buffer's context
} stasisCuFile;

static const char *stasis_cufile_open(const char *path, stasisCuFile *f) {
	memset(f, 0, sizeof(*f));
	f->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!f->handle) return dlerror();
	f->driverOpen = (fnFileVoid)dlsym(f->handle, "cuFileDriverOpen");
	f->driverClose = (fnFileVoid)dlsym(f->handle, "cuFileDriverClose_v2");
	if (!f->driverClose) f->driverClose = (fnFileVoid)dlsym(f->handle, "cuFileDriverClose");
	f->driverGetProperties = (fnFileProps)dlsym(f->handle, "cuFileDriverGetProperties");
	f->getVersion = (fnFileVersion)dlsym(f->handle, "cuFileGetVersion");
	f->handleRegister = (fnFileHandleRegister)dlsym(f->handle, "cuFileHandleRegister");
	f->handleDeregister = (fnFileHandleDeregister)dlsym(f->handle, "cuFileHandleDeregister");
	f->bufRegister = (fnFileBufRegister)dlsym(f->handle, "cuFileBufRegister");
	f->bufDeregister = (fnFileBufDeregister)dlsym(f->handle, "cuFileBufDeregister");
	f->read = (fnFileIO)dlsym(f->handle, "cuFileRead");
	f->write = (fnFileIO)dlsym(f->handle, "cuFileWrite");
	f->errorText = (fnFileErrorText)dlsym(f->handle, "cufileop_status_error");
	return NULL;
}

static stasisFileError stasis_cufile_driver_open(stasisCuFile *f) { return f->driverOpen(); }
static stasisFileError stasis_cufile_version(stasisCuFile *f, int *v) { return f->getVersion(v); }
static stasisFileError stasis_cufile_nvfs(stasisCuFile *f, unsigned int *major, unsigned int *minor) {
	uint64_t props[512]; // 4 KiB, far more than CUfileDrvProps_t
	memset(props, 0, sizeof(props));
	stasisFileError e = f->driverGetProperties(props);
	stasisNvfsVersion *v = (stasisNvfsVersion *)props;
	*major = v->major_version;
	*minor = v->minor_version;
	return e;
}
static const char *stasis_cufile_error_text(stasisCuFile *f, int code) { return f->errorText ? f->errorText(code) : NULL; }

static stasisFileError stasis_cufile_handle_register(stasisCuFile *f, void *ctx, int fd, void **fh) {
	stasisFileError e = {0, 0};
	if ((e.cu_err = f->ctxSetCurrent(ctx))) { e.err = -1; return e; }
	stasisFileDescr d;
	memset(&d, 0, sizeof(d));
	d.type = STASIS_FILE_HANDLE_TYPE_OPAQUE_FD;
	d.handle.fd = fd;
	return f->handleRegister(fh, &d);
}
static void stasis_cufile_handle_deregister(stasisCuFile *f, void *fh) { f->handleDeregister(fh); }
static stasisFileError stasis_cufile_buf_register(stasisCuFile *f, void *ctx, uint64_t base, size_t n) {
	stasisFileError e = {0, 0};
	if ((e.cu_err = f->ctxSetCurrent(ctx))) { e.err = -1; return e; }
	return f->bufRegister((const void *)base, n, 0);
}
static stasisFileError stasis_cufile_buf_deregister(stasisCuFile *f, void *ctx, uint64_t base) {
	stasisFileError e = {0, 0};
	if ((e.cu_err = f->ctxSetCurrent(ctx))) { e.err = -1; return e; }
	return f->bufDeregister((const void *)base);
}
// stasis_cufile_io reads (write == 0) or writes n bytes at base+devOff from
// or to the file at fileOff. It returns what cuFile returns: the bytes
// moved, -1 with errno set, or a negative cuFile error number; *cuErr is
// set when the context could not be made current.
static ssize_t stasis_cufile_io(stasisCuFile *f, void *ctx, int write, void *fh, uint64_t base, size_t n, int64_t fileOff,
                                int64_t devOff, int *cuErr) {
	if ((*cuErr = f->ctxSetCurrent(ctx))) return -1;
	return (write ? f->write : f->read)(fh, (void *)base, n, (off_t)fileOff, (off_t)devOff);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"
)

// LibCuFileEnv names the libcufile to load instead of searching for one.
const LibCuFileEnv = "STASIS_LIBCUFILE"

// CuFileError is a failed cuFile call: cuFile's error number (CUfileOpError,
// 5001 and up) and, when cuFile reports one, the CUDA driver's.
type CuFileError struct {
	Call string // "cuFileHandleRegister", ...
	Code int    // the cuFile error number; 0 when only CUDA failed
	CUDA int    // the CUresult, 0 when none
	Text string // cuFile's description of Code, when it gives one
}

func (e *CuFileError) Error() string {
	msg := e.Call + " failed"
	if e.Text != "" {
		msg += ": " + e.Text
	}
	if e.Code != 0 {
		msg += fmt.Sprintf(" (cuFile error %d)", e.Code)
	}
	if e.CUDA != 0 {
		msg += fmt.Sprintf(" (CUresult %d)", e.CUDA)
	}
	return msg
}

// CuFile is the opened cuFile library (libcufile.so.0) with its driver
// open. The driver stays open for the life of the process.
type CuFile struct {
	Path string
	// Version is the library's (1000*major + 10*minor: 1150 for 1.15); 0
	// when it does not say (cuFileGetVersion came with cuFile 1.9).
	Version int
	// GDS reports whether cuFile moves data by DMA between GPU memory and
	// the disk (GPUDirect Storage, through nvidia-fs); when false it runs
	// in compat mode, with POSIX reads and writes through host memory.
	GDS bool
	// ModeWhy says how GDS was told.
	ModeWhy string

	f   C.stasisCuFile
	drv *Driver
}

var (
	cuFileOnce sync.Once
	cuFile     *CuFile
	cuFileErr  error
)

// OpenCuFile loads libcufile and opens the cuFile driver, once per process
// (drv is libcuda, whose contexts the calls run in). The error says why
// cuFile cannot be used, in one line.
func OpenCuFile(drv *Driver) (*CuFile, error) {
	cuFileOnce.Do(func() { cuFile, cuFileErr = openCuFile(drv, CuFileCandidates()) })
	return cuFile, cuFileErr
}

// CuFileCandidates lists where libcufile is looked for, in order:
// $STASIS_LIBCUFILE alone when set; else the name as the dynamic loader
// finds it, then the CUDA toolkit's library directories (libcufile ships
// with the toolkit, which is often not on the loader's path).
func CuFileCandidates() []string {
	if p := os.Getenv(LibCuFileEnv); p != "" {
		return []string{p}
	}
	paths := []string{"libcufile.so.0"}
	for _, dir := range ToolkitLibDirs() {
		paths = append(paths, filepath.Join(dir, "libcufile.so.0"))
	}
	return paths
}

func openCuFile(drv *Driver, candidates []string) (*CuFile, error) {
	if drv.d.ctxSetCurrent == nil {
		return nil, fmt.Errorf("%s lacks cuCtxSetCurrent", drv.Path)
	}
	f := &CuFile{drv: drv}
	var first string
	for _, path := range candidates {
		if strings.Contains(path, "/") {
			if _, err := os.Stat(path); err != nil {
				continue
			}
		}
		cpath := C.CString(path)
		msg := C.stasis_cufile_open(cpath, &f.f)
		C.free(unsafe.Pointer(cpath))
		if msg == nil {
			f.Path = path
			break
		}
		if first == "" {
			first = C.GoString(msg)
		}
	}
	if f.Path == "" {
		if len(candidates) == 1 {
			return nil, fmt.Errorf("%s: cannot load it: %s", candidates[0], first)
		}
		return nil, errors.New("libcufile.so.0 not found (searched the loader's path and the CUDA toolkit's lib directories; $" + LibCuFileEnv + " names one)")
	}
	var missing []string
	for name, p := range map[string]unsafe.Pointer{
		"cuFileDriverOpen": unsafe.Pointer(f.f.driverOpen), "cuFileHandleRegister": unsafe.Pointer(f.f.handleRegister),
		"cuFileHandleDeregister": unsafe.Pointer(f.f.handleDeregister), "cuFileBufRegister": unsafe.Pointer(f.f.bufRegister),
		"cuFileBufDeregister": unsafe.Pointer(f.f.bufDeregister), "cuFileRead": unsafe.Pointer(f.f.read), "cuFileWrite": unsafe.Pointer(f.f.write),
	} {
		if p == nil {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return nil, fmt.Errorf("%s lacks %s", f.Path, strings.Join(missing, ", "))
	}
	f.f.ctxSetCurrent = C.fnCtxSet(unsafe.Pointer(drv.d.ctxSetCurrent))
	if err := f.check("cuFileDriverOpen", C.stasis_cufile_driver_open(&f.f)); err != nil {
		return nil, err
	}
	if f.f.getVersion != nil {
		var v C.int
		if f.check("cuFileGetVersion", C.stasis_cufile_version(&f.f, &v)) == nil {
			f.Version = int(v)
		}
	}
	f.GDS, f.ModeWhy = f.mode()
	return f, nil
}

// VersionString is Version as major.minor ("" when unknown).
func (f *CuFile) VersionString() string {
	if f.Version == 0 {
		return ""
	}
	return fmt.Sprintf("%d.%d", f.Version/1000, f.Version%1000/10)
}

// mode tells GPUDirect Storage from compat mode: GDS needs the nvidia-fs
// kernel driver, whose version cuFileDriverGetProperties reports (0 when
// it is not loaded), and is off when CUFILE_FORCE_COMPAT_MODE is true.
func (f *CuFile) mode() (bool, string) {
	if force := os.Getenv("CUFILE_FORCE_COMPAT_MODE"); strings.EqualFold(force, "true") {
		return false, "compat mode: CUFILE_FORCE_COMPAT_MODE=" + force
	}
	if f.f.driverGetProperties == nil {
		return false, "compat mode taken: " + f.Path + " lacks cuFileDriverGetProperties, so the nvidia-fs version is unknown"
	}
	var major, minor C.uint
	if err := f.check("cuFileDriverGetProperties", C.stasis_cufile_nvfs(&f.f, &major, &minor)); err != nil {
		return false, "compat mode taken: " + err.Error()
	}
	if major == 0 && minor == 0 {
		return false, "compat mode: nvidia-fs is not loaded (cuFile reports no nvidia-fs version), so cuFile reads and writes through host memory"
	}
	return true, fmt.Sprintf("GPUDirect Storage: nvidia-fs %d.%d", major, minor)
}

func (f *CuFile) check(call string, e C.stasisFileError) error {
	if e.err == 0 && e.cu_err == 0 {
		return nil
	}
	err := &CuFileError{Call: call, CUDA: int(e.cu_err)}
	if e.err > 0 {
		err.Code = int(e.err)
		if text := C.stasis_cufile_error_text(&f.f, e.err); text != nil {
			err.Text = C.GoString(text)
		}
	}
	return err
}

// CuFileHandle is a file registered with cuFile.
type CuFileHandle struct {
	f  *CuFile
	fh unsafe.Pointer
}

// RegisterFile registers an open file (O_DIRECT for GPUDirect Storage)
// with cuFile; ctx is a context of the GPU the I/O will use.
func (f *CuFile) RegisterFile(ctx Context, fd int) (*CuFileHandle, error) {
	h := &CuFileHandle{f: f}
	if err := f.check("cuFileHandleRegister", C.stasis_cufile_handle_register(&f.f, unsafe.Pointer(ctx), C.int(fd), &h.fh)); err != nil {
		return nil, err
	}
	return h, nil
}

// Close deregisters the file; the caller closes it.
func (h *CuFileHandle) Close() {
	if h.fh != nil {
		C.stasis_cufile_handle_deregister(&h.f.f, h.fh)
		h.fh = nil
	}
}

// RegisterBuffer registers n bytes of GPU memory at base with cuFile, so
// that I/O to and from it needs no bounce buffers; I/O to unregistered
// memory works too, more slowly.
func (f *CuFile) RegisterBuffer(ctx Context, base uintptr, n int64) error {
	return f.check("cuFileBufRegister", C.stasis_cufile_buf_register(&f.f, unsafe.Pointer(ctx), C.uint64_t(base), C.size_t(n)))
}

// DeregisterBuffer undoes RegisterBuffer.
func (f *CuFile) DeregisterBuffer(ctx Context, base uintptr) error {
	return f.check("cuFileBufDeregister", C.stasis_cufile_buf_deregister(&f.f, unsafe.Pointer(ctx), C.uint64_t(base)))
}

// Write writes n bytes of GPU memory at base+off into the file at fileOff
// (base is the start of a registered buffer, or any device pointer with
// off 0). It may be called from several goroutines at once.
func (h *CuFileHandle) Write(ctx Context, base uintptr, off int64, n int64, fileOff int64) error {
	return h.io("cuFileWrite", 1, ctx, base, off, n, fileOff)
}

// Read reads n bytes of the file at fileOff into GPU memory at base+off.
func (h *CuFileHandle) Read(ctx Context, base uintptr, off int64, n int64, fileOff int64) error {
	return h.io("cuFileRead", 0, ctx, base, off, n, fileOff)
}

func (h *CuFileHandle) io(call string, write C.int, ctx Context, base uintptr, off, n, fileOff int64) error {
	for done := int64(0); done < n; {
		var cuErr C.int
		rv, errno := C.stasis_cufile_io(&h.f.f, unsafe.Pointer(ctx), write, h.fh, C.uint64_t(base), C.size_t(n-done),
			C.int64_t(fileOff+done), C.int64_t(off+done), &cuErr)
		r := int64(rv)
		switch {
		case cuErr != 0:
			return &CuFileError{Call: call, CUDA: int(cuErr)}
		case r == -1:
			if errno == nil {
				errno = syscall.EIO
			}
			return fmt.Errorf("%s failed: %w", call, errno)
		case r < 0:
			e := &CuFileError{Call: call, Code: int(-r)}
			if text := C.stasis_cufile_error_text(&h.f.f, C.int(-r)); text != nil {
				e.Text = C.GoString(text)
			}
			return e
		case r == 0:
			return fmt.Errorf("%s moved 0 of %d bytes at file offset %d", call, n-done, fileOff+done)
		}
		done += r
	}
	return nil
}

// ToolkitLibDirs lists the CUDA toolkit's library directories:
// /usr/local/cuda's, then those of versioned toolkits, newest first.
func ToolkitLibDirs() []string {
	dirs := []string{"/usr/local/cuda/lib64"}
	target := map[string]string{"amd64": "x86_64-linux", "arm64": "sbsa-linux"}[runtime.GOARCH]
	if target == "" {
		return dirs
	}
	dirs = append(dirs, "/usr/local/cuda/targets/"+target+"/lib")
	versioned, _ := filepath.Glob("/usr/local/cuda-*/targets/" + target + "/lib")
	sort.Slice(versioned, func(i, j int) bool { return VersionLess(versioned[j], versioned[i]) })
	return append(dirs, versioned...)
}

// VersionLess compares strings piecewise, numbers by value, so that
// cuda-12.10 sorts after cuda-12.9.
func VersionLess(a, b string) bool {
	split := func(s string) []string {
		return strings.FieldsFunc(s, func(r rune) bool { return r == '.' || r == '-' || r == '/' })
	}
	pa, pb := split(a), split(b)
	for i := 0; i < len(pa) && i < len(pb); i++ {
		if pa[i] == pb[i] {
			continue
		}
		na, errA := strconv.Atoi(pa[i])
		nb, errB := strconv.Atoi(pb[i])
		if errA == nil && errB == nil {
			return na < nb
		}
		return pa[i] < pb[i]
	}
	return len(pa) < len(pb)
}
