package cuda

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;

// The argument structs of the checkpoint API, as the CUDA 13 headers lay
// them out: each 64 bytes, reserved fields zeroed.
typedef struct { unsigned int timeoutMs; unsigned int reserved0; uint64_t reserved1[7]; } stasisLockArgs;
typedef struct { uint64_t reserved[8]; } stasisPlainArgs;
typedef struct { unsigned char bytes[16]; } stasisUUID;
typedef struct { stasisUUID oldUuid; stasisUUID newUuid; } stasisGpuPair;
typedef struct { stasisGpuPair *gpuPairs; unsigned int gpuPairsCount; char reserved[52 - sizeof(stasisGpuPair *)]; uint64_t reserved1; } stasisRestoreArgs;

typedef CUresult (*fnInit)(unsigned int);
typedef CUresult (*fnDriverGetVersion)(int *);
typedef CUresult (*fnDeviceGetCount)(int *);
typedef CUresult (*fnDeviceGet)(int *, int);
typedef CUresult (*fnDeviceGetName)(char *, int, int);
typedef CUresult (*fnDeviceGetUuid)(stasisUUID *, int);
typedef CUresult (*fnGetErrorName)(CUresult, const char **);
typedef CUresult (*fnGetState)(int, int *);
typedef CUresult (*fnLock)(int, stasisLockArgs *);
typedef CUresult (*fnPlain)(int, stasisPlainArgs *);
typedef CUresult (*fnRestore)(int, stasisRestoreArgs *);
typedef CUresult (*fnGetRestoreThreadId)(int, int *);
typedef CUresult (*fnPointerGetAttribute)(void *, int, uint64_t);
typedef CUresult (*fnCtxSetCurrent)(void *);
typedef CUresult (*fnMemcpyDtoH)(void *, uint64_t, size_t);
typedef CUresult (*fnMemcpyHtoD)(uint64_t, const void *, size_t);
typedef CUresult (*fnMemHostRegister)(void *, size_t, unsigned int);
typedef CUresult (*fnMemHostUnregister)(void *);
typedef CUresult (*fnDevicePrimaryCtxRetain)(void **, int);
typedef CUresult (*fnMemAlloc)(uint64_t *, size_t);
typedef CUresult (*fnMemFree)(uint64_t);
typedef CUresult (*fnStreamCreate)(void **, unsigned int);
typedef CUresult (*fnStreamDestroy)(void *);
typedef CUresult (*fnStreamSynchronize)(void *);
typedef CUresult (*fnMemcpyDtoHAsync)(void *, uint64_t, size_t, void *);
typedef CUresult (*fnModuleLoadData)(void **, const void *);
typedef CUresult (*fnModuleUnload)(void *);
typedef CUresult (*fnModuleGetFunction)(void **, void *, const char *);
typedef CUresult (*fnLaunchKernel)(void *, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
	unsigned int, void *, void **, void **);

typedef struct {
	void *handle;
	fnInit init;
	fnDriverGetVersion driverGetVersion;
	fnDeviceGetCount deviceGetCount;
	fnDeviceGet deviceGet;
	fnDeviceGetName deviceGetName;
	fnDeviceGetUuid deviceGetUuid;
	fnGetErrorName getErrorName;
	fnGetState getState;
	fnLock lock;
	fnPlain checkpoint;
	fnRestore restore;
	fnPlain unlock;
	fnGetRestoreThreadId getRestoreThreadId;
	fnPointerGetAttribute pointerGetAttribute;
	fnCtxSetCurrent ctxSetCurrent;
	fnMemcpyDtoH memcpyDtoH;
	fnMemcpyHtoD memcpyHtoD;
	fnMemHostRegister memHostRegister;
	fnMemHostUnregister memHostUnregister;
	fnDevicePrimaryCtxRetain primaryCtxRetain;
	fnMemAlloc memAlloc;
	fnMemFree memFree;
	fnStreamCreate streamCreate;
	fnStreamDestroy streamDestroy;
	fnStreamSynchronize streamSynchronize;
	fnMemcpyDtoHAsync memcpyDtoHAsync;
	fnModuleLoadData moduleLoadData;
	fnModuleUnload moduleUnload;
	fnModuleGetFunction moduleGetFunction;
	fnLaunchKernel launchKernel;
} stasisDriver;

static void *stasis_sym(void *h, const char *name) { return dlsym(h, name); }

