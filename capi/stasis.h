/*
 * stasis.h: the C ABI of libstasis.so, the library a training loop calls to
 * save named GPU or host buffers into a stasis store and to load them back.
 * Built by `make` into bin/libstasis.so (go build -buildmode=c-shared).
 *
 * Conventions
 *   - Every call that can fail returns a stasis_code (STASIS_OK is 0) and,
 *     when err is not NULL, fills *err with the same code and a one-line
 *     message. err may be NULL.
 *   - Handles (stasis_store, stasis_checkpoint, stasis_save) are numbers
 *     owned by the library; 0 is never a valid handle. A handle of the
 *     wrong kind or already released gives STASIS_EINVAL.
 *   - Strings passed in (const char *) are read during the call only; the
 *     caller keeps ownership.
 *   - Strings passed out (char **) are JSON, allocated with malloc by the
 *     library; the caller owns them and frees them with stasis_free.
 *   - Buffers (stasis_tensor.host, .device, .shape) stay the caller's: the
 *     library reads (or, for stasis_load, writes) them during the call that
 *     takes them and, for stasis_add, until the commit returns (blocking)
 *     or until the commit has taken its snapshot (asynchronous: that is,
 *     also until stasis_commit returns). After that the caller may change
 *     or free them.
 *   - Calls may come from several threads; saves of one store run one at a
 *     time.
 */
#ifndef STASIS_H
#define STASIS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this ABI: a program built against this header checks
 * stasis_abi_version() == STASIS_ABI_VERSION. */
#define STASIS_ABI_VERSION 1

typedef enum {
	STASIS_OK = 0,
	STASIS_ERROR = 1,        /* any other failure (I/O error, bug) */
	STASIS_EINVAL = 2,       /* a bad argument: name, dtype, job, handle, JSON */
	STASIS_ENOTFOUND = 3,    /* no such checkpoint, job or step */
	STASIS_EAMBIGUOUS = 4,   /* an ID prefix matches several checkpoints */
	STASIS_ECORRUPT = 5,     /* stored data or a manifest failed its checks */
	STASIS_EBUSY = 6,        /* the catalog stayed locked by another process */
	STASIS_ENOSPACE = 7,     /* the store's file system is full; nothing was listed */
	STASIS_EUNAVAILABLE = 8, /* GPU buffers given, but no usable CUDA driver; or cuFile asked for where it cannot work */
	STASIS_EMISMATCH = 12,   /* buffers do not match their description or the checkpoint */
	STASIS_EINFLIGHT = 13,   /* STASIS_FAIL_IF_BUSY and a save is in flight */
	STASIS_EUNSAFE = 18,     /* the store is not its user's alone (owner, group/world write), or holds a link in its structure; as the CLI's exit 18 */
	STASIS_EDAMAGED = 19,    /* the catalog was damaged: it was moved aside and rebuilt from the manifests; call again */
	STASIS_EINCOMPLETE = 17, /* a job checkpoint's ranks did not all commit their part in time; nothing was listed */
	STASIS_ENEWER = 23,      /* the checkpoint is of a newer format than this stasis reads */
	STASIS_ECANCELED = 130   /* the save was cancelled */
} stasis_code;

typedef struct {
	int32_t code;
	char message[1024]; /* NUL-terminated, one line */
} stasis_error;

typedef uint64_t stasis_store;
typedef uint64_t stasis_checkpoint;
typedef uint64_t stasis_save;

/* One named buffer. Exactly one of host and device is set (both may be
 * unset when nbytes is 0). nbytes must equal the product of the shape
 * times the dtype's size. Names are relative, slash-separated, without
 * "..". dtypes: bool, int8, uint8, int16, uint16, int32, uint32, int64,
 * uint64, fp8_e4m3, fp8_e5m2, fp16, bf16, fp32, fp64, complex64,
 * complex128. */
typedef struct {
	const char *name;
	const char *dtype;
	int32_t ndim;
	const int64_t *shape; /* ndim entries; may be NULL when ndim is 0 */
	void *host;           /* host memory, or NULL */
	uint64_t device;      /* a CUDA device pointer, or 0 */
	uint64_t nbytes;
} stasis_tensor;

/* stasis_commit flags */
#define STASIS_ASYNC 1        /* return after the snapshot; write in the background */
#define STASIS_FAIL_IF_BUSY 2 /* with STASIS_ASYNC: fail instead of waiting for a save in flight */
/* A flag of stasis_set_part: rank 0's part is committed like the others',
 * and the job checkpoint is left to stasis_commit_job. */
#define STASIS_PART_NO_COMMIT 1

#ifndef STASIS_CGO /* the prototypes; the library's own build skips them */

int32_t stasis_abi_version(void);
/* The library's build version; a static string, not to be freed. */
const char *stasis_version(void);

/* Opens the store at home (NULL or "": $STASIS_HOME, else the default)
 * with a codec method ("auto", "none", "zstd", "s2"; NULL or "": auto). */
int stasis_open(const char *home, const char *compress, stasis_store *out, stasis_error *err);
/* Waits for a save in flight, frees the snapshot memory, releases s.
 * Checkpoints begun on s can no longer be committed (STASIS_EINVAL). */
int stasis_close(stasis_store s, stasis_error *err);

/* Readies the store's snapshot memory for asynchronous saves of n buffers
 * of these sizes (their contents are not read): allocated now and, for GPU
 * buffers, pinned in the background, so that the first asynchronous save
 * is as quick as the later ones. Waits for a save in flight. */
int stasis_prepare(stasis_store s, const stasis_tensor *tensors, size_t n, stasis_error *err);

