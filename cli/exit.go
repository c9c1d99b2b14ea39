package cli

import (
	"context"
	"errors"
	"io/fs"

	"github.com/stasis-ckpt/stasis/backend"
	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/checkpoint"
	"github.com/stasis-ckpt/stasis/criu"
	"github.com/stasis-ckpt/stasis/cuda"
	"github.com/stasis-ckpt/stasis/fileset"
	"github.com/stasis-ckpt/stasis/gdswriter"
	"github.com/stasis-ckpt/stasis/hooks"
	"github.com/stasis-ckpt/stasis/remote"
	"github.com/stasis-ckpt/stasis/restore"
	"golang.org/x/sys/unix"
)

// Exit codes. docs/cli.md lists them; scripts and schedulers rely on them.
const (
	ExitOK          = 0   // success
	ExitError       = 1   // any other failure (I/O error, bug)
	ExitUsage       = 2   // bad flags or arguments; nothing was done
	ExitNotFound    = 3   // no such checkpoint, job or path
	ExitAmbiguous   = 4   // an ID prefix matches several checkpoints
	ExitCorrupt     = 5   // stored data or a manifest failed its checks
	ExitBusy        = 6   // the catalog stayed locked past --lock-timeout
	ExitNoSpace     = 7   // the store's file system is full; the partial checkpoint was removed
	ExitMissingTool = 8   // CRIU is missing or too old
	ExitPIDInUse    = 9   // a PID the restored tree needs is taken
	ExitGPUTimeout  = 10  // the GPU lock timed out; the checkpoint or migration was rolled back and the job runs on
	ExitMismatch    = 11  // this machine does not match the checkpoint (driver, GPUs, files, mounts), or a GPU named is not here
	ExitHookFailed  = 12  // a user hook script failed or timed out
	ExitBadStream   = 13  // an import stream is not a stasis export, is truncated, or holds what an export may not; nothing was imported
	ExitExists      = 14  // the checkpoint to import is already in the store; nothing was changed
	ExitMemory      = 15  // the restored tree's memory was not what was checkpointed; CRIU undid the restore, nothing of it runs
	ExitRefused     = 16  // the checkpoint's preflight refused the tree (it holds what CRIU cannot dump); nothing was touched, the job runs on
	ExitIncomplete  = 17  // a job checkpoint's ranks did not all commit their part in time; nothing was listed
	ExitUnsafe      = 18  // the store, its config.toml or a hook script it names is not its user's alone, or the store's structure holds a link; nothing was done
	ExitDamaged     = 19  // the catalog was damaged: moved aside and rebuilt from the manifests; run the command again
	ExitUnreachable = 20  // the remote object store did not answer (or failed mid-transfer); nothing half-listed: run the command again
	ExitAuth        = 21  // the remote object store refused the credentials, or none were found
	ExitNoBucket    = 22  // the remote's bucket does not exist
	ExitNewer       = 23  // the checkpoint is of a newer format than this stasis reads: use a newer stasis
	ExitInterrupted = 130 // stopped by SIGINT or SIGTERM; the partial checkpoint was removed

	// stasis run's own codes, modeled on timeout(1); otherwise it exits
	// with the job's status (128 + n for a job killed by signal n).
	ExitPreempted       = 75  // preempted and checkpointed: requeue the job (EX_TEMPFAIL)
	ExitNoCheckpoint    = 124 // preempted, and no checkpoint committed (also prestop's)
	ExitRunFailed       = 125 // stasis run itself failed before or around the job
	ExitCannotExecute   = 126 // the command cannot be executed
	ExitCommandNotFound = 127 // the command was not found
)

// exitWith ends a command with a code of its own (stasis run passes its
// job's status through); err, when set, is the one-line message.
type exitWith struct {
	code int
	err  error
}

func (e exitWith) Error() string {
	if e.err == nil {
		return ""
	}
	return e.err.Error()
}

func (e exitWith) Unwrap() error { return e.err }

// usageError marks errors in how stasis was called.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(msg string) error { return usageError{msg: msg} }

// notFoundError marks a file named on the command line that does not exist.
type notFoundError struct{ err error }

func (e notFoundError) Error() string { return e.err.Error() }

// exitCode maps an error to the documented exit code.
func exitCode(err error) int {
	var ue usageError
	var ew exitWith
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &ew):
		return ew.code
	case errors.As(err, &ue), errors.Is(err, catalog.ErrInvalid), errors.Is(err, hooks.ErrConfig):
		return ExitUsage
	case errors.Is(err, context.Canceled):
		return ExitInterrupted
	case errors.Is(err, catalog.ErrUnsafe):
		return ExitUnsafe
	case errors.Is(err, catalog.ErrDamaged):
		return ExitDamaged
	case errors.Is(err, backend.ErrConfig):
		return ExitUsage
	case errors.Is(err, backend.ErrUnreachable):
		return ExitUnreachable
	case errors.Is(err, backend.ErrAuth):
		return ExitAuth
	case errors.Is(err, backend.ErrNoBucket):
		return ExitNoBucket
	case errors.Is(err, remote.ErrConflict):
		return ExitExists
	case errors.Is(err, hooks.ErrHook):
		return ExitHookFailed
	case errors.Is(err, hooks.ErrNoCheckpoint):
		return ExitNoCheckpoint
	case errors.Is(err, checkpoint.ErrRefused):
		return ExitRefused
	case cuda.TimedOut(err):
		return ExitGPUTimeout
	case errors.Is(err, restore.ErrIncompatible), errors.Is(err, cuda.ErrNoGPU):
		return ExitMismatch
	case errors.Is(err, criu.ErrNotInstalled), errors.Is(err, criu.ErrTooOld), errors.Is(err, cuda.ErrUnavailable):
		return ExitMissingTool
	case errors.Is(err, catalog.ErrNewerFormat):
		return ExitNewer
	case errors.Is(err, catalog.ErrIncomplete):
		return ExitIncomplete
	case errors.Is(err, restore.ErrMemoryMismatch):
		return ExitMemory
	case errors.Is(err, restore.ErrPIDInUse):
		return ExitPIDInUse
	case errors.Is(err, checkpoint.ErrNoProcess), errors.As(err, new(notFoundError)):
		return ExitNotFound
	case errors.Is(err, catalog.ErrBadStream):
		return ExitBadStream
	case errors.Is(err, catalog.ErrExists):
		return ExitExists
	case errors.Is(err, catalog.ErrAmbiguous):
		return ExitAmbiguous
	case errors.Is(err, catalog.ErrNotFound):
		return ExitNotFound
	case errors.Is(err, gdswriter.ErrCorrupt), errors.Is(err, catalog.ErrBadManifest):
		return ExitCorrupt
	case errors.Is(err, catalog.ErrBusy):
		return ExitBusy
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return ExitNoSpace
	case errors.Is(err, fileset.ErrSource) && errors.Is(err, fs.ErrNotExist):
		return ExitNotFound
	case errors.Is(err, fileset.ErrSource):
		return ExitUsage
	}
	return ExitError
}
