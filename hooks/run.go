package hooks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/checkpoint"
	"github.com/stasis-ckpt/stasis/internal/atomicfile"
	"github.com/stasis-ckpt/stasis/restore"
	"golang.org/x/sys/unix"
)

// Mode is how stasis run checkpoints its job.
type Mode string

const (
	// ModeApp: the job saves itself when told (the preemption notice).
	ModeApp Mode = "app"
	// ModeProcess: stasis checkpoints the job's process tree with CRIU.
	ModeProcess Mode = "process"
)

// ParseMode reads "app" or "process".
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeApp, ModeProcess:
		return m, nil
	}
	return "", fmt.Errorf("mode %q: use app or process", s)
}

// Errors of starting the job, as a shell would report them.
var (
	ErrCommandNotFound = errors.New("command not found")
	ErrCannotExecute   = errors.New("cannot execute")
)

// Environment of the job.
const (
	EnvJob         = "STASIS_JOB"
	EnvHome        = "STASIS_HOME"
	EnvPreemptFile = "STASIS_PREEMPT_FILE"
	EnvResumeID    = "STASIS_RESUME_ID"
	EnvResumeStep  = "STASIS_RESUME_STEP"
)

// RunOptions configure Run.
type RunOptions struct {
	Job     string
	Mode    Mode
	Command []string
	// Signals are the preemption signals; the first is the one `stasis
	// hook prestop` sends. Other signals (forwarded) go to the job.
	Signals []syscall.Signal
	// Grace is how long after the first preemption signal the checkpoint
	// may take; past it the job is stopped: SIGTERM, then SIGKILL after
	// KillAfter.
	Grace, KillAfter time.Duration
	// Fallback ModeProcess (app mode only) takes a process checkpoint when
	// the job has neither taken up the notice nor committed a checkpoint
	// FallbackAfter (Grace/2 when zero) after it.
	Fallback      Mode
	FallbackAfter time.Duration
	Scripts       Scripts
	// Checkpoint holds the CRIU, writer and GPU options of process
	// checkpoints; Run sets the rest. Restore those of process restores.
	Checkpoint checkpoint.Options
	Restore    restore.Options
	// The job's stdio in app mode (process mode relays stdout and stderr
	// through pipes, and gives it /dev/null as stdin).
	Stdin, Stdout, Stderr *os.File
	// Log receives stasis run's own lines ("stasis run: ...").
	Log io.Writer
}

// End is how a stasis run ended.
type End int

const (
	// JobExited: the job ended by itself, with no preemption.
	JobExited End = iota
	// Checkpointed: preempted, and a checkpoint committed.
	Checkpointed
	// NotCheckpointed: preempted, and no checkpoint committed.
	NotCheckpointed
)

// Outcome reports a stasis run.
type Outcome struct {
	End End
	// Status is the job's exit code (128 + n when a signal ended it).
	Status     int
	Checkpoint *catalog.Record // Checkpointed: the new checkpoint
	Resumed    *catalog.Record // the checkpoint the job resumed from
	Reason     string          // NotCheckpointed: why
}

// attempt is one checkpoint of the job under way.
type attempt struct {
	mode   Mode
	cancel context.CancelFunc
}

// attemptResult ends an attempt. An app attempt ends once the notice is
// out (notified) or could not be (err); the commit is watched for apart.
type attemptResult struct {
	mode     Mode
	record   *catalog.Record
	err      error
	notified bool
	before   map[string]bool // app: the job's checkpoints before the notice
	since    time.Time       // app: when the notice was written
}

type supervisor struct {
	o     RunOptions
	s     *catalog.Store
	files runFiles
	state runState
	relay *relay // nil when the job writes to stasis's own stdio

	root int // the job's root process
	// waitFor is the child whose wait status is the job's: the root, or
	// the init of the PID namespace the root was restored into.
	waitFor int
	exited  bool
	status  int

	preempted    time.Time // the first preemption signal
	deadline     time.Time
	inFlight     *attempt
	results      chan attemptResult
	noticeOut    bool            // app: the notice is written
	before       map[string]bool // the job's checkpoints when the attempt began
	since        time.Time       // when the attempt began (app: the notice)
	fellBack     bool
	appBefore    map[string]bool // the job's checkpoints before the notice, once fallen back
	appSince     time.Time       // when the notice was written, once fallen back
	committed    *catalog.Record
	lastFailure  string
	held         []os.Signal // forwarded signals held during a checkpoint
	stopAsked    bool
	stopping     time.Time
	killed       bool
	postHookDone chan struct{}
}