static const char *stasis_open(const char *path, stasisDriver *d) {
	memset(d, 0, sizeof(*d));
	d->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!d->handle) return dlerror();
	d->init = (fnInit)stasis_sym(d->handle, "cuInit");
	d->driverGetVersion = (fnDriverGetVersion)stasis_sym(d->handle, "cuDriverGetVersion");
	d->deviceGetCount = (fnDeviceGetCount)stasis_sym(d->handle, "cuDeviceGetCount");
	d->deviceGet = (fnDeviceGet)stasis_sym(d->handle, "cuDeviceGet");
	d->deviceGetName = (fnDeviceGetName)stasis_sym(d->handle, "cuDeviceGetName");
	d->deviceGetUuid = (fnDeviceGetUuid)stasis_sym(d->handle, "cuDeviceGetUuid_v2");
	if (!d->deviceGetUuid) d->deviceGetUuid = (fnDeviceGetUuid)stasis_sym(d->handle, "cuDeviceGetUuid");
	d->getErrorName = (fnGetErrorName)stasis_sym(d->handle, "cuGetErrorName");
	d->getState = (fnGetState)stasis_sym(d->handle, "cuCheckpointProcessGetState");
	d->lock = (fnLock)stasis_sym(d->handle, "cuCheckpointProcessLock");
	d->checkpoint = (fnPlain)stasis_sym(d->handle, "cuCheckpointProcessCheckpoint");
	d->restore = (fnRestore)stasis_sym(d->handle, "cuCheckpointProcessRestore");
	d->unlock = (fnPlain)stasis_sym(d->handle, "cuCheckpointProcessUnlock");
	d->getRestoreThreadId = (fnGetRestoreThreadId)stasis_sym(d->handle, "cuCheckpointProcessGetRestoreThreadId");
	d->pointerGetAttribute = (fnPointerGetAttribute)stasis_sym(d->handle, "cuPointerGetAttribute");
	d->ctxSetCurrent = (fnCtxSetCurrent)stasis_sym(d->handle, "cuCtxSetCurrent");
	d->memcpyDtoH = (fnMemcpyDtoH)stasis_sym(d->handle, "cuMemcpyDtoH_v2");
	d->memcpyHtoD = (fnMemcpyHtoD)stasis_sym(d->handle, "cuMemcpyHtoD_v2");
	d->memHostRegister = (fnMemHostRegister)stasis_sym(d->handle, "cuMemHostRegister_v2");
	d->memHostUnregister = (fnMemHostUnregister)stasis_sym(d->handle, "cuMemHostUnregister");
	d->primaryCtxRetain = (fnDevicePrimaryCtxRetain)stasis_sym(d->handle, "cuDevicePrimaryCtxRetain");
	d->memAlloc = (fnMemAlloc)stasis_sym(d->handle, "cuMemAlloc_v2");
	d->memFree = (fnMemFree)stasis_sym(d->handle, "cuMemFree_v2");
	d->streamCreate = (fnStreamCreate)stasis_sym(d->handle, "cuStreamCreate");
	d->streamDestroy = (fnStreamDestroy)stasis_sym(d->handle, "cuStreamDestroy_v2");
	d->streamSynchronize = (fnStreamSynchronize)stasis_sym(d->handle, "cuStreamSynchronize");
	d->memcpyDtoHAsync = (fnMemcpyDtoHAsync)stasis_sym(d->handle, "cuMemcpyDtoHAsync_v2");
	d->moduleLoadData = (fnModuleLoadData)stasis_sym(d->handle, "cuModuleLoadData");
	d->moduleUnload = (fnModuleUnload)stasis_sym(d->handle, "cuModuleUnload");
	d->moduleGetFunction = (fnModuleGetFunction)stasis_sym(d->handle, "cuModuleGetFunction");
	d->launchKernel = (fnLaunchKernel)stasis_sym(d->handle, "cuLaunchKernel");
	return NULL;
}

