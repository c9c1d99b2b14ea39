/*
 * What the stand-ins for NVIDIA's libraries (libcuda.c, libcufile.c) share:
 * their directory ($STASIS_FAKE_CUDA_DIR, default /tmp), the call log
 * there (calls.log: "CALL PID RESULT" a line), switch files, and small
 * numbers read from files there.
 */
#ifndef STASIS_STANDIN_H
#define STASIS_STANDIN_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define STANDIN_UNUSED __attribute__((unused))

static STANDIN_UNUSED const char *dir(void) {
	const char *d = getenv("STASIS_FAKE_CUDA_DIR");
	return d ? d : "/tmp";
}

static STANDIN_UNUSED void logcall(const char *call, int pid, int result) {
	char path[4096];
	snprintf(path, sizeof path, "%s/calls.log", dir());
	FILE *f = fopen(path, "a");
	if (f) {
		fprintf(f, "%s %d %d\n", call, pid, result);
		fclose(f);
	}
}

/* exists reports whether the file name exists in the directory: a switch. */
static STANDIN_UNUSED int exists(const char *name) {
	char path[4096];
	snprintf(path, sizeof path, "%s/%s", dir(), name);
	return access(path, F_OK) == 0;
}

/* readint reads the number in the file name, or dflt. */
static STANDIN_UNUSED int readint(const char *name, int dflt) {
	char path[4096];
	snprintf(path, sizeof path, "%s/%s", dir(), name);
	FILE *f = fopen(path, "r");
	int v = dflt;
	if (f) {
		if (fscanf(f, "%d", &v) != 1) v = dflt;
		fclose(f);
	}
	return v;
}

#endif