// Run runs the job under stasis: it resumes the job's latest checkpoint if
// there is one, forwards signals, checkpoints on preemption, and reports
// how the job ended. An error means stasis run itself failed around the
// job (ErrCommandNotFound, ErrCannotExecute: the command did not start).
func Run(ctx context.Context, s *catalog.Store, o RunOptions) (*Outcome, error) {
	if len(o.Command) == 0 {
		return nil, fmt.Errorf("%w: no command to run (stasis run [flags] -- CMD ARGS...)", catalog.ErrInvalid)
	}
	if err := catalog.ValidateJob(o.Job); err != nil {
		return nil, err
	}
	if o.Fallback != "" && (o.Mode != ModeApp || o.Fallback != ModeProcess) {
		return nil, fmt.Errorf("%w: --fallback process applies to --mode app only", catalog.ErrInvalid)
	}
	if len(o.Signals) == 0 || o.Grace <= 0 || o.KillAfter < 0 {
		return nil, fmt.Errorf("%w: stasis run needs a preemption signal and a grace period", catalog.ErrInvalid)
	}
	if o.FallbackAfter <= 0 {
		o.FallbackAfter = o.Grace / 2
	}
	sv := &supervisor{o: o, s: s, files: newRunFiles(s.Root, o.Job), results: make(chan attemptResult, 1)}
	pidFile, err := sv.files.lockPID(o.Job)
	if err != nil {
		return nil, err
	}
	defer sv.files.release(pidFile)
	for _, p := range []string{sv.files.notice(), sv.files.ack(), sv.files.withdrawnNotice()} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	// Orphans of the job's tree become children of stasis, which reaps
	// them; a restored job is a child of stasis already (CRIU restores it
	// as a sibling of itself).
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("become a subreaper: %w", err)
	}
	// Signals are read from now on, while the job starts too: one that
	// comes during a restore is acted on once the job runs, its grace
	// counted from its arrival.
	sigs := listenSignals(forwarded)
	defer sigs.stop()

	sv.state = runState{PID: os.Getpid(), Job: o.Job, Mode: o.Mode, Signal: SignalName(o.Signals[0]), State: "starting"}
	sv.files.writeState(sv.state)
	out := &Outcome{}
	if err := sv.start(ctx, out); err != nil {
		return nil, err
	}
	g, err := startGuard(sv.root)
	if err != nil {
		signalTree(sv.root, syscall.SIGKILL)
		return nil, err
	}
	sv.state.JobPID, sv.state.State = sv.root, "running"
	sv.files.writeState(sv.state)
	sv.loop(ctx, sigs)
	sv.finish()
	g.Release(true)
	switch {
	case sv.committed != nil:
		out.End, out.Checkpoint = Checkpointed, sv.committed
	case !sv.preempted.IsZero():
		out.End, out.Reason = NotCheckpointed, sv.failureReason()
	default:
		out.End = JobExited
	}
	out.Status = sv.status
	return out, nil
}

func (sv *supervisor) logf(format string, args ...any) {
	fmt.Fprintf(sv.o.Log, "stasis run: "+format+"\n", args...)
}

// start resumes the job's latest checkpoint, or starts the command.
func (sv *supervisor) start(ctx context.Context, out *Outcome) error {
	resume, err := sv.resumePoint()
	if err != nil {
		return err
	}
	out.Resumed = resume
	if sv.o.Mode == ModeProcess || sv.o.Fallback == ModeProcess {
		if sv.relay, err = newRelay(sv.o.Stdout, sv.o.Stderr); err != nil {
			return err
		}
	}
	if resume != nil && resume.Kind == catalog.KindProcess {
		return sv.restore(ctx, resume)
	}
	return sv.exec(resume)
}

