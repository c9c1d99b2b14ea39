/*
 * A stand-in for the NVIDIA driver's libcuda.so.1, for testing stasis's GPU
 * state machine on machines without a GPU. It implements the calls stasis
 * makes with the documented state transitions (running -> locked ->
 * checkpointed -> locked -> running), keeps each process's state in
 * $STASIS_FAKE_CUDA_DIR/<pid>.state so that several stasis runs see the
 * same states, logs every call to $STASIS_FAKE_CUDA_DIR/calls.log, and
 * fails a call when $STASIS_FAKE_CUDA_DIR/fail-<call> exists (lock fails
 * with CUDA_ERROR_NOT_READY, as a lock timeout does). A call sleeps 3 s
 * before it acts when .../slow-<call> exists (slow-restore: with or
 * without GPU pairs), the time it takes a real
 * driver to move gigabytes. Driver version and
 * GPU name come from $STASIS_FAKE_CUDA_DIR/version and .../gpu-name when
 * present. Device memory is host memory here: a "device pointer" is a host
 * address, and the copies are memcpy. .../fail-dtoh holding N makes the
 * N-th device-to-host copy fail; pinning and unpinning, stream creation and
 * destruction are counted in calls.log.
 *
 * The one kernel stasis launches, stasis_crc32c_blocks of
 * cuda/kernels/crc32c.cu, runs here on the host: cuModuleLoadData takes an
 * image that names it, cuModuleGetFunction finds it (and nothing else),
 * and cuLaunchKernel writes each 4096-byte block's CRC32C, as the kernel
 * does; .../fail-launch makes launches fail. Loads, unloads and launches
 * are counted in calls.log.
 *
 * Built with -DNO_CHECKPOINT_API it lacks the checkpoint API, like a driver
 * before 570: then cuda-checkpoint.c, the stand-in for NVIDIA's tool, makes
 * the same calls.
 *
 * A process that calls cuInit is initialized (.../<pid>.init); one forked
 * from it afterwards (.../<pid>.forked, written by the fork handler cuInit
 * registers, as libcuda registers its own) is not, until it calls cuInit
 * itself, and cuCheckpointProcessGetState answers CUDA_ERROR_NOT_INITIALIZED
 * for it, as the driver does for a DataLoader worker forked from a CUDA
 * process.
 *
 * GPUs: $STASIS_FAKE_CUDA_DIR/devices holds how many (default 1); GPU i has
 * the UUID whose bytes are 0x10+i, 0x11+i, ... A process runs on the GPU
 * in .../<pid>.gpu (default 0). A restore with GPU pairs logs them ("restore
 * PID 0 0>1 1>0", GPUs by index), moves the process to the GPU its pair
 * names, and fails when .../fail-restore-pairs exists (when it holds a PID,
 * only for that process). The same library
 * stands in for NVML (libnvidia-ml.so.1, loaded through STASIS_LIBNVML): a
 * GPU's compute processes are the PIDs whose .gpu file names it. Built by
 * the tests with gcc -shared -fPIC.
 */
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "standin.h"

enum { OK = 0, INVALID_VALUE = 1, NOT_INITIALIZED = 3, INVALID_IMAGE = 200, NOT_FOUND = 500, NOT_READY = 600, ILLEGAL_STATE = 401, UNKNOWN = 999 };
enum { RUNNING = 0, LOCKED = 1, CHECKPOINTED = 2 };

static int failing(const char *call) {
	char name[256];
	snprintf(name, sizeof name, "fail-%s", call);
	return exists(name);
}

static int get_state(int pid) {
	char name[64];
	snprintf(name, sizeof name, "%d.state", pid);
	return readint(name, RUNNING);
}

/* writeint replaces the file at once (a temporary file renamed over it),
 * as a driver's state changes: a process killed mid-call leaves the old
 * value or the new one, never an empty file. */
static void writeint(const char *name, int v) {
	char path[4096], tmp[4200];
	snprintf(path, sizeof path, "%s/%s", dir(), name);
	snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
	FILE *f = fopen(tmp, "w");
	if (f) {
		fprintf(f, "%d\n", v);
		fclose(f);
		rename(tmp, path);
	}
}