/* Starts a checkpoint of job at step (0 or more). */
int stasis_begin(stasis_store s, const char *job, int64_t step, stasis_checkpoint *out, stasis_error *err);
/* Adds n buffers: all of them, or on error none. The copies out of GPU
 * memory wait for work on the legacy default stream only: synchronize
 * work on other streams that writes the buffers first. */
int stasis_add(stasis_checkpoint c, const stasis_tensor *tensors, size_t n, stasis_error *err);
/* Chooses the codec method of c ("auto", "none", "zstd", "s2") instead
 * of the store's. */
int stasis_set_compress(stasis_checkpoint c, const char *method, stasis_error *err);
/* Chooses the I/O path of c's GPU buffers for a blocking commit: "auto"
 * (cuFile where it does GPUDirect Storage and the save is uncompressed,
 * else stasis's pinned pipeline), "cufile" (cuFile for every chunk that
 * lies inside one GPU buffer, compat mode included; STASIS_EUNAVAILABLE
 * where cuFile cannot work) or "pinned"; NULL or "": $STASIS_IO, else
 * auto. An asynchronous commit writes its host snapshot through the
 * pinned pipeline whatever the path. */
int stasis_set_io(stasis_checkpoint c, const char *io, stasis_error *err);
/* Records a JSON value describing the state (returned by stasis_describe). */
int stasis_set_state(stasis_checkpoint c, const char *json, stasis_error *err);
/* Makes c rank's part of the job checkpoint of its job and step in attempt
 * (1 to 64 of A-Z a-z 0-9 . _ -; the same for every rank of one run), in
 * a world of world_size ranks. Rank 0's commit, once its part is durable,
 * waits up to timeout_ms (0: ten minutes) for every rank's part, then
 * commits the job checkpoint and returns its record; a rank that never
 * arrives fails it with STASIS_EINCOMPLETE, and nothing is listed. */
int stasis_set_part(stasis_checkpoint c, int32_t rank, int32_t world_size, const char *attempt, int64_t timeout_ms, int flags, stasis_error *err);
/* Waits up to timeout_ms (0: ten minutes) until every rank's part of job
 * at step in attempt is committed, then commits the job checkpoint with
 * app_json (a JSON value for its readers, or NULL); its record in
 * *record_json. */
int stasis_commit_job(stasis_store s, const char *job, int64_t step, int32_t world_size, const char *attempt, int64_t timeout_ms, const char *app_json, char **record_json, stasis_error *err);
/* job's complete job checkpoint at step (step < 0: the latest): its record
 * with attempt, world_size, parts (rank, id, host, bytes, stored_bytes,
 * manifest_sha256) and app, as a JSON object. */
int stasis_job(stasis_store s, const char *job, int64_t step, char **job_json, stasis_error *err);
/* Commits c, which is released whatever the outcome. Blocking (flags 0):
 * returns once the checkpoint is durable and listed, with its record in
 * *record_json (may be NULL). STASIS_ASYNC: returns once every buffer is
 * copied out, with the save in *save (wait on it, then release it). */
int stasis_commit(stasis_checkpoint c, int flags, stasis_save *save, char **record_json, stasis_error *err);
/* Releases c without committing. */
void stasis_discard(stasis_checkpoint c);

/* Waits for the save; its record in *record_json (may be NULL). */
int stasis_save_wait(stasis_save v, char **record_json, stasis_error *err);
/* 1 when the save has finished (successfully or not), 0 when not, -1 for
 * an unknown handle. */
int stasis_save_done(stasis_save v);
/* How long the commit waited for the save before it, and how long its
 * snapshot took (seconds); the training loop's stall is about their sum. */
int stasis_save_times(stasis_save v, double *waited_s, double *snapshot_s, stasis_error *err);
/* Releases v (a save in flight goes on). */
void stasis_save_release(stasis_save v);

/* The record of job's tensors checkpoint at step (step < 0: the latest);
 * job must be named. */
int stasis_find(stasis_store s, const char *job, int64_t step, char **record_json, stasis_error *err);
/* What rank (of world_size ranks; 0: the checkpoint's) loads of job at
 * step (step < 0: the latest): the record of its part of a job
 * checkpoint, or of a tensors checkpoint one process saved. A job
 * checkpoint of another world size is STASIS_EMISMATCH; rank < 0 for a job
 * checkpoint STASIS_EINVAL. */
int stasis_find_for_rank(stasis_store s, const char *job, int64_t step, int32_t rank, int32_t world_size, char **record_json, stasis_error *err);
/* The records of job's checkpoints ("" or NULL: every job) as a JSON array. */
int stasis_list(stasis_store s, const char *job, char **records_json, stasis_error *err);
/* The checkpoint whose ID starts with id: record, tensors (name, dtype,
 * shape, bytes), state, io_path and io_why (the path the saved bytes took,
 * and why), as a JSON object. */
int stasis_describe(stasis_store s, const char *id, char **info_json, stasis_error *err);
/* Loads the checkpoint whose ID starts with id into n buffers, matched by
 * name; every chunk is verified first. On error the buffers may hold a mix
 * of old and new bytes. */
int stasis_load(stasis_store s, const char *id, const stasis_tensor *into, size_t n, stasis_error *err);
/* stasis_load with the I/O path of GPU buffers (as stasis_set_io; NULL or
 * "": $STASIS_IO, else auto). Through cuFile, raw chunks that lie inside
 * one GPU buffer are read straight into it and verified there: one that
 * fails its checksum is STASIS_ECORRUPT, its bytes left in the buffer. */
int stasis_load_io(stasis_store s, const char *id, const stasis_tensor *into, size_t n, const char *io, stasis_error *err);

/* Frees a string the library returned. */
void stasis_free(void *p);

#endif /* STASIS_CGO */

#ifdef __cplusplus
}
#endif

#endif /* STASIS_H */