// resumePoint is the checkpoint the job goes on from: in process mode its
// latest process checkpoint, in app mode its latest checkpoint of any kind
// (a process one, taken by --fallback process, is restored).
func (sv *supervisor) resumePoint() (*catalog.Record, error) {
	recs, err := sv.s.List(catalog.Filter{Job: sv.o.Job})
	if err != nil {
		return nil, err
	}
	for i := len(recs) - 1; i >= 0; i-- {
		if sv.o.Mode == ModeApp || recs[i].Kind == catalog.KindProcess {
			return &recs[i], nil
		}
	}
	return nil, nil
}

func (sv *supervisor) restore(ctx context.Context, rec *catalog.Record) error {
	o := sv.o.Restore
	// A namespace's init ends with the job's root and passes its status
	// on (it is its parent there), and takes the namespace along if
	// stasis run dies.
	o.Supervised, o.KillAfter = true, sv.o.KillAfter
	if sv.relay != nil {
		o.CRIU.InheritFDs = sv.relay.inherit(rec.Tags)
	}
	res, err := Restore(ctx, sv.s, rec.ID, o, sv.o.Scripts, sv.o.Log)
	if res == nil {
		return fmt.Errorf("resume job %q from checkpoint %s: %w", sv.o.Job, rec.ID, err)
	}
	if err != nil {
		sv.logf("%v", err)
	}
	if sv.relay != nil {
		sv.relay.handedOver()
	}
	sv.root, sv.waitFor = res.PID, res.PID
	parent, where := os.Getpid(), "stasis run"
	if res.Init != 0 {
		// stasis run started the init, which is the root's parent.
		sv.waitFor, parent, where = res.Init, res.Init, fmt.Sprintf("its PID namespace's init (PID %d)", res.Init)
	}
	if ppid := parentOf(res.PID); ppid != parent {
		signalTree(res.PID, syscall.SIGKILL)
		if res.Init != 0 {
			syscall.Kill(res.Init, syscall.SIGKILL)
		}
		return fmt.Errorf("restored job %q as PID %d, but its parent is PID %d, not %s: it was killed", sv.o.Job, res.PID, ppid, where)
	}
	if res.Init != 0 {
		sv.logf("restored job %q (PID %d) from checkpoint %s into a new PID namespace, where it is PID %d (%s)", sv.o.Job, res.PID, rec.ID, res.PIDInside, pidnsReason(o.PIDNS, res.PIDTaken))
		return nil
	}
	sv.logf("restored job %q (PID %d) from checkpoint %s", sv.o.Job, res.PID, rec.ID)
	return nil
}

func pidnsReason(mode restore.PIDNSMode, taken string) string {
	if taken != "" {
		return taken
	}
	return "--new-pidns " + string(mode)
}

func parentOf(pid int) int {
	st, err := checkpoint.Status(pid)
	if err != nil {
		return 0
	}
	ppid, _ := strconv.Atoi(st["PPid"])
	return ppid
}

// exec starts the command, in a session of its own (so that its tree can
// be told apart and signalled as one) that dies with stasis (SIGKILL when
// stasis's thread that started it ends).
func (sv *supervisor) exec(resume *catalog.Record) error {
	cmd := exec.Command(sv.o.Command[0], sv.o.Command[1:]...)
	cmd.Env = sv.jobEnv(resume)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	if sv.relay != nil {
		devNull, err := os.Open(os.DevNull)
		if err != nil {
			return err
		}
		defer devNull.Close()
		cmd.Stdin, cmd.Stdout, cmd.Stderr = devNull, sv.relay.jobOut, sv.relay.jobErr
	} else {
		cmd.Stdin, cmd.Stdout, cmd.Stderr = sv.o.Stdin, sv.o.Stdout, sv.o.Stderr
	}
	err := cmd.Start()
	if sv.relay != nil {
		sv.relay.handedOver()
	}
	if err != nil {
		name := sv.o.Command[0]
		switch {
		case errors.Is(err, exec.ErrNotFound), errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("%w: %s", ErrCommandNotFound, name)
		case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.ENOEXEC), errors.Is(err, syscall.EISDIR):
			return fmt.Errorf("%w: %s: %v", ErrCannotExecute, name, errors.Unwrap(err))
		}
		return err
	}
	sv.root, sv.waitFor = cmd.Process.Pid, cmd.Process.Pid
	if resume != nil {
		sv.logf("job %q resumes from checkpoint %s (step %d)", sv.o.Job, resume.ID, resume.Step)
	}
	return nil
}

