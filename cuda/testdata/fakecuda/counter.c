/*
 * counter LIB OUT: maps LIB (the stand-in libcuda) as a CUDA program maps
 * the real one, then appends 1, 2, 3, ... to OUT every 20 ms.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv) {
	if (argc != 3 || !dlopen(argv[1], RTLD_NOW)) return 1;
	for (long i = 1;; i++) {
		FILE *f = fopen(argv[2], "a");
		if (f) {
			fprintf(f, "%ld\n", i);
			fclose(f);
		}
		usleep(20000);
	}
}