// Memory calls make the pointer's context current first, in the same call,
// so that the calling thread (any Go thread) has it.
#define CU_POINTER_ATTRIBUTE_CONTEXT 1
static CUresult stasis_ptr_ctx(stasisDriver *d, uint64_t ptr, void **ctx) {
	return d->pointerGetAttribute(ctx, CU_POINTER_ATTRIBUTE_CONTEXT, ptr);
}
static CUresult stasis_dtoh(stasisDriver *d, void *ctx, void *dst, uint64_t src, size_t n) {
	CUresult r = d->ctxSetCurrent(ctx);
	return r ? r : d->memcpyDtoH(dst, src, n);
}
// stasis_dtoh_many copies n ranges from device to host memory, queued on
// one stream (created blocking, so it waits for work on the legacy default
// stream) and waited for once: the copies run back to back, without a
// round trip each. Without the stream calls, one synchronous copy each.
// *failed is the index of a copy that could not be queued or made.
static CUresult stasis_dtoh_many(stasisDriver *d, void *ctx, int n, const uint64_t *dst, const uint64_t *src, const uint64_t *len, int *failed) {
	CUresult r = d->ctxSetCurrent(ctx);
	if (r) return r;
	if (!d->streamCreate || !d->streamDestroy || !d->streamSynchronize || !d->memcpyDtoHAsync) {
		for (int i = 0; i < n; i++) {
			if ((r = d->memcpyDtoH((void *)dst[i], src[i], len[i]))) { *failed = i; return r; }
		}
		return 0;
	}
	void *stream;
	if ((r = d->streamCreate(&stream, 0))) return r;
	for (int i = 0; i < n && !r; i++) {
		if ((r = d->memcpyDtoHAsync((void *)dst[i], src[i], len[i], stream))) *failed = i;
	}
	CUresult waited = d->streamSynchronize(stream);
	d->streamDestroy(stream);
	return r ? r : waited;
}
static CUresult stasis_htod(stasisDriver *d, void *ctx, uint64_t dst, const void *src, size_t n) {
	CUresult r = d->ctxSetCurrent(ctx);
	return r ? r : d->memcpyHtoD(dst, src, n);
}
static CUresult stasis_host_register(stasisDriver *d, void *ctx, void *p, size_t n) {
	CUresult r = d->ctxSetCurrent(ctx);
	return r ? r : d->memHostRegister(p, n, 1); // CU_MEMHOSTREGISTER_PORTABLE: pinned for every context
}
static CUresult stasis_host_unregister(stasisDriver *d, void *ctx, void *p) {
	CUresult r = d->ctxSetCurrent(ctx);
	return r ? r : d->memHostUnregister(p);
}
static CUresult stasis_primary_ctx(stasisDriver *d, int ordinal, void **ctx) {
	int dev;
	CUresult r = d->deviceGet(&dev, ordinal);
	return r ? r : d->primaryCtxRetain(ctx, dev);
}
static CUresult stasis_alloc(stasisDriver *d, void *ctx, uint64_t *p, size_t n) {
	CUresult r = d->ctxSetCurrent(ctx);
	return r ? r : d->memAlloc(p, n);
}
static CUresult stasis_free(stasisDriver *d, void *ctx, uint64_t p) {
	CUresult r = d->ctxSetCurrent(ctx);
	return r ? r : d->memFree(p);
}

// The CRC32C kernel (crc32c.go). stasis_module_load loads a PTX image in
// ctx and finds the kernel in it.
static CUresult stasis_module_load(stasisDriver *d, void *ctx, const void *image, const char *name, void **mod, void **fn, int *step) {
	CUresult r = d->ctxSetCurrent(ctx);
	if (r) return r;
	*step = 1;
	if ((r = d->moduleLoadData(mod, image))) return r;
	*step = 2;
	if ((r = d->moduleGetFunction(fn, *mod, name))) {
		d->moduleUnload(*mod);
		*mod = NULL;
	}
	return r;
}
static CUresult stasis_module_unload(stasisDriver *d, void *ctx, void *mod) {
	CUresult r = d->ctxSetCurrent(ctx);
	return r ? r : d->moduleUnload(mod);
}
static CUresult stasis_stream_create(stasisDriver *d, void *ctx, void **stream) {
	CUresult r = d->ctxSetCurrent(ctx);
	return r ? r : d->streamCreate(stream, 0); // blocking: ordered after the legacy default stream
}
static CUresult stasis_stream_destroy(stasisDriver *d, void *ctx, void *stream) {
	CUresult r = d->ctxSetCurrent(ctx);
	return r ? r : d->streamDestroy(stream);
}
// stasis_crc_blocks runs the kernel over n bytes at src on stream, one
// thread per 4096-byte block, into devOut, copies the block checksums to
// hostOut and waits for both. *step names the call that failed.
static CUresult stasis_crc_blocks(stasisDriver *d, void *ctx, void *fn, void *stream, uint64_t src, uint64_t n,
                                  uint64_t devOut, uint32_t *hostOut, int *step) {
	CUresult r = d->ctxSetCurrent(ctx);
	if (r) return r;
	uint64_t blocks = (n + 4095) / 4096;
	unsigned int threads = 128, grid = (unsigned int)((blocks + threads - 1) / threads);
	void *args[] = {&src, &n, &devOut};
	*step = 1;
	if ((r = d->launchKernel(fn, grid, 1, 1, threads, 1, 1, 0, stream, args, NULL))) return r;
	*step = 2;
	if ((r = d->memcpyDtoHAsync(hostOut, devOut, blocks * 4, stream))) return r;
	*step = 3;
	return d->streamSynchronize(stream);
}

