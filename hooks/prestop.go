package hooks

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"
	"time"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/checkpoint"
)

// ErrNoCheckpoint is returned by PreStop when no checkpoint was committed
// in time, or the job ended without one.
var ErrNoCheckpoint = errors.New("no checkpoint committed")

// PreStopOptions configure PreStop.
type PreStopOptions struct {
	Job string
	// PID is the process to checkpoint when it is not the job's `stasis
	// run`; 0 means that stasis run.
	PID     int
	Timeout time.Duration
	Scripts Scripts
	// Checkpoint holds the CRIU and writer options of a process
	// checkpoint of PID.
	Checkpoint checkpoint.Options
	Log        io.Writer
}

// PreStop checkpoints a job that is about to be stopped (Kubernetes runs
// it as the container's preStop hook) and waits for the commit. When the
// job runs under `stasis run` (its J.pid is held), and PID is 0, that run
// or the job it supervises, the run is sent its first preemption signal
// and does the checkpoint of its mode; otherwise
// PID is checkpointed in process mode, and ends with the dump.
func PreStop(ctx context.Context, s *catalog.Store, o PreStopOptions) (*catalog.Record, error) {
	if err := catalog.ValidateJob(o.Job); err != nil {
		return nil, err
	}
	files := newRunFiles(s.Root, o.Job)
	runPID, running := files.runningPID()
	if running && (o.PID == 0 || o.PID == runPID || supervisedBy(files, o.PID)) {
		return preStopRun(ctx, s, o, files, runPID)
	}
	if o.PID == 0 {
		return nil, fmt.Errorf("%w: no stasis run of job %q is running in this store (%s is not held); give --pid", catalog.ErrNotFound, o.Job, files.pidFile())
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	co := o.Checkpoint
	co.PID, co.Job, co.LeaveRunning, co.Fast = o.PID, o.Job, false, false
	if rec, err := s.Latest(o.Job); err == nil {
		co.Step = rec.Step
	}
	res, err := Checkpoint(ctx, s, co, o.Scripts, o.Log)
	if res != nil {
		return res.Record, err
	}
	if ctx.Err() == context.DeadlineExceeded {
		return nil, fmt.Errorf("%w: the checkpoint of PID %d did not finish within %s (rolled back: %v)", ErrNoCheckpoint, o.PID, o.Timeout, err)
	}
	return nil, err
}

// supervisedBy reports whether pid is the job that the running stasis run
// of files supervises: its root (J.json's job_pid), a process of its
// session, or of its tree. Such a job is checkpointed by its run, never
// behind its back.
func supervisedBy(files runFiles, pid int) bool {
	st, err := files.readState()
	if err != nil || st.JobPID <= 0 {
		return false
	}
	if pid == st.JobPID {
		return true
	}
	if ps, err := readProcStat(pid); err == nil && ps.Session == st.JobPID {
		return true
	}
	tree, err := checkpoint.Tree(st.JobPID)
	if err != nil {
		return false
	}
	for _, p := range tree {
		if p.PID == pid {
			return true
		}
	}
	return false
}

// preStopRun has the job's stasis run checkpoint it.
func preStopRun(ctx context.Context, s *catalog.Store, o PreStopOptions, files runFiles, runPID int) (*catalog.Record, error) {
	st, err := files.readState()
	if err != nil {
		return nil, fmt.Errorf("stasis run of job %q (PID %d): %w", o.Job, runPID, err)
	}
	if st.State == "committed" {
		return committedRecord(s, st)
	}
	before, err := s.List(catalog.Filter{Job: o.Job})
	if err != nil {
		return nil, err
	}
	known := map[string]bool{}
	for _, r := range before {
		known[r.ID] = true
	}
	sig, err := ParseSignals(st.Signal)
	if err != nil {
		return nil, err
	}
	if err := syscall.Kill(runPID, sig[0]); err != nil {
		return nil, fmt.Errorf("signal stasis run of job %q (PID %d): %w", o.Job, runPID, err)
	}
	deadline := time.Now().Add(o.Timeout)
	for {
		// Whether it still runs is read before the catalog: a run that
		// commits and exits in between is not taken for a failed one.
		_, stillRunning := files.runningPID()
		recs, err := s.List(catalog.Filter{Job: o.Job})
		if err != nil {
			return nil, err
		}
		for i := len(recs) - 1; i >= 0; i-- {
			if !known[recs[i].ID] {
				return &recs[i], nil
			}
		}
		if now, err := files.readState(); err == nil {
			switch {
			case now.State == "committed":
				return committedRecord(s, now)
			case now.State == "failed" && now.Attempts > st.Attempts:
				return nil, fmt.Errorf("%w: stasis run of job %q: %s", ErrNoCheckpoint, o.Job, now.Error)
			}
		}
		if !stillRunning {
			return nil, fmt.Errorf("%w: stasis run of job %q ended without a new checkpoint", ErrNoCheckpoint, o.Job)
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%w: job %q has no new checkpoint after %s", ErrNoCheckpoint, o.Job, o.Timeout)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func committedRecord(s *catalog.Store, st runState) (*catalog.Record, error) {
	rec, err := s.Get(st.Checkpoint)
	if err != nil {
		return nil, err
	}
	return &rec, nil
}