// jobEnv is stasis's environment with the job's variables set and no
// stale ones inherited.
func (sv *supervisor) jobEnv(resume *catalog.Record) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case EnvJob, EnvHome, EnvPreemptFile, EnvResumeID, EnvResumeStep:
		default:
			env = append(env, kv)
		}
	}
	env = append(env, EnvJob+"="+sv.o.Job, EnvHome+"="+sv.s.Root, EnvPreemptFile+"="+sv.files.notice())
	if resume != nil {
		env = append(env, EnvResumeID+"="+resume.ID, EnvResumeStep+"="+strconv.FormatInt(resume.Step, 10))
	}
	return env
}

// loop handles signals, checkpoint attempts, the grace period and the
// job's end, until the job has ended and nothing is under way.
func (sv *supervisor) loop(ctx context.Context, sigs *signalQueue) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for first := true; ; first = false {
		if first {
			// What came while the job was starting.
			for _, a := range sigs.take() {
				sv.onSignal(ctx, a)
			}
		}
		select {
		case <-sigs.wake:
			for _, a := range sigs.take() {
				sv.onSignal(ctx, a)
			}
		case <-sigs.chld:
		case r := <-sv.results:
			sv.onResult(ctx, r)
		case <-tick.C:
		}
		if !sv.exited {
			if ws, ok := reapJob(sv.root, sv.waitFor); ok {
				sv.onExit(checkpoint.ShellStatus(ws))
			}
		}
		sv.watch(ctx)
		if sv.exited && sv.inFlight == nil && sv.postHookDone == nil {
			return
		}
		if sv.postHookDone != nil {
			select {
			case <-sv.postHookDone:
				sv.postHookDone = nil
			default:
			}
		}
	}
}

func (sv *supervisor) isPreemption(sig syscall.Signal) bool {
	for _, s := range sv.o.Signals {
		if s == sig {
			return true
		}
	}
	return false
}

func (sv *supervisor) onSignal(ctx context.Context, a arrival) {
	sig, name := a.sig, SignalName(a.sig)
	switch {
	case !sv.isPreemption(sig):
		if sv.exited {
			return
		}
		if sv.inFlight != nil {
			// Delivered now, it would be part of the checkpoint (a
			// restored job would get it again) or cut the job's save.
			sv.held = append(sv.held, sig)
			sv.logf("SIG%s held until the checkpoint ends", name)
			return
		}
		sv.forward(sig)
	case sv.exited || !sv.stopping.IsZero():
		sv.logf("SIG%s: the job is ending; ignored", name)
	case sv.committed != nil:
		sv.logf("SIG%s: checkpoint %s is already committed; ignored", name, sv.committed.ID)
	case sv.inFlight != nil:
		sv.logf("SIG%s during the checkpoint under way: ignored", name)
	default:
		if sv.preempted.IsZero() {
			sv.preempted = a.at
			sv.deadline = sv.preempted.Add(sv.o.Grace)
		}
		sv.logf("SIG%s: checkpointing job %q (%s mode, grace until %s)", name, sv.o.Job, sv.o.Mode, sv.deadline.Format(time.RFC3339))
		sv.begin(ctx, sv.o.Mode, sig)
	}
}

func (sv *supervisor) forward(sig syscall.Signal) {
	if err := syscall.Kill(-sv.root, sig); err != nil {
		syscall.Kill(sv.root, sig)
	}
}

