package cuda

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
// nvmlProcessInfo_t as the v3 call fills it.
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId; unsigned int computeInstanceId; } stasisNvmlProcess;

typedef nvmlReturn_t (*fnNvmlInit)(void);
typedef nvmlReturn_t (*fnNvmlCount)(unsigned int *);
typedef nvmlReturn_t (*fnNvmlHandle)(unsigned int, nvmlDevice_t *);
typedef nvmlReturn_t (*fnNvmlUUID)(nvmlDevice_t, char *, unsigned int);
typedef nvmlReturn_t (*fnNvmlProcs)(nvmlDevice_t, unsigned int *, stasisNvmlProcess *);

typedef struct {
	void *handle;
	fnNvmlInit init;
	fnNvmlCount count;
	fnNvmlHandle byIndex;
	fnNvmlUUID uuid;
	fnNvmlProcs procs;
} stasisNvml;

static const char *stasis_nvml_open(const char *path, stasisNvml *n) {
	memset(n, 0, sizeof(*n));
	n->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!n->handle) return dlerror();
	n->init = (fnNvmlInit)dlsym(n->handle, "nvmlInit_v2");
	n->count = (fnNvmlCount)dlsym(n->handle, "nvmlDeviceGetCount_v2");
	n->byIndex = (fnNvmlHandle)dlsym(n->handle, "nvmlDeviceGetHandleByIndex_v2");
	n->uuid = (fnNvmlUUID)dlsym(n->handle, "nvmlDeviceGetUUID");
	n->procs = (fnNvmlProcs)dlsym(n->handle, "nvmlDeviceGetComputeRunningProcesses_v3");
	if (!n->init || !n->count || !n->byIndex || !n->uuid || !n->procs) return "it lacks the calls stasis needs (nvmlDeviceGetComputeRunningProcesses_v3 and others)";
	return NULL;
}
static nvmlReturn_t stasis_nvml_init(stasisNvml *n) { return n->init(); }
static nvmlReturn_t stasis_nvml_count(stasisNvml *n, unsigned int *c) { return n->count(c); }
static nvmlReturn_t stasis_nvml_device(stasisNvml *n, unsigned int i, char *uuid, unsigned int len, nvmlDevice_t *dev) {
	nvmlReturn_t r = n->byIndex(i, dev);
	return r ? r : n->uuid(*dev, uuid, len);
}
static nvmlReturn_t stasis_nvml_procs(stasisNvml *n, nvmlDevice_t dev, unsigned int *count, stasisNvmlProcess *p) { return n->procs(dev, count, p); }
*/
import "C"

import (
	"fmt"
	"os"
	"slices"
	"sync"
	"unsafe"
)

// NVML return codes stasis reacts to.
const nvmlInsufficientSize = 7

// NVML is an opened libnvidia-ml (the library nvidia-smi uses), for what
// the CUDA driver API does not say: which GPUs a process uses.
type NVML struct {
	n    C.stasisNvml
	Path string
}

var (
	nvmlOnce   sync.Once
	nvmlLoaded *NVML
	nvmlErr    error
)

// NVMLPath is the library LoadNVML opens: $STASIS_LIBNVML, else
// libnvidia-ml.so.1 as the dynamic loader finds it.
func NVMLPath() string {
	if p := os.Getenv("STASIS_LIBNVML"); p != "" {
		return p
	}
	return "libnvidia-ml.so.1"
}

// LoadNVML opens and initialises NVML once per process.
func LoadNVML() (*NVML, error) {
	nvmlOnce.Do(func() {
		n := &NVML{Path: NVMLPath()}
		path := C.CString(n.Path)
		defer C.free(unsafe.Pointer(path))
		if msg := C.stasis_nvml_open(path, &n.n); msg != nil {
			nvmlErr = fmt.Errorf("%w: NVML (%s): %s", ErrUnavailable, n.Path, C.GoString(msg))
			return
		}
		if r := C.stasis_nvml_init(&n.n); r != 0 {
			nvmlErr = fmt.Errorf("%w: nvmlInit_v2: NVML error %d", ErrUnavailable, int(r))
			return
		}
		nvmlLoaded = n
	})
	return nvmlLoaded, nvmlErr
}

// ProcessGPUs returns the UUIDs of the GPUs on which pid has a CUDA
// context, in NVML's order.
func (n *NVML) ProcessGPUs(pid int) ([]string, error) {
	var count C.uint
	if r := C.stasis_nvml_count(&n.n, &count); r != 0 {
		return nil, fmt.Errorf("nvmlDeviceGetCount_v2: NVML error %d", int(r))
	}
	var uuids []string
	for i := C.uint(0); i < count; i++ {
		var name [96]C.char
		var dev C.nvmlDevice_t
		if r := C.stasis_nvml_device(&n.n, i, &name[0], C.uint(len(name)), &dev); r != 0 {
			return nil, fmt.Errorf("NVML device %d: NVML error %d", int(i), int(r))
		}
		pids, err := n.computePIDs(dev)
		if err != nil {
			return nil, fmt.Errorf("NVML device %d: %w", int(i), err)
		}
		if slices.Contains(pids, pid) {
			uuids = append(uuids, C.GoString(&name[0]))
		}
	}
	return uuids, nil
}

// computePIDs lists the processes with a compute context on dev.
func (n *NVML) computePIDs(dev C.nvmlDevice_t) ([]int, error) {
	size := C.uint(64)
	for {
		buf := make([]C.stasisNvmlProcess, size)
		count := size
		r := C.stasis_nvml_procs(&n.n, dev, &count, &buf[0])
		if r == nvmlInsufficientSize && count > size {
			size = count + 16
			continue
		}
		if r != 0 {
			return nil, fmt.Errorf("nvmlDeviceGetComputeRunningProcesses_v3: NVML error %d", int(r))
		}
		pids := make([]int, count)
		for i := range pids {
			pids[i] = int(buf[i].pid)
		}
		return pids, nil
	}
}
