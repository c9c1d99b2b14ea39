// Command capi is built as libstasis.so (go build -buildmode=c-shared): the
// C ABI over package stasis, declared in stasis.h, which documents every
// call and who owns every pointer. The Python package (python/stasis)
// calls it through ctypes.
package main

/*
#cgo CFLAGS: -DSTASIS_CGO
#include <stdlib.h>
#include <string.h>
#include "stasis.h"

static void stasis_set_error(stasis_error *e, int code, const char *msg) {
	if (e == NULL) return;
	e->code = code;
	strncpy(e->message, msg, sizeof e->message - 1);
	e->message[sizeof e->message - 1] = 0;
}
*/
import "C"

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/stasis-ckpt/stasis"
	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/cuda"
	"github.com/stasis-ckpt/stasis/gdswriter"
	"github.com/stasis-ckpt/stasis/tensors"
	"golang.org/x/sys/unix"
)

// abiVersion is STASIS_ABI_VERSION of the stasis.h this library implements.
const abiVersion = 1

// version is the build's version (make sets it with -X).
var version = "dev"

var versionC = C.CString(version)

func main() {}

// The handles the library gives out: numbers, never Go pointers, since C
// may not keep those.
var (
	handles    sync.Map // uint64 -> *stasis.Store, *stasis.Checkpoint or *stasis.Save
	nextHandle atomic.Uint64
)

func newHandle(v any) C.uint64_t {
	h := nextHandle.Add(1)
	handles.Store(h, v)
	return C.uint64_t(h)
}

func lookup[T any](h C.uint64_t, what string) (T, error) {
	var zero T
	v, ok := handles.Load(uint64(h))
	if !ok {
		return zero, fmt.Errorf("%w: %s handle %d is not open", catalog.ErrInvalid, what, uint64(h))
	}
	t, ok := v.(T)
	if !ok {
		return zero, fmt.Errorf("%w: handle %d is not a %s", catalog.ErrInvalid, uint64(h), what)
	}
	return t, nil
}

// take removes a handle of type T and returns what it held: of two calls
// releasing the same handle, one gets it.
func take[T any](h C.uint64_t, what string) (T, error) {
	t, err := lookup[T](h, what)
	if err == nil && !handles.CompareAndDelete(uint64(h), any(t)) {
		var zero T
		return zero, fmt.Errorf("%w: %s handle %d is not open", catalog.ErrInvalid, what, uint64(h))
	}
	return t, err
}

// errCode maps an error to its stasis_code.
func errCode(err error) C.int {
	switch {
	case err == nil:
		return C.STASIS_OK
	case errors.Is(err, stasis.ErrSaveInFlight):
		return C.STASIS_EINFLIGHT
	case errors.Is(err, catalog.ErrIncomplete):
		return C.STASIS_EINCOMPLETE
	case errors.Is(err, catalog.ErrNewerFormat):
		return C.STASIS_ENEWER
	case errors.Is(err, stasis.ErrMismatch):
		return C.STASIS_EMISMATCH
	case errors.Is(err, catalog.ErrInvalid):
		return C.STASIS_EINVAL
	case errors.Is(err, catalog.ErrNotFound):
		return C.STASIS_ENOTFOUND
	case errors.Is(err, catalog.ErrAmbiguous):
		return C.STASIS_EAMBIGUOUS
	case errors.Is(err, gdswriter.ErrCorrupt), errors.Is(err, catalog.ErrBadManifest):
		return C.STASIS_ECORRUPT
	case errors.Is(err, catalog.ErrBusy):
		return C.STASIS_EBUSY
	case errors.Is(err, catalog.ErrUnsafe):
		return C.STASIS_EUNSAFE
	case errors.Is(err, catalog.ErrDamaged):
		return C.STASIS_EDAMAGED
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return C.STASIS_ENOSPACE
	case errors.Is(err, cuda.ErrUnavailable), errors.Is(err, tensors.ErrCuFileUnavailable):
		return C.STASIS_EUNAVAILABLE
	case errors.Is(err, context.Canceled):
		return C.STASIS_ECANCELED
	}
	return C.STASIS_ERROR
}

// fail fills *e and returns the code.
func fail(e *C.stasis_error, err error) C.int {
	code := errCode(err)
	if err != nil {
		msg := C.CString(strings.ReplaceAll(err.Error(), "\n", " "))
		C.stasis_set_error(e, code, msg)
		C.free(unsafe.Pointer(msg))
	} else if e != nil {
		e.code, e.message[0] = 0, 0
	}
	return code
}