static CUresult stasis_init(stasisDriver *d) { return d->init(0); }
static CUresult stasis_driver_version(stasisDriver *d, int *v) { return d->driverGetVersion(v); }
static CUresult stasis_device_count(stasisDriver *d, int *n) { return d->deviceGetCount(n); }
static CUresult stasis_device(stasisDriver *d, int ordinal, char *name, int len, stasisUUID *uuid) {
	int dev;
	CUresult r = d->deviceGet(&dev, ordinal);
	if (r) return r;
	r = d->deviceGetName(name, len, dev);
	if (r) return r;
	return d->deviceGetUuid(uuid, dev);
}
static const char *stasis_error_name(stasisDriver *d, CUresult r) {
	const char *s = NULL;
	if (d->getErrorName && d->getErrorName(r, &s) == 0) return s;
	return NULL;
}
static CUresult stasis_get_state(stasisDriver *d, int pid, int *state) { return d->getState(pid, state); }
static CUresult stasis_lock(stasisDriver *d, int pid, unsigned int timeoutMs) {
	stasisLockArgs a;
	memset(&a, 0, sizeof(a));
	a.timeoutMs = timeoutMs;
	return d->lock(pid, &a);
}
static CUresult stasis_checkpoint(stasisDriver *d, int pid) {
	stasisPlainArgs a;
	memset(&a, 0, sizeof(a));
	return d->checkpoint(pid, &a);
}
static CUresult stasis_restore(stasisDriver *d, int pid, stasisGpuPair *pairs, unsigned int n) {
	stasisRestoreArgs a;
	memset(&a, 0, sizeof(a));
	a.gpuPairs = pairs;
	a.gpuPairsCount = n;
	return d->restore(pid, n ? &a : NULL);
}
static CUresult stasis_unlock(stasisDriver *d, int pid) {
	stasisPlainArgs a;
	memset(&a, 0, sizeof(a));
	return d->unlock(pid, &a);
}
static CUresult stasis_restore_thread(stasisDriver *d, int pid, int *tid) { return d->getRestoreThreadId(pid, tid); }
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"
	"unsafe"
)

// ErrUnavailable is wrapped by every error that means the machine cannot do
// GPU checkpoints: no libcuda, or one without the checkpoint API.
var ErrUnavailable = errors.New("CUDA checkpointing is unavailable")

// Error is a failed driver call.
type Error struct {
	Call string // "cuCheckpointProcessLock", ...
	PID  int    // 0 when the call names no process
	Code int    // the CUresult
	Name string // e.g. CUDA_ERROR_NOT_READY
}

func (e *Error) Error() string {
	name := e.Name
	if name == "" {
		name = fmt.Sprintf("CUresult %d", e.Code)
	}
	if e.PID != 0 {
		return fmt.Sprintf("%s(pid %d): %s", e.Call, e.PID, name)
	}
	return fmt.Sprintf("%s: %s", e.Call, name)
}

// CUresult codes stasis reacts to.
const (
	codeNotInitialized = 3   // CUDA_ERROR_NOT_INITIALIZED: the process never initialized CUDA
	codeNotReady       = 600 // CUDA_ERROR_NOT_READY: a lock timed out
)

// notInitializedPattern matches what cuda-checkpoint says for a process
// that never initialized CUDA: the error's string (cuGetErrorString) or
// its name.
var notInitializedPattern = regexp.MustCompile(`(?i)initialization error|not[ _]initialized`)

// NotInitialized reports whether err is the driver's answer for a process
// that has libcuda mapped but never initialized CUDA
// (CUDA_ERROR_NOT_INITIALIZED, through either backend): a process forked
// from a CUDA process after its cuInit, such as a PyTorch DataLoader
// worker started with fork, inherits the library but not the driver's
// state. Such a process is not a CUDA process; its checkpoint is CRIU's
// alone.
func NotInitialized(err error) bool {
	var e *Error
	var te *ToolError
	return errors.As(err, &e) && e.Code == codeNotInitialized || errors.As(err, &te) && notInitializedPattern.MatchString(te.Output)
}

// TimedOut reports whether err is a lock that timed out, through either
// backend.
func TimedOut(err error) bool {
	var e *Error
	var te *ToolError
	return errors.As(err, &e) && e.Code == codeNotReady || errors.As(err, &te) && te.TimedOut
}

// State is a process's checkpoint state (CUprocessState).
type State int

const (
	Running      State = 0
	Locked       State = 1
	Checkpointed State = 2
	Failed       State = 3
)

func (s State) String() string {
	switch s {
	case Running:
		return "running"
	case Locked:
		return "locked"
	case Checkpointed:
		return "checkpointed"
	case Failed:
		return "failed"
	}
	return fmt.Sprintf("state %d", int(s))
}

// Driver is an opened libcuda. Its process checkpoint calls (ProcessState,
// Lock, Checkpoint, Restore, Unlock, RestoreThreadID) go to a backend:
// libcuda's checkpoint API where the driver exports it, else NVIDIA's
// cuda-checkpoint tool (tool.go). The memory calls are libcuda's alone.
type Driver struct {
	d       C.stasisDriver
	Path    string
	proc    procBackend
	backend Backend
}

// procBackend makes the process checkpoint calls.
type procBackend interface {
	state(pid int) (State, error)
	lock(pid int, timeout time.Duration) error
	checkpoint(pid int) error
	restore(pid int, pairs []GPUPair) error
	unlock(pid int) error
	restoreThreadID(pid int) (int, error)
	// canRemap says why a restore with GPU pairs cannot be done (nil
	// when it can).
	canRemap() error
}

