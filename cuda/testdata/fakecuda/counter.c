/*
 * counter LIB OUT [WORKERS]: maps LIB (the stand-in libcuda) and
 * initializes it (cuInit), as a CUDA program does, then appends 1, 2, 3,
 * ... to OUT every 20 ms. With WORKERS, it first forks that many workers,
 * which inherit the library but never initialize it (as a PyTorch
 * DataLoader's forked workers do), each appending to OUT.1, OUT.2, ...
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void count(const char *out) {
	for (long i = 1;; i++) {
		FILE *f = fopen(out, "a");
		if (f) {
			fprintf(f, "%ld\n", i);
			fclose(f);
		}
		usleep(20000);
	}
}

int main(int argc, char **argv) {
	void *lib;
	if (argc < 3 || argc > 4 || !(lib = dlopen(argv[1], RTLD_NOW))) return 1;
	int (*init)(unsigned int) = (int (*)(unsigned int))dlsym(lib, "cuInit");
	if (!init || init(0) != 0) return 1;
	int workers = argc == 4 ? atoi(argv[3]) : 0;
	for (int w = 1; w <= workers; w++) {
		if (fork() == 0) {
			char out[4096];
			snprintf(out, sizeof out, "%s.%d", argv[2], w);
			count(out);
		}
	}
	count(argv[2]);
}