// begin starts a checkpoint attempt of mode.
func (sv *supervisor) begin(ctx context.Context, mode Mode, sig syscall.Signal) {
	actx, cancel := context.WithDeadline(ctx, sv.deadline)
	sv.inFlight = &attempt{mode: mode, cancel: cancel}
	sv.state.State, sv.state.Error = "checkpointing", ""
	sv.state.Attempts++
	sv.files.writeState(sv.state)
	step := sv.latestStep()
	if mode == ModeProcess {
		// CRIU may fail after the commit: the checkpoint is then listed
		// all the same (newCheckpoint).
		sv.before, sv.since = nil, time.Now()
		if ids, err := sv.checkpointIDs(); err == nil {
			sv.before = ids
		}
		o := sv.o.Checkpoint
		o.PID, o.Job, o.Step, o.LeaveRunning, o.Fast = sv.root, sv.o.Job, step, false, false
		if sv.relay != nil {
			o.Tags = sv.relay.tags
		}
		var check func() error
		if sv.fellBack {
			// The job may take up the notice while the pre_checkpoint
			// hook runs: then it is saving itself, and is not frozen.
			appBefore, appSince := sv.appBefore, sv.appSince
			check = func() error { return sv.jobAnswered(appBefore, appSince) }
		}
		go func() {
			res, err := checkpointWithCheck(actx, sv.s, o, sv.o.Scripts, sv.o.Log, check)
			r := attemptResult{mode: mode, err: err}
			if res != nil {
				r.record = res.Record
			}
			sv.results <- r
		}()
		return
	}
	ev := Event{Job: sv.o.Job, Step: step, PID: sv.root, Kind: KindApp, Home: sv.s.Root}
	go func() {
		if err := sv.o.Scripts.Run(actx, PreCheckpoint, ev, sv.o.Log); err != nil {
			sv.results <- attemptResult{mode: mode, err: fmt.Errorf("no notice sent, the job runs on: %w", err)}
			return
		}
		before, err := sv.checkpointIDs()
		since := time.Now()
		if err == nil {
			err = writeNotice(sv.files.notice(), sig, sv.deadline)
		}
		sv.results <- attemptResult{mode: mode, err: err, notified: err == nil, before: before, since: since}
	}()
}

// latestStep is the step of the job's latest checkpoint (0 without one):
// the step a process checkpoint records, stasis not knowing the job's own.
func (sv *supervisor) latestStep() int64 {
	if rec, err := sv.s.Latest(sv.o.Job); err == nil {
		return rec.Step
	}
	return 0
}

func (sv *supervisor) checkpointIDs() (map[string]bool, error) {
	recs, err := sv.s.List(catalog.Filter{Job: sv.o.Job})
	ids := map[string]bool{}
	for _, r := range recs {
		ids[r.ID] = true
	}
	return ids, err
}

// Notice is the preemption notice, STASIS_PREEMPT_FILE's one JSON line.
type Notice struct {
	Signal   string `json:"signal"`
	Deadline string `json:"deadline"` // RFC 3339
}

func writeNotice(path string, sig syscall.Signal, deadline time.Time) error {
	data, err := json.Marshal(Notice{Signal: SignalName(sig), Deadline: deadline.UTC().Format(time.RFC3339)})
	if err != nil {
		return err
	}
	return atomicfile.Write(path, append(data, '\n'))
}

// errJobAnswered ends a fallback process checkpoint before the dump: the
// job has taken up the notice, or committed, after all.
var errJobAnswered = errors.New("the job has taken up the notice")

func (sv *supervisor) acked() bool {
	_, err := os.Stat(sv.files.ack())
	return err == nil
}

// jobAnswered is the fallback's last check: errJobAnswered when the job
// has acknowledged the notice or committed a checkpoint not listed in
// appBefore.
func (sv *supervisor) jobAnswered(appBefore map[string]bool, appSince time.Time) error {
	if sv.acked() {
		return errJobAnswered
	}
	if recs, err := sv.s.List(catalog.Filter{Job: sv.o.Job}); err == nil {
		for _, r := range recs {
			if !appBefore[r.ID] && !r.Created.Before(appSince) && r.Kind != catalog.KindProcess {
				return errJobAnswered
			}
		}
	}
	return nil
}

// restoreNotice puts the withdrawn notice back for the job.
func (sv *supervisor) restoreNotice() {
	if err := os.Rename(sv.files.withdrawnNotice(), sv.files.notice()); err != nil {
		sv.logf("cannot put the notice back: %v", err)
	}
}