// Backend kinds.
const (
	BackendAPI  = "api"             // libcuda's cuCheckpointProcess* functions
	BackendTool = "cuda-checkpoint" // NVIDIA's cuda-checkpoint binary
)

// Backend says how a Driver makes the process checkpoint calls, and why.
type Backend struct {
	Kind   string `json:"kind"`   // BackendAPI or BackendTool
	Path   string `json:"path"`   // the library, or the tool
	Reason string `json:"reason"` // why this one
}

// Backend reports the backend of the process checkpoint calls; Kind is ""
// when there is none (Load fails then).
func (d *Driver) Backend() Backend { return d.backend }

var (
	loadOnce sync.Once
	loaded   *Driver
	loadErr  error
)

// LibraryPath is the library Load opens: $STASIS_LIBCUDA, else libcuda.so.1
// as the dynamic loader finds it.
func LibraryPath() string {
	if p := os.Getenv("STASIS_LIBCUDA"); p != "" {
		return p
	}
	return "libcuda.so.1"
}

// Load opens libcuda once per process and initialises the driver, for
// process checkpoints: it fails (wrapping ErrUnavailable) unless there is
// a backend for the process checkpoint calls, libcuda's checkpoint API or
// a cuda-checkpoint binary (FindTool).
func Load() (*Driver, error) {
	d, err := LoadLibrary()
	if err != nil {
		return nil, err
	}
	if none, ok := d.proc.(noBackend); ok {
		return nil, none.why
	}
	return d, nil
}

// LoadLibrary opens libcuda once per process and initialises the driver,
// for the memory calls, which need no checkpoint backend.
func LoadLibrary() (*Driver, error) {
	loadOnce.Do(func() { loaded, loadErr = load(LibraryPath()) })
	return loaded, loadErr
}

// CheckpointAPI names the checkpoint API's functions as libcuda exports
// them.
var CheckpointAPI = []string{
	"cuCheckpointProcessGetState", "cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint",
	"cuCheckpointProcessRestore", "cuCheckpointProcessUnlock", "cuCheckpointProcessGetRestoreThreadId",
}