static void put_state(int pid, int s) {
	char name[64];
	snprintf(name, sizeof name, "%d.state", pid);
	writeint(name, s);
}

__attribute__((unused)) static int transition(const char *call, int pid, int from, int to, int failure) {
	int r = OK;
	char slow[4096];
	snprintf(slow, sizeof slow, "%s/slow-%s", dir(), call);
	if (access(slow, F_OK) == 0) sleep(3);
	if (failing(call)) r = failure;
	else if (get_state(pid) != from) r = ILLEGAL_STATE;
	else put_state(pid, to);
	logcall(call, pid, r);
	return r;
}

static int devices(void) { return readint("devices", 1); }

static int gpu_of(int pid) {
	char name[64];
	snprintf(name, sizeof name, "%d.gpu", pid);
	return readint(name, 0);
}

static void put_gpu(int pid, int gpu) {
	char name[64];
	snprintf(name, sizeof name, "%d.gpu", pid);
	writeint(name, gpu);
}

typedef struct { unsigned char old_uuid[16], new_uuid[16]; } gpu_pair;
typedef struct { gpu_pair *pairs; unsigned int count; } restore_args;

/* A restore onto other GPUs: every pair must name GPUs that exist, and the
 * pairs must cover the GPU the process ran on. */
__attribute__((unused)) static int restore_pairs(int pid, const restore_args *a) {
	char slow[4096];
	snprintf(slow, sizeof slow, "%s/slow-restore", dir());
	if (access(slow, F_OK) == 0) sleep(3);
	char log[4096];
	int n = snprintf(log, sizeof log, "restore");
	int to = -1, r = OK;
	for (unsigned int i = 0; i < a->count; i++) {
		int o = a->pairs[i].old_uuid[0] - 0x10, w = a->pairs[i].new_uuid[0] - 0x10;
		n += snprintf(log + n, sizeof log - n, " %d>%d", o, w);
		if (o < 0 || o >= devices() || w < 0 || w >= devices()) r = INVALID_VALUE;
		if (o == gpu_of(pid)) to = w;
	}
	int only = readint("fail-restore-pairs", 0);
	if (to < 0) r = INVALID_VALUE;
	else if (failing("restore-pairs") && (only == 0 || only == pid)) r = UNKNOWN;
	else if (get_state(pid) != CHECKPOINTED) r = ILLEGAL_STATE;
	if (r == OK) {
		put_state(pid, LOCKED);
		put_gpu(pid, to);
	}
	char path[4096];
	snprintf(path, sizeof path, "%s/calls.log", dir());
	FILE *f = fopen(path, "a");
	if (f) {
		/* "restore PID RESULT PAIRS", as the other calls log "call PID RESULT". */
		fprintf(f, "restore %d %d%s\n", pid, r, log + strlen("restore"));
		fclose(f);
	}
	return r;
}

/* mark writes the empty file <this process's PID>.<what>. */
static void mark(const char *what) {
	char path[4096];
	snprintf(path, sizeof path, "%s/%d.%s", dir(), (int)getpid(), what);
	FILE *f = fopen(path, "w");
	if (f) fclose(f);
}
static void forked_child(void) { mark("forked"); }
int cuInit(unsigned int flags) {
	static int registered;
	(void)flags;
	mark("init");
	if (!registered++) pthread_atfork(NULL, NULL, forked_child);
	return OK;
}
/* initialized is false for a process forked from an initialized one that
 * has not called cuInit itself. */
