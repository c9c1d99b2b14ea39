/*
 * A stand-in for NVIDIA's cuda-checkpoint tool, for testing stasis's
 * fallback on drivers whose libcuda lacks the checkpoint API. It takes the
 * tool's command line (as its --help documents it) and makes the checkpoint
 * calls of the stand-in driver, libcuda.c, compiled in: the per-process
 * states, calls.log and the fail-* and slow-* switches are the stand-in
 * driver's. Each run appends its arguments to $STASIS_FAKE_CUDA_DIR/tool.log.
 * With $STASIS_FAKE_CUDA_DIR/tool-no-device-map present it is a tool from
 * before CUDA 13.0, without --device-map. A failure prints
 * `Could not ACTION on process ID PID: "ERROR STRING"` on stderr and exits 1.
 * Built by the tests with gcc -o cuda-checkpoint cuda-checkpoint.c.
 */
#include "libcuda.c"

static int no_device_map(void) {
	char path[4096];
	snprintf(path, sizeof path, "%s/tool-no-device-map", dir());
	return access(path, F_OK) == 0;
}

static void help(void) {
	printf("cuda-checkpoint (stasis test stand-in)\n\n"
	       "--get-state --pid <pid>\n\tprint the process's checkpoint state\n"
	       "--action lock|checkpoint|restore|unlock --pid <pid> [--timeout <ms>]%s\n\tmake one checkpoint step\n"
	       "--toggle --pid <pid>\n\tcheckpoint a running process, or restore and unlock a checkpointed one\n"
	       "--get-restore-tid --pid <pid>\n\tprint the process's restore thread ID\n",
	       no_device_map() ? "" : " [--device-map <old>=<new>,...]");
	if (!no_device_map()) printf("--device-map|-d <uuids>\n\tfor restore: which GPU takes over which, by UUID\n");
}

static int usage(const char *why, const char *arg) {
	fprintf(stderr, "%s%s\n", why, arg ? arg : "");
	return 1;
}

static int hexval(char c) {
	if (c >= '0' && c <= '9') return c - '0';
	if (c >= 'a' && c <= 'f') return c - 'a' + 10;
	if (c >= 'A' && c <= 'F') return c - 'A' + 10;
	return -1;
}

/* GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (GPU- optional) into 16 bytes;
 * end is where the UUID stops. */
static int parse_uuid(const char *s, const char **end, unsigned char out[16]) {
	if (strncmp(s, "GPU-", 4) == 0) s += 4;
	int n = 0;
	while (n < 32 && *s) {
		if (*s == '-') { s++; continue; }
		int hi = hexval(*s);
		if (hi < 0) break;
		if (n % 2 == 0) out[n / 2] = (unsigned char)(hi << 4);
		else out[n / 2] |= (unsigned char)hi;
		n++, s++;
	}
	*end = s;
	return n == 32 ? 0 : -1;
}

/* OLD=NEW,... into pairs; returns how many, or -1. */
static int parse_map(const char *s, gpu_pair *pairs, int max) {
	int n = 0;
	while (*s && n < max) {
		const char *end;
		if (parse_uuid(s, &end, pairs[n].old_uuid) || *end != '=') return -1;
		if (parse_uuid(end + 1, &end, pairs[n].new_uuid) || (*end && *end != ',')) return -1;
		n++;
		s = *end ? end + 1 : end;
	}
	return *s ? -1 : n;
}

static int failed(const char *action, int pid, int r) {
	const char *msg;
	cuGetErrorString(r, &msg);
	fprintf(stderr, "Could not %s on process ID %d: \"%s\"\n", action, pid, msg);
	return 1;
}

int main(int argc, char **argv) {
	char path[4096];
	snprintf(path, sizeof path, "%s/tool.log", dir());
	FILE *log = fopen(path, "a");
	for (int i = 1; log && i < argc; i++) fprintf(log, "%s%s", argv[i], i + 1 < argc ? " " : "\n");
	if (log) fclose(log);

	const char *op = NULL, *action = NULL, *map = NULL;
	int pid = 0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		int more = i + 1 < argc;
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			help();
			return 0;
		} else if (!strcmp(a, "--get-state") || !strcmp(a, "--toggle") || !strcmp(a, "--get-restore-tid")) {
			op = a;
		} else if (!strcmp(a, "--action") && more) {
			op = a;
			action = argv[++i];
		} else if ((!strcmp(a, "--pid") || !strcmp(a, "-p")) && more) {
			pid = atoi(argv[++i]);
		} else if ((!strcmp(a, "--timeout") || !strcmp(a, "-t")) && more) {
			i++; /* the stand-in's lock does not wait: fail-lock makes it time out */
		} else if ((!strcmp(a, "--device-map") || !strcmp(a, "-d")) && more && !no_device_map()) {
			map = argv[++i];
		} else {
			return usage("Unknown or incomplete option: ", a);
		}
	}
	if (!op || pid <= 0) return usage("Give an operation and --pid; see --help", NULL);

	int r, state;
	if (!strcmp(op, "--get-state")) {
		static const char *names[] = {"running", "locked", "checkpointed", "failed"};
		if ((r = cuCheckpointProcessGetState(pid, &state))) return failed("get state", pid, r);
		printf("%s\n", state >= 0 && state < 4 ? names[state] : "unknown");
		return 0;
	}
	if (!strcmp(op, "--get-restore-tid")) {
		int tid;
		cuCheckpointProcessGetRestoreThreadId(pid, &tid);
		printf("%d\n", tid);
		return 0;
	}
	if (!strcmp(op, "--toggle")) {
		cuCheckpointProcessGetState(pid, &state);
		if (state == RUNNING) {
			if ((r = cuCheckpointProcessLock(pid, NULL))) return failed("lock", pid, r);
			if ((r = cuCheckpointProcessCheckpoint(pid, NULL))) return failed("checkpoint", pid, r);
		} else {
			if ((r = cuCheckpointProcessRestore(pid, NULL))) return failed("restore", pid, r);
			if ((r = cuCheckpointProcessUnlock(pid, NULL))) return failed("unlock", pid, r);
		}
		return 0;
	}
	if (map && strcmp(action, "restore")) return usage("--device-map is for the restore action", NULL);
	if (!strcmp(action, "lock")) r = cuCheckpointProcessLock(pid, NULL);
	else if (!strcmp(action, "checkpoint")) r = cuCheckpointProcessCheckpoint(pid, NULL);
	else if (!strcmp(action, "unlock")) r = cuCheckpointProcessUnlock(pid, NULL);
	else if (!strcmp(action, "restore") && !map) r = cuCheckpointProcessRestore(pid, NULL);
	else if (!strcmp(action, "restore")) {
		gpu_pair pairs[64];
		int n = parse_map(map, pairs, 64);
		if (n <= 0) return usage("Bad --device-map: ", map);
		restore_args args = {pairs, (unsigned int)n};
		r = cuCheckpointProcessRestore(pid, &args);
	} else {
		return usage("Unknown action: ", action);
	}
	return r ? failed(action, pid, r) : 0;
}