func load(path string) (*Driver, error) {
	d := &Driver{Path: path}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	if msg := C.stasis_open(cpath, &d.d); msg != nil {
		return nil, fmt.Errorf("%w: %s (no NVIDIA driver here?)", ErrUnavailable, C.GoString(msg))
	}
	var missing []string
	for name, p := range map[string]unsafe.Pointer{
		"cuInit": unsafe.Pointer(d.d.init), "cuDriverGetVersion": unsafe.Pointer(d.d.driverGetVersion),
		"cuDeviceGetCount": unsafe.Pointer(d.d.deviceGetCount), "cuDeviceGet": unsafe.Pointer(d.d.deviceGet),
		"cuDeviceGetName": unsafe.Pointer(d.d.deviceGetName), "cuDeviceGetUuid": unsafe.Pointer(d.d.deviceGetUuid),
	} {
		if p == nil {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return nil, fmt.Errorf("%w: %s lacks %s (not an NVIDIA driver?)", ErrUnavailable, path, strings.Join(missing, ", "))
	}
	if err := d.check("cuInit", 0, C.stasis_init(&d.d)); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	d.pickBackend()
	return d, nil
}

// pickBackend chooses the backend of the process checkpoint calls:
// libcuda's API when it exports all of it, else cuda-checkpoint.
func (d *Driver) pickBackend() {
	var missing []string
	for i, p := range []unsafe.Pointer{
		unsafe.Pointer(d.d.getState), unsafe.Pointer(d.d.lock), unsafe.Pointer(d.d.checkpoint),
		unsafe.Pointer(d.d.restore), unsafe.Pointer(d.d.unlock), unsafe.Pointer(d.d.getRestoreThreadId),
	} {
		if p == nil {
			missing = append(missing, CheckpointAPI[i])
		}
	}
	if len(missing) == 0 {
		d.proc = apiBackend{d}
		d.backend = Backend{Kind: BackendAPI, Path: d.Path, Reason: "libcuda exports the checkpoint API"}
		return
	}
	lacks := fmt.Sprintf("%s lacks %s", d.Path, strings.Join(missing, ", "))
	if len(missing) == len(CheckpointAPI) {
		lacks = d.Path + " lacks the checkpoint API (cuCheckpointProcess*; drivers before 570)"
	}
	path, where, err := FindTool()
	if err != nil {
		d.proc = noBackend{fmt.Errorf("%w: %s and %v: upgrade the NVIDIA driver to 570 or later, or install NVIDIA's cuda-checkpoint (on PATH, beside stasis, or named by $%s)", ErrUnavailable, lacks, err, ToolEnv)}
		return
	}
	d.proc = &tool{path: path}
	d.backend = Backend{Kind: BackendTool, Path: path, Reason: fmt.Sprintf("%s; cuda-checkpoint found through %s", lacks, where)}
}

func (d *Driver) check(call string, pid int, r C.CUresult) error {
	if r == 0 {
		return nil
	}
	e := &Error{Call: call, PID: pid, Code: int(r)}
	if name := C.stasis_error_name(&d.d, r); name != nil {
		e.Name = C.GoString(name)
	}
	return e
}

// DriverVersion is the CUDA version the driver supports (13000 for 13.0).
func (d *Driver) DriverVersion() (int, error) {
	var v C.int
	err := d.check("cuDriverGetVersion", 0, C.stasis_driver_version(&d.d, &v))
	return int(v), err
}

// Device is one GPU as the driver lists it.
type Device struct {
	Index int    `json:"index"`
	Name  string `json:"name"`
	UUID  string `json:"uuid"` // GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, as nvidia-smi writes it
}

// Devices lists the GPUs this process can see.
func (d *Driver) Devices() ([]Device, error) {
	var n C.int
	if err := d.check("cuDeviceGetCount", 0, C.stasis_device_count(&d.d, &n)); err != nil {
		return nil, err
	}
	devs := make([]Device, 0, int(n))
	for i := 0; i < int(n); i++ {
		var name [256]C.char
		var uuid C.stasisUUID
		if err := d.check("cuDeviceGet", 0, C.stasis_device(&d.d, C.int(i), &name[0], 256, &uuid)); err != nil {
			return nil, err
		}
		var raw [16]byte
		for j := range raw {
			raw[j] = byte(uuid.bytes[j])
		}
		devs = append(devs, Device{Index: i, Name: C.GoString(&name[0]), UUID: FormatUUID(raw)})
	}
	return devs, nil
}

// FormatUUID writes a GPU UUID as nvidia-smi does.
func FormatUUID(b [16]byte) string {
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// ParseUUID reads a GPU UUID written by FormatUUID (the "GPU-" prefix is
// optional).
func ParseUUID(s string) ([16]byte, error) {
	var b [16]byte
	hex := strings.ReplaceAll(strings.TrimPrefix(s, "GPU-"), "-", "")
	if len(hex) != 32 {
		return b, fmt.Errorf("%q is not a GPU UUID", s)
	}
	for i := range b {
		if _, err := fmt.Sscanf(hex[2*i:2*i+2], "%02x", &b[i]); err != nil {
			return b, fmt.Errorf("%q is not a GPU UUID", s)
		}
	}
	return b, nil
}

// ProcessState returns the checkpoint state of a CUDA process.
func (d *Driver) ProcessState(pid int) (State, error) {
	return d.proc.state(pid)
}

// Lock blocks further CUDA calls of pid and waits, up to timeout, for the
// work it already submitted to finish.
func (d *Driver) Lock(pid int, timeout time.Duration) error {
	return d.proc.lock(pid, timeout)
}

// Checkpoint moves a locked process's GPU memory into its host memory and
// releases its GPU resources.
func (d *Driver) Checkpoint(pid int) error {
	return d.proc.checkpoint(pid)
}

// GPUPair maps a GPU of the checkpoint to a GPU of this machine.
type GPUPair struct{ Old, New [16]byte }

// Restore brings a checkpointed process's GPU state back, onto the GPUs
// pairs name (none: the same GPUs); the process stays locked.
func (d *Driver) Restore(pid int, pairs []GPUPair) error {
	if len(pairs) > 0 {
		if err := d.proc.canRemap(); err != nil {
			return err
		}
	}
	return d.proc.restore(pid, pairs)
}

// CanRemap says why this backend cannot restore onto other GPUs (Restore
// with pairs); nil when it can. Restores and migrations ask before they
// change anything.
func (d *Driver) CanRemap() error {
	return d.proc.canRemap()
}

// Unlock lets a locked process make CUDA calls again.
func (d *Driver) Unlock(pid int) error {
	return d.proc.unlock(pid)
}

// RestoreThreadID is the thread the driver uses inside pid for restores.
func (d *Driver) RestoreThreadID(pid int) (int, error) {
	return d.proc.restoreThreadID(pid)
}

// noBackend stands for a backend where there is none: every call fails
// with why (wrapping ErrUnavailable).
type noBackend struct{ why error }

func (n noBackend) state(int) (State, error)         { return 0, n.why }
func (n noBackend) lock(int, time.Duration) error    { return n.why }
func (n noBackend) checkpoint(int) error             { return n.why }
func (n noBackend) restore(int, []GPUPair) error     { return n.why }
func (n noBackend) unlock(int) error                 { return n.why }
func (n noBackend) restoreThreadID(int) (int, error) { return 0, n.why }
func (n noBackend) canRemap() error                  { return n.why }

// apiBackend makes the process checkpoint calls through libcuda's API.
type apiBackend struct{ d *Driver }

func (a apiBackend) state(pid int) (State, error) {
	var s C.int
	err := a.d.check("cuCheckpointProcessGetState", pid, C.stasis_get_state(&a.d.d, C.int(pid), &s))
	return State(s), err
}

func (a apiBackend) lock(pid int, timeout time.Duration) error {
	return a.d.check("cuCheckpointProcessLock", pid, C.stasis_lock(&a.d.d, C.int(pid), C.uint(lockMillis(timeout))))
}

// lockMillis is a lock timeout in milliseconds, at least 1 (0 would mean
// no timeout).
func lockMillis(timeout time.Duration) int64 {
	return max(timeout.Milliseconds(), 1)
}

func (a apiBackend) checkpoint(pid int) error {
	return a.d.check("cuCheckpointProcessCheckpoint", pid, C.stasis_checkpoint(&a.d.d, C.int(pid)))
}

func (a apiBackend) restore(pid int, pairs []GPUPair) error {
	var cpairs *C.stasisGpuPair
	if len(pairs) > 0 {
		mem := C.malloc(C.size_t(len(pairs)) * C.size_t(unsafe.Sizeof(C.stasisGpuPair{})))
		defer C.free(mem)
		arr := unsafe.Slice((*C.stasisGpuPair)(mem), len(pairs))
		for i, p := range pairs {
			for j := 0; j < 16; j++ {
				arr[i].oldUuid.bytes[j] = C.uchar(p.Old[j])
				arr[i].newUuid.bytes[j] = C.uchar(p.New[j])
			}
		}
		cpairs = &arr[0]
	}
	return a.d.check("cuCheckpointProcessRestore", pid, C.stasis_restore(&a.d.d, C.int(pid), cpairs, C.uint(len(pairs))))
}

func (a apiBackend) unlock(pid int) error {
	return a.d.check("cuCheckpointProcessUnlock", pid, C.stasis_unlock(&a.d.d, C.int(pid)))
}

func (a apiBackend) restoreThreadID(pid int) (int, error) {
	var tid C.int
	err := a.d.check("cuCheckpointProcessGetRestoreThreadId", pid, C.stasis_restore_thread(&a.d.d, C.int(pid), &tid))
	return int(tid), err
}

// canRemap: the API takes GPU pairs (a driver before CUDA 13.0 refuses
// them with an error of its own).
func (apiBackend) canRemap() error { return nil }

// UsesCUDA reports whether pid has libcuda mapped: the processes of a tree
// that may be CUDA processes. Only the driver knows whether one is: a
// process that never initialized CUDA has the library mapped too
// (NotInitialized).
func UsesCUDA(pid int) bool {
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	return err == nil && strings.Contains(string(maps), "libcuda.so")
}

// Context is a CUDA context (CUcontext).
type Context unsafe.Pointer

func (d *Driver) hasMemoryAPI() error {
	if d.d.pointerGetAttribute == nil || d.d.ctxSetCurrent == nil || d.d.memcpyDtoH == nil || d.d.memcpyHtoD == nil ||
		d.d.memHostRegister == nil || d.d.memHostUnregister == nil || d.d.primaryCtxRetain == nil || d.d.memAlloc == nil || d.d.memFree == nil {
		return fmt.Errorf("%w: %s lacks the memory calls stasis needs", ErrUnavailable, d.Path)
	}
	return nil
}

// PointerContext returns the context a device pointer belongs to.
func (d *Driver) PointerContext(ptr uintptr) (Context, error) {
	if err := d.hasMemoryAPI(); err != nil {
		return nil, err
	}
	var ctx unsafe.Pointer
	if err := d.check("cuPointerGetAttribute", 0, C.stasis_ptr_ctx(&d.d, C.uint64_t(ptr), &ctx)); err != nil {
		return nil, err
	}
	return Context(ctx), nil
}

// PrimaryContext retains and returns the primary context of a GPU.
func (d *Driver) PrimaryContext(ordinal int) (Context, error) {
	if err := d.hasMemoryAPI(); err != nil {
		return nil, err
	}
	var ctx unsafe.Pointer
	err := d.check("cuDevicePrimaryCtxRetain", 0, C.stasis_primary_ctx(&d.d, C.int(ordinal), &ctx))
	return Context(ctx), err
}

// CopyToHost copies len(dst) bytes from device memory at src.
func (d *Driver) CopyToHost(ctx Context, dst []byte, src uintptr) error {
	if len(dst) == 0 {
		return nil
	}
	return d.check("cuMemcpyDtoH", 0, C.stasis_dtoh(&d.d, unsafe.Pointer(ctx), unsafe.Pointer(&dst[0]), C.uint64_t(src), C.size_t(len(dst))))
}

// HostCopy is one device-to-host copy of CopyManyToHost.
type HostCopy struct {
	Dst []byte // host memory outside Go's heap (from mmap), pinned for full speed
	Src uintptr
}

// CopyManyToHost makes the copies, all in ctx, queued on one stream and
// waited for once, so that they run back to back. On error, the index of
// the copy that failed is returned (or -1 when it is not known).
func (d *Driver) CopyManyToHost(ctx Context, copies []HostCopy) (int, error) {
	if len(copies) == 0 {
		return -1, nil
	}
	dst, src, n := make([]C.uint64_t, len(copies)), make([]C.uint64_t, len(copies)), make([]C.uint64_t, len(copies))
	for i, c := range copies {
		if len(c.Dst) > 0 {
			dst[i] = C.uint64_t(uintptr(unsafe.Pointer(&c.Dst[0])))
		}
		src[i], n[i] = C.uint64_t(c.Src), C.uint64_t(len(c.Dst))
	}
	failed := C.int(-1)
	err := d.check("cuMemcpyDtoHAsync", 0, C.stasis_dtoh_many(&d.d, unsafe.Pointer(ctx), C.int(len(copies)), &dst[0], &src[0], &n[0], &failed))
	return int(failed), err
}

// CopyToDevice copies src to device memory at dst.
func (d *Driver) CopyToDevice(ctx Context, dst uintptr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return d.check("cuMemcpyHtoD", 0, C.stasis_htod(&d.d, unsafe.Pointer(ctx), C.uint64_t(dst), unsafe.Pointer(&src[0]), C.size_t(len(src))))
}

// RegisterHost pins host memory (which must not be Go heap memory: use
// memory from mmap) so that copies to and from it run at full speed.
func (d *Driver) RegisterHost(ctx Context, b []byte) error {
	return d.check("cuMemHostRegister", 0, C.stasis_host_register(&d.d, unsafe.Pointer(ctx), unsafe.Pointer(&b[0]), C.size_t(len(b))))
}

// UnregisterHost undoes RegisterHost.
func (d *Driver) UnregisterHost(ctx Context, b []byte) error {
	return d.check("cuMemHostUnregister", 0, C.stasis_host_unregister(&d.d, unsafe.Pointer(ctx), unsafe.Pointer(&b[0])))
}

// Alloc allocates n bytes of device memory in ctx (tests and benchmarks).
func (d *Driver) Alloc(ctx Context, n int) (uintptr, error) {
	var p C.uint64_t
	err := d.check("cuMemAlloc", 0, C.stasis_alloc(&d.d, unsafe.Pointer(ctx), &p, C.size_t(n)))
	return uintptr(p), err
}

// Free releases device memory from Alloc.
func (d *Driver) Free(ctx Context, p uintptr) error {
	return d.check("cuMemFree", 0, C.stasis_free(&d.d, unsafe.Pointer(ctx), C.uint64_t(p)))
}

// The calls behind CRC32C (kernel.go).

// loadModule loads a PTX image (NUL-terminated) into ctx and finds the
// kernel name in it.
func (d *Driver) loadModule(ctx Context, image unsafe.Pointer, name string) (mod, fn unsafe.Pointer, err error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	step := C.int(0)
	r := C.stasis_module_load(&d.d, unsafe.Pointer(ctx), image, cname, &mod, &fn, &step)
	err = d.check([]string{"cuCtxSetCurrent", "cuModuleLoadData", "cuModuleGetFunction(" + name + ")"}[step], 0, r)
	return mod, fn, err
}

func (d *Driver) unloadModule(ctx Context, mod unsafe.Pointer) {
	C.stasis_module_unload(&d.d, unsafe.Pointer(ctx), mod)
}

// newStream creates a stream in ctx that is ordered after the legacy
// default stream.
func (d *Driver) newStream(ctx Context) (unsafe.Pointer, error) {
	var s unsafe.Pointer
	err := d.check("cuStreamCreate", 0, C.stasis_stream_create(&d.d, unsafe.Pointer(ctx), &s))
	return s, err
}

func (d *Driver) destroyStream(ctx Context, s unsafe.Pointer) {
	C.stasis_stream_destroy(&d.d, unsafe.Pointer(ctx), s)
}

// crcBlocks runs the CRC32C kernel fn over n bytes at src on stream, its
// results in dev, copies them to host (4 bytes a block) and waits.
func (d *Driver) crcBlocks(ctx Context, fn, stream unsafe.Pointer, src uintptr, n int64, dev uintptr, host unsafe.Pointer, kernel string) error {
	step := C.int(0)
	r := C.stasis_crc_blocks(&d.d, unsafe.Pointer(ctx), fn, stream, C.uint64_t(src), C.uint64_t(n), C.uint64_t(dev), (*C.uint32_t)(host), &step)
	return d.check([]string{"cuCtxSetCurrent", "cuLaunchKernel(" + kernel + ")", "cuMemcpyDtoHAsync", "cuStreamSynchronize"}[step], 0, r)
}