__attribute__((unused)) static int initialized(int pid) {
	char forked[64], init[64];
	snprintf(forked, sizeof forked, "%d.forked", pid);
	snprintf(init, sizeof init, "%d.init", pid);
	return !exists(forked) || exists(init);
}
int cuDriverGetVersion(int *v) { *v = readint("version", 13000); return OK; }
int cuDeviceGetCount(int *n) { *n = devices(); return OK; }
int cuDeviceGet(int *dev, int ordinal) { *dev = ordinal; return ordinal >= 0 && ordinal < devices() ? OK : INVALID_VALUE; }
int cuDeviceGetName(char *name, int len, int dev) {
	(void)dev;
	char path[4096];
	snprintf(path, sizeof path, "%s/gpu-name", dir());
	FILE *f = fopen(path, "r");
	if (f) {
		if (!fgets(name, len, f)) snprintf(name, len, "Fake GPU");
		name[strcspn(name, "\n")] = 0;
		fclose(f);
	} else {
		snprintf(name, len, "Fake GPU");
	}
	return OK;
}
int cuDeviceGetUuid_v2(unsigned char *uuid, int dev) {
	for (int i = 0; i < 16; i++) uuid[i] = (unsigned char)(0x10 + i + dev);
	return OK;
}
/* Each error's name, and its string (which cuda-checkpoint prints); the
 * last is INVALID_VALUE's, and any other's. */