func (sv *supervisor) onResult(ctx context.Context, r attemptResult) {
	if r.mode == ModeApp && r.notified {
		sv.noticeOut, sv.before, sv.since = true, r.before, r.since
		sv.logf("notice written to %s; waiting for the job's checkpoint", sv.files.notice())
		return
	}
	if r.mode == ModeProcess && errors.Is(r.err, errJobAnswered) {
		// Back to the app save, which the job has begun: wait for it
		// as before, up to the grace.
		sv.inFlight.cancel()
		sv.restoreNotice()
		sv.before, sv.since = sv.appBefore, sv.appSince
		sv.inFlight = &attempt{mode: ModeApp, cancel: func() {}}
		sv.logf("the job took up the notice before its process checkpoint: waiting for its own checkpoint instead")
		return
	}
	sv.inFlight.cancel()
	sv.inFlight = nil
	if r.record != nil {
		sv.onCommitted(r.record)
		if r.err != nil {
			sv.logf("%v", r.err) // a post_checkpoint hook failed
		}
		return
	}
	if rec := sv.newCheckpoint(ModeProcess); r.mode == ModeProcess && rec != nil {
		sv.logf("%v", r.err)
		sv.onCommitted(rec)
		return
	}
	sv.lastFailure = r.err.Error()
	sv.state.State, sv.state.Error = "failed", sv.lastFailure
	sv.files.writeState(sv.state)
	if sv.exited {
		sv.logf("checkpoint failed: %v", r.err)
	} else {
		sv.logf("checkpoint failed, the job runs on: %v", r.err)
	}
	sv.releaseHeld()
}

func (sv *supervisor) onCommitted(rec *catalog.Record) {
	sv.committed = rec
	sv.state.State, sv.state.Checkpoint = "committed", rec.ID
	sv.files.writeState(sv.state)
	sv.logf("checkpoint %s of job %q committed (step %d, %s)", rec.ID, sv.o.Job, rec.Step, rec.Kind)
	sv.releaseHeld()
}

func (sv *supervisor) releaseHeld() {
	held := sv.held
	sv.held = nil
	if sv.exited {
		return
	}
	for _, sig := range held {
		sv.forward(sig.(syscall.Signal))
	}
}

// newCheckpoint reports the job's latest checkpoint of the attempt: one
// that was not listed when the attempt began and was created since (after
// the notice was written, in app mode), of the attempt's kind: a process
// checkpoint for a process attempt (CRIU may fail after the commit), one
// the job saved for an app attempt (a process checkpoint then is not the
// job's answer; the fallback's comes as its result).
func (sv *supervisor) newCheckpoint(mode Mode) *catalog.Record {
	if sv.before == nil {
		return nil
	}
	recs, err := sv.s.List(catalog.Filter{Job: sv.o.Job})
	if err != nil {
		return nil
	}
	for i := len(recs) - 1; i >= 0; i-- {
		r := &recs[i]
		if !sv.before[r.ID] && !r.Created.Before(sv.since) && (r.Kind == catalog.KindProcess) == (mode == ModeProcess) {
			return r
		}
	}
	return nil
}