// putJSON stores v, as malloc'ed JSON, in *out (when out is not NULL).
func putJSON(out **C.char, v any) error {
	if out == nil {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	*out = C.CString(string(b))
	return nil
}

func goString(s *C.char) string {
	if s == nil {
		return ""
	}
	return C.GoString(s)
}

// Bounds on what a caller may pass, checked before any slice is made of
// its memory.
const (
	maxTensors = 1 << 28
	maxDims    = 64
)

// tensorsOf converts n C tensors into Go tensors; their memory stays C's.
func tensorsOf(p *C.stasis_tensor, n C.size_t) ([]stasis.Tensor, error) {
	if n == 0 {
		return nil, nil
	}
	if p == nil {
		return nil, fmt.Errorf("%w: %d tensors at a NULL pointer", catalog.ErrInvalid, uint64(n))
	}
	if uint64(n) > maxTensors {
		return nil, fmt.Errorf("%w: %d tensors, more than %d", catalog.ErrInvalid, uint64(n), maxTensors)
	}
	cs := unsafe.Slice(p, int(n))
	out := make([]stasis.Tensor, len(cs))
	for i, c := range cs {
		t := stasis.Tensor{Name: goString(c.name), DType: stasis.DType(goString(c.dtype)), Device: uintptr(c.device), Bytes: int64(c.nbytes)}
		if c.ndim < 0 || c.ndim > maxDims || (c.ndim > 0 && c.shape == nil) {
			return nil, fmt.Errorf("%w: tensor %q: ndim %d with shape %p (0 to %d dimensions)", catalog.ErrInvalid, t.Name, int(c.ndim), c.shape, maxDims)
		}
		if uint64(c.nbytes) > math.MaxInt64 {
			return nil, fmt.Errorf("%w: tensor %q: nbytes %d is out of range", catalog.ErrInvalid, t.Name, uint64(c.nbytes))
		}
		t.Shape = make([]int64, int(c.ndim))
		for d, v := range unsafe.Slice(c.shape, int(c.ndim)) {
			t.Shape[d] = int64(v)
		}
		if c.host != nil {
			t.Host = unsafe.Slice((*byte)(c.host), int(c.nbytes))
		} else if c.device == 0 && c.nbytes == 0 {
			t.Host = []byte{}
		}
		out[i] = t
	}
	return out, nil
}

//export stasis_abi_version
func stasis_abi_version() C.int32_t { return abiVersion }

//export stasis_version
func stasis_version() *C.char { return versionC }

//export stasis_open
func stasis_open(home, compress *C.char, out *C.stasis_store, e *C.stasis_error) C.int {
	if out == nil {
		return fail(e, fmt.Errorf("%w: out is NULL", catalog.ErrInvalid))
	}
	s, err := stasis.Open(stasis.Options{Home: goString(home), Compress: goString(compress)})
	if err != nil {
		return fail(e, err)
	}
	*out = C.stasis_store(newHandle(s))
	return fail(e, nil)
}

//export stasis_close
func stasis_close(h C.stasis_store, e *C.stasis_error) C.int {
	s, err := take[*stasis.Store](C.uint64_t(h), "store")
	if err != nil {
		return fail(e, err)
	}
	return fail(e, s.Close())
}

//export stasis_prepare
func stasis_prepare(h C.stasis_store, p *C.stasis_tensor, n C.size_t, e *C.stasis_error) C.int {
	s, err := lookup[*stasis.Store](C.uint64_t(h), "store")
	if err != nil {
		return fail(e, err)
	}
	ts, err := tensorsOf(p, n)
	if err != nil {
		return fail(e, err)
	}
	return fail(e, s.Prepare(ts))
}

//export stasis_begin
func stasis_begin(h C.stasis_store, job *C.char, step C.int64_t, out *C.stasis_checkpoint, e *C.stasis_error) C.int {
	s, err := lookup[*stasis.Store](C.uint64_t(h), "store")
	if err == nil && out == nil {
		err = fmt.Errorf("%w: out is NULL", catalog.ErrInvalid)
	}
	if err == nil {
		err = catalog.ValidateJob(goString(job))
	}
	if err != nil {
		return fail(e, err)
	}
	*out = C.stasis_checkpoint(newHandle(s.Begin(goString(job), int64(step))))
	return fail(e, nil)
}

//export stasis_add
func stasis_add(h C.stasis_checkpoint, p *C.stasis_tensor, n C.size_t, e *C.stasis_error) C.int {
	c, err := lookup[*stasis.Checkpoint](C.uint64_t(h), "checkpoint")
	if err != nil {
		return fail(e, err)
	}
	ts, err := tensorsOf(p, n)
	if err != nil {
		return fail(e, err)
	}
	return fail(e, c.Add(ts...))
}

//export stasis_set_compress
func stasis_set_compress(h C.stasis_checkpoint, method *C.char, e *C.stasis_error) C.int {
	c, err := lookup[*stasis.Checkpoint](C.uint64_t(h), "checkpoint")
	if err != nil {
		return fail(e, err)
	}
	return fail(e, c.SetCompress(goString(method)))
}

//export stasis_set_io
func stasis_set_io(h C.stasis_checkpoint, io *C.char, e *C.stasis_error) C.int {
	c, err := lookup[*stasis.Checkpoint](C.uint64_t(h), "checkpoint")
	if err != nil {
		return fail(e, err)
	}
	return fail(e, c.SetIO(goString(io)))
}

//export stasis_set_state
func stasis_set_state(h C.stasis_checkpoint, state *C.char, e *C.stasis_error) C.int {
	c, err := lookup[*stasis.Checkpoint](C.uint64_t(h), "checkpoint")
	if err != nil {
		return fail(e, err)
	}
	return fail(e, c.SetState([]byte(goString(state))))
}

//export stasis_commit
func stasis_commit(h C.stasis_checkpoint, flags C.int, save *C.stasis_save, record **C.char, e *C.stasis_error) C.int {
	c, err := take[*stasis.Checkpoint](C.uint64_t(h), "checkpoint")
	if err != nil {
		return fail(e, err)
	}
	if flags&C.STASIS_ASYNC == 0 {
		rec, err := c.Commit(context.Background())
		if err == nil {
			err = putJSON(record, rec)
		}
		return fail(e, err)
	}
	if save == nil {
		return fail(e, fmt.Errorf("%w: an asynchronous commit needs somewhere to put the save handle", catalog.ErrInvalid))
	}
	v, err := c.CommitAsync(context.Background(), stasis.AsyncOptions{FailIfBusy: flags&C.STASIS_FAIL_IF_BUSY != 0})
	if err != nil {
		return fail(e, err)
	}
	*save = C.stasis_save(newHandle(v))
	return fail(e, nil)
}

//export stasis_discard
func stasis_discard(h C.stasis_checkpoint) {
	take[*stasis.Checkpoint](C.uint64_t(h), "checkpoint")
}

//export stasis_save_wait
func stasis_save_wait(h C.stasis_save, record **C.char, e *C.stasis_error) C.int {
	v, err := lookup[*stasis.Save](C.uint64_t(h), "save")
	if err != nil {
		return fail(e, err)
	}
	rec, err := v.Wait()
	if err == nil {
		err = putJSON(record, rec)
	}
	return fail(e, err)
}

//export stasis_save_done
func stasis_save_done(h C.stasis_save) C.int {
	v, err := lookup[*stasis.Save](C.uint64_t(h), "save")
	switch {
	case err != nil:
		return -1
	case v.Done():
		return 1
	}
	return 0
}

//export stasis_save_times
func stasis_save_times(h C.stasis_save, waited, snapshot *C.double, e *C.stasis_error) C.int {
	v, err := lookup[*stasis.Save](C.uint64_t(h), "save")
	if err != nil {
		return fail(e, err)
	}
	if waited != nil {
		*waited = C.double(v.Waited.Seconds())
	}
	if snapshot != nil {
		*snapshot = C.double(v.Snapshot.Seconds())
	}
	return fail(e, nil)
}

//export stasis_save_release
func stasis_save_release(h C.stasis_save) {
	take[*stasis.Save](C.uint64_t(h), "save")
}

//export stasis_set_part
func stasis_set_part(h C.stasis_checkpoint, rank, world C.int32_t, attempt *C.char, timeoutMS C.int64_t, flags C.int, e *C.stasis_error) C.int {
	c, err := lookup[*stasis.Checkpoint](C.uint64_t(h), "checkpoint")
	if err != nil {
		return fail(e, err)
	}
	return fail(e, c.SetPart(stasis.PartOptions{Rank: int(rank), WorldSize: int(world), Attempt: goString(attempt),
		Timeout: time.Duration(timeoutMS) * time.Millisecond, NoCommit: flags&C.STASIS_PART_NO_COMMIT != 0}))
}

//export stasis_commit_job
func stasis_commit_job(h C.stasis_store, job *C.char, step C.int64_t, world C.int32_t, attempt *C.char, timeoutMS C.int64_t, app *C.char, record **C.char, e *C.stasis_error) C.int {
	s, err := lookup[*stasis.Store](C.uint64_t(h), "store")
	if err != nil {
		return fail(e, err)
	}
	var appJSON json.RawMessage
	if a := goString(app); a != "" {
		appJSON = json.RawMessage(a)
	}
	rec, err := s.CommitJob(context.Background(), goString(job), int64(step), stasis.PartOptions{WorldSize: int(world), Attempt: goString(attempt),
		Timeout: time.Duration(timeoutMS) * time.Millisecond}, appJSON)
	if err == nil {
		err = putJSON(record, rec)
	}
	return fail(e, err)
}

//export stasis_job
func stasis_job(h C.stasis_store, job *C.char, step C.int64_t, out **C.char, e *C.stasis_error) C.int {
	s, err := lookup[*stasis.Store](C.uint64_t(h), "store")
	if err != nil {
		return fail(e, err)
	}
	rec, jm, err := s.Job(goString(job), int64(step))
	if err == nil {
		err = putJSON(out, struct {
			stasis.Record
			*catalog.JobMeta
		}{rec, jm})
	}
	return fail(e, err)
}

//export stasis_find_for_rank
func stasis_find_for_rank(h C.stasis_store, job *C.char, step C.int64_t, rank, world C.int32_t, record **C.char, e *C.stasis_error) C.int {
	s, err := lookup[*stasis.Store](C.uint64_t(h), "store")
	if err != nil {
		return fail(e, err)
	}
	rec, err := s.FindForRank(goString(job), int64(step), int(rank), int(world))
	if err == nil {
		err = putJSON(record, rec)
	}
	return fail(e, err)
}

//export stasis_find
func stasis_find(h C.stasis_store, job *C.char, step C.int64_t, record **C.char, e *C.stasis_error) C.int {
	s, err := lookup[*stasis.Store](C.uint64_t(h), "store")
	if err != nil {
		return fail(e, err)
	}
	rec, err := s.Find(goString(job), int64(step))
	if err == nil {
		err = putJSON(record, rec)
	}
	return fail(e, err)
}

//export stasis_list
func stasis_list(h C.stasis_store, job *C.char, records **C.char, e *C.stasis_error) C.int {
	s, err := lookup[*stasis.Store](C.uint64_t(h), "store")
	if err != nil {
		return fail(e, err)
	}
	recs, err := s.List(goString(job))
	if err == nil {
		if recs == nil {
			recs = []stasis.Record{}
		}
		err = putJSON(records, recs)
	}
	return fail(e, err)
}

// tensorInfo is a tensor as stasis_describe reports it.
type tensorInfo struct {
	Name  string  `json:"name"`
	DType string  `json:"dtype"`
	Shape []int64 `json:"shape"`
	Bytes int64   `json:"bytes"`
}

//export stasis_describe
func stasis_describe(h C.stasis_store, id *C.char, out **C.char, e *C.stasis_error) C.int {
	s, err := lookup[*stasis.Store](C.uint64_t(h), "store")
	if err != nil {
		return fail(e, err)
	}
	info, err := s.Describe(goString(id))
	if err != nil {
		return fail(e, err)
	}
	ts := make([]tensorInfo, len(info.Tensors))
	for i, t := range info.Tensors {
		ts[i] = tensorInfo{Name: t.Name, DType: string(t.DType), Shape: t.Shape, Bytes: t.Bytes}
	}
	view := struct {
		stasis.Record
		Tensors []tensorInfo    `json:"tensors"`
		State   json.RawMessage `json:"state,omitempty"`
		IOPath  string          `json:"io_path"`
		IOWhy   string          `json:"io_why,omitempty"`
	}{info.Record, ts, info.State, info.IOPath, info.IOWhy}
	return fail(e, putJSON(out, view))
}

//export stasis_load
func stasis_load(h C.stasis_store, id *C.char, p *C.stasis_tensor, n C.size_t, e *C.stasis_error) C.int {
	return stasis_load_io(h, id, p, n, nil, e)
}

//export stasis_load_io
func stasis_load_io(h C.stasis_store, id *C.char, p *C.stasis_tensor, n C.size_t, io *C.char, e *C.stasis_error) C.int {
	s, err := lookup[*stasis.Store](C.uint64_t(h), "store")
	if err != nil {
		return fail(e, err)
	}
	if goString(io) != "" {
		if _, err := tensors.ParseIO(goString(io)); err != nil {
			return fail(e, err)
		}
	}
	into, err := tensorsOf(p, n)
	if err != nil {
		return fail(e, err)
	}
	_, err = s.LoadWith(context.Background(), goString(id), into, stasis.LoadOptions{IO: goString(io)})
	return fail(e, err)
}

//export stasis_free
func stasis_free(p unsafe.Pointer) { C.free(p) }