static const struct { int code; const char *name, *string; } errors[] = {
	{NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
	{NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
	{ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
	{UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
	{INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
	{NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
	{INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
};
static int error_index(int r) {
	int i = 0;
	while (errors[i].code != r && errors[i].code != INVALID_VALUE) i++;
	return i;
}
int cuGetErrorName(int r, const char **s) { *s = errors[error_index(r)].name; return OK; }
int cuGetErrorString(int r, const char **s) { *s = errors[error_index(r)].string; return OK; }
/* Left out with -DNO_CHECKPOINT_API (see above). */
#ifndef NO_CHECKPOINT_API
int cuCheckpointProcessGetState(int pid, int *state) {
	if (!initialized(pid)) return NOT_INITIALIZED;
	*state = get_state(pid);
	return OK;
}
int cuCheckpointProcessLock(int pid, void *args) { (void)args; return transition("lock", pid, RUNNING, LOCKED, NOT_READY); }
int cuCheckpointProcessCheckpoint(int pid, void *args) { (void)args; return transition("checkpoint", pid, LOCKED, CHECKPOINTED, UNKNOWN); }
int cuCheckpointProcessRestore(int pid, void *args) {
	const restore_args *a = args;
	if (a && a->count > 0) return restore_pairs(pid, a);
	return transition("restore", pid, CHECKPOINTED, LOCKED, UNKNOWN);
}
int cuCheckpointProcessUnlock(int pid, void *args) { (void)args; return transition("unlock", pid, LOCKED, RUNNING, UNKNOWN); }
int cuCheckpointProcessGetRestoreThreadId(int pid, int *tid) { *tid = pid; return OK; }
#endif

/* Handles are addresses of objects of the library's own: stasis keeps
 * them in pointer-typed Go values, which must not hold small numbers. */
static char the_ctx, the_stream, the_module, the_kernel;

int cuPointerGetAttribute(void *data, int attribute, unsigned long long ptr) {
	(void)attribute; (void)ptr;
	*(void **)data = &the_ctx;
	return OK;
}
int cuCtxSetCurrent(void *ctx) { (void)ctx; return OK; }
int cuDevicePrimaryCtxRetain(void **ctx, int dev) { (void)dev; *ctx = &the_ctx; return OK; }
int cuMemcpyDtoH_v2(void *dst, unsigned long long src, size_t n) {
	static int calls;
	int failAt = readint("fail-dtoh", 0);
	if (failAt && ++calls >= failAt) return UNKNOWN;
	memcpy(dst, (void *)src, n);
	return OK;
}
/* Streams: copies queued on a stream are made at once; a failing copy
 * counts with the synchronous ones for fail-dtoh. */
int cuStreamCreate(void **stream, unsigned int flags) { (void)flags; *stream = &the_stream; logcall("stream-create", 0, OK); return OK; }
int cuStreamDestroy_v2(void *stream) { (void)stream; logcall("stream-destroy", 0, OK); return OK; }
int cuStreamSynchronize(void *stream) { (void)stream; return OK; }
int cuMemcpyDtoHAsync_v2(void *dst, unsigned long long src, size_t n, void *stream) { (void)stream; return cuMemcpyDtoH_v2(dst, src, n); }
int cuMemcpyHtoD_v2(unsigned long long dst, const void *src, size_t n) { memcpy((void *)dst, src, n); return OK; }
int cuMemHostRegister_v2(void *p, size_t n, unsigned int flags) { (void)p; (void)n; (void)flags; logcall("register", 0, OK); return OK; }
int cuMemHostUnregister(void *p) { (void)p; logcall("unregister", 0, OK); return OK; }
int cuMemAlloc_v2(unsigned long long *p, size_t n) { *p = (unsigned long long)malloc(n); return *p ? OK : UNKNOWN; }
int cuMemFree_v2(unsigned long long p) { free((void *)p); return OK; }

/* The CRC32C kernel, on the host. */
static const char crc_kernel[] = "stasis_crc32c_blocks";
int cuModuleLoadData(void **mod, const void *image) {
	int r = strstr((const char *)image, crc_kernel) ? OK : INVALID_IMAGE;
	if (r == OK) *mod = &the_module;
	logcall("module-load", 0, r);
	return r;
}
int cuModuleUnload(void *mod) { (void)mod; logcall("module-unload", 0, OK); return OK; }
int cuModuleGetFunction(void **fn, void *mod, const char *name) {
	(void)mod;
	if (strcmp(name, crc_kernel)) return NOT_FOUND;
	*fn = &the_kernel;
	return OK;
}
static unsigned int crc32c(const unsigned char *p, unsigned long long n) {
	unsigned int c = 0xffffffffu;
	for (unsigned long long i = 0; i < n; i++) {
		c ^= p[i];
		for (int bit = 0; bit < 8; bit++) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1u)));
	}
	return ~c;
}
/* The kernel's parameters: the source, its length, the block checksums. */
int cuLaunchKernel(void *fn, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
                   unsigned int bz, unsigned int shared, void *stream, void **params, void **extra) {
	(void)gy; (void)gz; (void)by; (void)bz; (void)shared; (void)stream; (void)extra;
	if (fn != &the_kernel || failing("launch")) {
		logcall("launch", 0, UNKNOWN);
		return UNKNOWN;
	}
	const unsigned char *src = *(const unsigned char **)params[0];
	unsigned long long n = *(unsigned long long *)params[1];
	unsigned int *out = *(unsigned int **)params[2];
	for (unsigned long long b = 0; b < (unsigned long long)gx * bx && b * 4096 < n; b++)
		out[b] = crc32c(src + b * 4096, n - b * 4096 < 4096 ? n - b * 4096 : 4096);
	logcall("launch", 0, OK);
	return OK;
}

/* NVML */
int nvmlInit_v2(void) { return OK; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = devices(); return OK; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **dev) {
	if ((int)i >= devices()) return INVALID_VALUE;
	*dev = (void *)(unsigned long)(i + 1);
	return OK;
}
int nvmlDeviceGetUUID(void *dev, char *uuid, unsigned int len) {
	unsigned char b[16];
	int d = (int)(unsigned long)dev - 1;
	cuDeviceGetUuid_v2(b, d);
	snprintf(uuid, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
		b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
	return OK;
}
typedef struct { unsigned int pid; unsigned long long used; unsigned int gi, ci; } nvml_process;
int nvmlDeviceGetComputeRunningProcesses_v3(void *dev, unsigned int *count, nvml_process *out) {
	int d = (int)(unsigned long)dev - 1;
	unsigned int n = 0;
	DIR *dp = opendir(dir());
	struct dirent *e;
	while (dp && (e = readdir(dp))) {
		int pid;
		char rest[8];
		if (sscanf(e->d_name, "%d.%7s", &pid, rest) != 2 || strcmp(rest, "gpu") || gpu_of(pid) != d) continue;
		if (n < *count) {
			out[n].pid = pid;
			out[n].used = 1 << 20;
			out[n].gi = out[n].ci = 0;
		}
		n++;
	}
	if (dp) closedir(dp);
	int r = n > *count ? 7 : OK; /* NVML_ERROR_INSUFFICIENT_SIZE */
	*count = n;
	return r;
}