// watch follows what runs against the clock: the app checkpoint's commit,
// the fallback, the grace period and the stopping job.
func (sv *supervisor) watch(ctx context.Context) {
	now := time.Now()
	waitingForApp := sv.inFlight != nil && sv.inFlight.mode == ModeApp && sv.noticeOut
	if waitingForApp {
		if rec := sv.newCheckpoint(ModeApp); rec != nil {
			sv.inFlight.cancel()
			sv.inFlight = nil
			sv.onCommitted(rec)
			sv.postAppHook(ctx, rec)
			return
		}
		if sv.exited {
			sv.inFlight.cancel()
			sv.inFlight = nil
			return
		}
		if sv.o.Fallback == ModeProcess && !sv.fellBack && now.After(sv.preempted.Add(sv.o.FallbackAfter)) && !sv.acked() {
			// The notice is taken out of the job's sight first, so that a
			// job resumed from the process checkpoint cannot act on it;
			// an acknowledgement that came meanwhile keeps the app save.
			if err := os.Rename(sv.files.notice(), sv.files.withdrawnNotice()); err != nil {
				sv.logf("cannot withdraw the notice for the fallback: %v", err)
			} else if sv.acked() {
				sv.restoreNotice()
			} else {
				sv.fellBack = true
				sv.logf("the job has not taken up the notice after %s: process checkpoint instead", sv.o.FallbackAfter)
				sv.inFlight.cancel()
				sv.inFlight = nil
				sv.appBefore, sv.appSince = sv.before, sv.since
				sv.begin(ctx, ModeProcess, sv.o.Signals[0])
				return
			}
		}
	}
	if sv.exited || sv.preempted.IsZero() {
		return
	}
	if !sv.stopAsked && now.After(sv.deadline) {
		sv.stopAsked = true
		if sv.committed == nil {
			sv.lastFailure = fmt.Sprintf("no checkpoint within the grace period (%s)", sv.o.Grace)
		}
		if sv.inFlight != nil && sv.inFlight.mode == ModeProcess {
			sv.inFlight.cancel() // rolled back, then the job is stopped
		}
	}
	if sv.stopAsked && sv.stopping.IsZero() && (sv.inFlight == nil || sv.inFlight.mode == ModeApp) {
		sv.stopping = now
		sv.state.State = "stopping"
		sv.files.writeState(sv.state)
		sv.logf("grace period over: stopping the job (SIGTERM, SIGKILL after %s)", sv.o.KillAfter)
		signalTree(sv.root, syscall.SIGTERM)
	}
	if !sv.stopping.IsZero() && !sv.killed && now.After(sv.stopping.Add(sv.o.KillAfter)) {
		sv.killed = true
		signalTree(sv.root, syscall.SIGKILL)
	}
}

func (sv *supervisor) postAppHook(ctx context.Context, rec *catalog.Record) {
	if sv.o.Scripts.PostCheckpoint == "" {
		return
	}
	done := make(chan struct{})
	sv.postHookDone = done
	ev := Event{Job: sv.o.Job, Step: rec.Step, PID: sv.root, Kind: KindApp, CheckpointID: rec.ID, Home: sv.s.Root}
	go func() {
		defer close(done)
		if err := sv.o.Scripts.Run(ctx, PostCheckpoint, ev, sv.o.Log); err != nil {
			sv.logf("checkpoint %s is stored, but: %v", rec.ID, err)
		}
	}()
}

func (sv *supervisor) onExit(status int) {
	sv.exited, sv.status = true, status
	if sv.inFlight != nil && sv.inFlight.mode == ModeApp && sv.noticeOut && sv.committed == nil {
		// The job may have committed and exited between two looks.
		return
	}
	if sv.committed == nil && !sv.preempted.IsZero() && sv.lastFailure == "" {
		sv.lastFailure = fmt.Sprintf("the job exited (status %d) without a checkpoint", status)
	}
}

func (sv *supervisor) failureReason() string {
	if sv.lastFailure == "" {
		return fmt.Sprintf("the job exited (status %d) without a checkpoint", sv.status)
	}
	return sv.lastFailure
}

// finish ends what the job left behind: processes of its session still
// running (SIGTERM, then SIGKILL after KillAfter) and its output.
func (sv *supervisor) finish() {
	if left := sessionMembers(sv.root); len(left) > 0 {
		sv.logf("the job's root has ended; stopping %d process(es) it left: %v", len(left), left)
		signalTree(sv.root, syscall.SIGTERM)
		for deadline := time.Now().Add(sv.o.KillAfter); time.Now().Before(deadline) && len(sessionMembers(sv.root)) > 0; time.Sleep(50 * time.Millisecond) {
			reapJob(sv.root, sv.waitFor)
		}
		signalTree(sv.root, syscall.SIGKILL)
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && len(sessionMembers(sv.root)) > 0; time.Sleep(20 * time.Millisecond) {
			reapJob(sv.root, sv.waitFor)
		}
		reapJob(sv.root, sv.waitFor)
	}
	if sv.relay != nil {
		sv.relay.wait(2 * time.Second)
	}
}
