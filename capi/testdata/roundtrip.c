/*
 * roundtrip.c: a small program against libstasis.so (capi_test.go builds
 * and runs it). It saves host buffers blocking and asynchronously, changes
 * them once the asynchronous commit has returned, loads both checkpoints
 * back and compares, and checks the error codes of bad calls. Exit status
 * 0 when every check passed; each failed check prints one line.
 *
 *   roundtrip STORE_DIR
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stasis.h"

static int failures;

#define CHECK(cond, ...)                          \
	do {                                          \
		if (!(cond)) {                            \
			fprintf(stderr, "FAIL line %d: ", __LINE__); \
			fprintf(stderr, __VA_ARGS__);         \
			fputc('\n', stderr);                  \
			failures++;                           \
		}                                         \
	} while (0)

/* id_of copies the "id" field of a record's JSON into id (37 bytes). */
static void id_of(const char *json, char id[37]) {
	const char *p = strstr(json, "\"id\":\"");
	id[0] = 0;
	if (p) {
		memcpy(id, p + 6, 36);
		id[36] = 0;
	}
}

int main(int argc, char **argv) {
	if (argc != 2) {
		fprintf(stderr, "usage: roundtrip STORE_DIR\n");
		return 2;
	}
	CHECK(stasis_abi_version() == STASIS_ABI_VERSION, "ABI version %d, header %d", stasis_abi_version(), STASIS_ABI_VERSION);

	stasis_error err;
	stasis_store store = 0;
	int rc = stasis_open(argv[1], "auto", &store, &err);
	CHECK(rc == STASIS_OK && store != 0, "open: %d %s", rc, err.message);

	enum { N = 3 << 20 };
	float *weights = malloc(N * sizeof(float));
	int64_t *step = malloc(sizeof(int64_t));
	for (int i = 0; i < N; i++) weights[i] = (float)i * 0.5f;
	*step = 41;
	int64_t wshape[2] = {3 << 10, 1 << 10};
	stasis_tensor ts[2] = {
		{"model/w", "fp32", 2, wshape, weights, 0, (uint64_t)N * sizeof(float)},
		{"step", "int64", 0, NULL, step, 0, sizeof(int64_t)},
	};

	rc = stasis_prepare(store, ts, 2, &err);
	CHECK(rc == STASIS_OK, "prepare: %s", err.message);

	/* blocking */
	stasis_checkpoint ck = 0;
	rc = stasis_begin(store, "ctest", 1, &ck, &err);
	CHECK(rc == STASIS_OK, "begin: %s", err.message);
	rc = stasis_add(ck, ts, 2, &err);
	CHECK(rc == STASIS_OK, "add: %s", err.message);
	rc = stasis_set_state(ck, "{\"lr\":0.001}", &err);
	CHECK(rc == STASIS_OK, "set_state: %s", err.message);
	char *record = NULL;
	rc = stasis_commit(ck, 0, NULL, &record, &err);
	CHECK(rc == STASIS_OK && record != NULL, "commit: %s", err.message);
	char first[37] = "";
	if (record) id_of(record, first);
	stasis_free(record);

	/* asynchronous: change the buffers once the commit returns */
	rc = stasis_begin(store, "ctest", 2, &ck, &err);
	CHECK(rc == STASIS_OK, "begin: %s", err.message);
	*step = 42;
	rc = stasis_add(ck, ts, 2, &err);
	CHECK(rc == STASIS_OK, "add: %s", err.message);
	stasis_save save = 0;
	rc = stasis_commit(ck, STASIS_ASYNC, &save, NULL, &err);
	CHECK(rc == STASIS_OK && save != 0, "async commit: %s", err.message);
	for (int i = 0; i < N; i++) weights[i] = -1.0f;
	*step = 43;
	double waited = -1, snapshot = -1;
	rc = stasis_save_times(save, &waited, &snapshot, &err);
	CHECK(rc == STASIS_OK && waited >= 0 && snapshot > 0, "save times: %s %g %g", err.message, waited, snapshot);
	rc = stasis_save_wait(save, &record, &err);
	CHECK(rc == STASIS_OK, "wait: %s", err.message);
	CHECK(stasis_save_done(save) == 1, "done after wait");
	stasis_save_release(save);
	CHECK(stasis_save_done(save) == -1, "released handle still known");
	char second[37] = "";
	if (record) id_of(record, second);
	stasis_free(record);

	/* find and list */
	rc = stasis_find(store, "ctest", -1, &record, &err);
	CHECK(rc == STASIS_OK && record && strstr(record, second), "latest is not the async save: %s", err.message);
	stasis_free(record);
	rc = stasis_find(store, "ctest", 1, &record, &err);
	CHECK(rc == STASIS_OK && record && strstr(record, first), "step 1: %s", err.message);
	stasis_free(record);
	rc = stasis_list(store, "ctest", &record, &err);
	CHECK(rc == STASIS_OK && record && strstr(record, first) && strstr(record, second), "list: %s", err.message);
	stasis_free(record);
	rc = stasis_describe(store, first, &record, &err);
	CHECK(rc == STASIS_OK && record && strstr(record, "\"model/w\"") && strstr(record, "\"lr\""), "describe: %s", record ? record : err.message);
	stasis_free(record);

	/* load both back */
	float *got = calloc(N, sizeof(float));
	int64_t got_step = 0;
	stasis_tensor into[2] = {
		{"model/w", "fp32", 2, wshape, got, 0, (uint64_t)N * sizeof(float)},
		{"step", "int64", 0, NULL, &got_step, 0, sizeof(int64_t)},
	};
	rc = stasis_load(store, second, into, 2, &err);
	CHECK(rc == STASIS_OK, "load: %s", err.message);
	int same = 1;
	for (int i = 0; i < N; i++) same &= got[i] == (float)i * 0.5f;
	CHECK(same, "the async checkpoint does not hold the weights as they were at commit");
	CHECK(got_step == 42, "async step %lld, want 42", (long long)got_step);
	rc = stasis_load(store, first, into, 2, &err);
	CHECK(rc == STASIS_OK && got_step == 41, "load step 1: %s, step %lld", err.message, (long long)got_step);

	/* bad calls */
	into[0].nbytes = 8;
	rc = stasis_load(store, first, into, 2, &err);
	CHECK(rc == STASIS_EMISMATCH && err.code == rc && strstr(err.message, "model/w"), "wrong size: %d %s", rc, err.message);
	into[0].nbytes = (uint64_t)N * sizeof(float);
	rc = stasis_find(store, "nosuchjob", -1, &record, &err);
	CHECK(rc == STASIS_ENOTFOUND, "unknown job: %d %s", rc, err.message);
	rc = stasis_begin(store, "ctest", 3, &ck, &err);
	stasis_tensor bad = {"../escape", "fp32", 0, NULL, step, 0, 4};
	rc = stasis_add(ck, &bad, 1, &err);
	CHECK(rc == STASIS_EMISMATCH, "a name with ..: %d %s", rc, err.message);
	stasis_tensor unknown = {"x", "fp12", 0, NULL, step, 0, 2};
	rc = stasis_add(ck, &unknown, 1, &err);
	CHECK(rc == STASIS_EMISMATCH && strstr(err.message, "fp12"), "unknown dtype: %d %s", rc, err.message);
	stasis_discard(ck);
	rc = stasis_add(ck, ts, 2, &err);
	CHECK(rc == STASIS_EINVAL, "a discarded checkpoint: %d %s", rc, err.message);
	rc = stasis_begin(store, " spaced", 3, &ck, NULL);
	CHECK(rc == STASIS_EINVAL, "a bad job name: %d", rc);
	rc = stasis_open(argv[1], "lz77", &ck, &err);
	CHECK(rc == STASIS_EINVAL, "an unknown codec: %d %s", rc, err.message);

	stasis_tensor huge = {"h", "uint8", 0, NULL, step, 0, (uint64_t)1 << 63};
	rc = stasis_begin(store, "ctest", 4, &ck, &err);
	rc = stasis_add(ck, &huge, 1, &err);
	CHECK(rc == STASIS_EINVAL, "nbytes out of range: %d %s", rc, err.message);
	rc = stasis_set_compress(ck, "none", &err);
	CHECK(rc == STASIS_OK, "set_compress: %s", err.message);
	rc = stasis_find(store, "", -1, &record, &err);
	CHECK(rc == STASIS_EINVAL, "find with no job: %d %s", rc, err.message);

	rc = stasis_close(store, &err);
	CHECK(rc == STASIS_OK, "close: %s", err.message);
	rc = stasis_add(ck, ts, 2, &err);
	CHECK(rc == STASIS_OK, "add after close: %s", err.message);
	rc = stasis_commit(ck, STASIS_ASYNC, &save, NULL, &err);
	CHECK(rc == STASIS_EINVAL, "commit after close: %d %s", rc, err.message);
	rc = stasis_close(store, &err);
	CHECK(rc == STASIS_EINVAL, "closed twice: %d", rc);
	free(weights);
	free(step);
	free(got);
	if (failures == 0) printf("roundtrip: all checks passed\n");
	return failures ? 1 : 0;
}
