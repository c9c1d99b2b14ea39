/*
 * A stand-in for NVIDIA's libcufile.so.0, for testing stasis's cuFile path
 * on machines without a GPU, beside the stand-in libcuda (libcuda.c),
 * whose "device memory" is host memory: cuFileWrite writes the bytes at
 * the "device pointer" with pwrite, cuFileRead reads them with pread,
 * through an aligned buffer, as cuFile's compat mode does through its
 * bounce buffers (the file may be open with O_DIRECT).
 *
 * It shares $STASIS_FAKE_CUDA_DIR with the stand-in libcuda: every call is
 * logged to calls.log ("cufile-write 0 0", ...), and
 *   fail-cufile-open     makes cuFileDriverOpen fail (5001),
 *   fail-cufile-handle   makes cuFileHandleRegister fail (5027),
 *   fail-cufile-buf      makes cuFileBufRegister fail (5036),
 *   fail-cufile-write N  makes cuFileWrite fail (5011) at file offsets of
 *                        N and beyond: a failure midway through a file,
 *   cufile-gds           makes cuFileDriverGetProperties report nvidia-fs
 *                        2.26 (GPUDirect Storage); without it the version
 *                        is 0 (compat mode).
 * A refused call is logged as "NAME-refused CODE": the registrations
 * logged ("cufile-handle-register", "cufile-buf-register") are those that
 * succeeded, and each must be matched by its deregistration once stasis is
 * done. Built by the tests with gcc -shared -fPIC.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "standin.h"

typedef struct { int err; int cu_err; } file_error;
typedef struct { int type; union { int fd; void *handle; } handle; const void *fs_ops; } file_descr;

static file_error result(const char *call, int err) {
	file_error e = {err, 0};
	char refused[256];
	snprintf(refused, sizeof refused, "%s-refused", call);
	logcall(err ? refused : call, 0, err);
	return e;
}

file_error cuFileDriverOpen(void) { return result("cufile-open", exists("fail-cufile-open") ? 5001 : 0); }
file_error cuFileDriverClose_v2(void) { return result("cufile-close", 0); }
file_error cuFileGetVersion(int *v) {
	*v = 1150;
	return result("cufile-version", 0);
}
file_error cuFileDriverGetProperties(void *props) {
	unsigned int *nvfs = props; /* major_version, minor_version lead the struct */
	nvfs[0] = exists("cufile-gds") ? 2 : 0;
	nvfs[1] = exists("cufile-gds") ? 26 : 0;
	return result("cufile-properties", 0);
}
const char *cufileop_status_error(int code) {
	switch (code) {
	case 5001: return "nvidia-fs driver is not loaded";
	case 5011: return "CUDA Driver API error";
	case 5027: return "udev property not found";
	case 5036: return "GPU memory pinning failed";
	}
	return "unknown cuFile error";
}

file_error cuFileHandleRegister(void **fh, file_descr *d) {
	if (exists("fail-cufile-handle")) return result("cufile-handle-register", 5027);
	if (d->type != 1) return result("cufile-handle-register", 5018);
	int *fd = malloc(sizeof(int));
	*fd = d->handle.fd;
	*fh = fd;
	return result("cufile-handle-register", 0);
}
void cuFileHandleDeregister(void *fh) {
	free(fh);
	logcall("cufile-handle-deregister", 0, 0);
}
file_error cuFileBufRegister(const void *base, size_t n, int flags) {
	(void)base; (void)n; (void)flags;
	if (exists("fail-cufile-buf")) return result("cufile-buf-register", 5036);
	return result("cufile-buf-register", 0);
}
file_error cuFileBufDeregister(const void *base) {
	(void)base;
	return result("cufile-buf-deregister", 0);
}

/* io moves n bytes between base+devOff and the file through an aligned
 * bounce buffer. */
static ssize_t io(int write, void *fh, void *base, size_t n, off_t off, off_t devOff) {
	void *bounce;
	if (posix_memalign(&bounce, 4096, (n + 4095) / 4096 * 4096)) return -1;
	char *p = (char *)base + devOff;
	ssize_t r;
	if (write) {
		memcpy(bounce, p, n);
		r = pwrite(*(int *)fh, bounce, n, off);
	} else {
		r = pread(*(int *)fh, bounce, n, off);
		if (r > 0) memcpy(p, bounce, r);
	}
	int saved = errno;
	free(bounce);
	errno = saved;
	return r;
}

ssize_t cuFileWrite(void *fh, const void *base, size_t n, off_t off, off_t devOff) {
	int failAt = readint("fail-cufile-write", -1);
	if (failAt >= 0 && off >= failAt) {
		logcall("cufile-write-refused", 0, 5011);
		return -5011;
	}
	ssize_t r = io(1, fh, (void *)base, n, off, devOff);
	logcall("cufile-write", 0, r < 0 ? errno : 0);
	return r;
}

ssize_t cuFileRead(void *fh, void *base, size_t n, off_t off, off_t devOff) {
	ssize_t r = io(0, fh, base, n, off, devOff);
	logcall("cufile-read", 0, r < 0 ? errno : 0);
	return r;
}
