package hooks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The user hooks, by the names config.toml and STASIS_HOOK give them.
const (
	PreCheckpoint  = "pre_checkpoint"
	PostCheckpoint = "post_checkpoint"
	PostRestore    = "post_restore"
)

// DefaultHookTimeout bounds a hook script when neither the configuration
// nor a flag says otherwise.
const DefaultHookTimeout = 60 * time.Second

// Kinds of checkpoint, as STASIS_KIND tells a hook.
const (
	KindProcess = "process" // CRIU's image of the process tree
	KindApp     = "app"     // written by the job itself
)

// ErrHook is wrapped by every failure of a user hook (*HookError).
var ErrHook = errors.New("hook failed")

// Scripts are the user hook scripts: executables run with the checkpoint's
// details in their environment (Event). An empty path runs nothing.
type Scripts struct {
	PreCheckpoint  string        `toml:"pre_checkpoint"`
	PostCheckpoint string        `toml:"post_checkpoint"`
	PostRestore    string        `toml:"post_restore"`
	Timeout        time.Duration `toml:"timeout"` // DefaultHookTimeout when zero
}

func (s Scripts) paths() map[string]string {
	return map[string]string{PreCheckpoint: s.PreCheckpoint, PostCheckpoint: s.PostCheckpoint, PostRestore: s.PostRestore}
}

// Over returns s with the fields of base that s leaves unset: flags over the
// configuration file.
func (s Scripts) Over(base Scripts) Scripts {
	pick := func(a, b string) string {
		if a != "" {
			return a
		}
		return b
	}
	out := Scripts{
		PreCheckpoint:  pick(s.PreCheckpoint, base.PreCheckpoint),
		PostCheckpoint: pick(s.PostCheckpoint, base.PostCheckpoint),
		PostRestore:    pick(s.PostRestore, base.PostRestore),
		Timeout:        s.Timeout,
	}
	if out.Timeout == 0 {
		out.Timeout = base.Timeout
	}
	return out
}

// Event is what a hook is told, in its environment: STASIS_HOOK,
// STASIS_JOB, STASIS_STEP, STASIS_PID, STASIS_KIND, STASIS_HOME, and for
// post hooks STASIS_CHECKPOINT_ID.
type Event struct {
	Job          string
	Step         int64
	PID          int
	Kind         string // KindProcess or KindApp
	CheckpointID string // post hooks only
	Home         string // the store
}

// HookError is a hook that could not run, failed or ran past its timeout.
type HookError struct {
	Hook   string // PreCheckpoint, ...
	Path   string
	Status string // "exited with status 3", "timed out after 1m0s", ...
	Stderr string // the end of what it wrote on stderr, on one line
}

func (e *HookError) Error() string {
	msg := fmt.Sprintf("%s hook %s %s", e.Hook, e.Path, e.Status)
	if e.Stderr != "" {
		msg += ": " + e.Stderr
	}
	return msg
}

func (e *HookError) Unwrap() error { return ErrHook }

// stderrTail is how much of a failed hook's stderr its error quotes.
const stderrTail = 300

// hookVars are the variables stasis sets for a hook; any inherited value
// of them is dropped first.
var hookVars = []string{"STASIS_HOOK", "STASIS_JOB", "STASIS_STEP", "STASIS_PID", "STASIS_KIND", "STASIS_CHECKPOINT_ID"}

// Run runs the hook named hook, if it is set, and waits for it (up to the
// timeout, when its process group is killed). Its stdout goes to log as it
// comes, its stderr after it ends; a failure is a *HookError.
func (s Scripts) Run(ctx context.Context, hook string, ev Event, log io.Writer) error {
	path := s.paths()[hook]
	if path == "" {
		return nil
	}
	timeout := s.Timeout
	if timeout <= 0 {
		timeout = DefaultHookTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path)
	cmd.Env = hookEnv(hook, ev)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = log, &stderr
	// Its own process group, so that a timeout ends whatever it started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	if errors.Is(err, exec.ErrWaitDelay) && cmd.ProcessState != nil && cmd.ProcessState.Success() {
		// It succeeded, but left a process (an upload in the background)
		// holding its output, which is no longer read.
		fmt.Fprintf(log, "stasis: warning: %s hook %s exited 0 but left a process holding its output\n", hook, path)
		err = nil
	}
	if err == nil {
		log.Write(stderr.Bytes())
		return nil
	}
	he := &HookError{Hook: hook, Path: path, Stderr: tail(stderr.String(), stderrTail)}
	var ee *exec.ExitError
	switch {
	case ctx.Err() == context.DeadlineExceeded:
		he.Status = fmt.Sprintf("timed out after %s", timeout)
	case errors.As(err, &ee) && ee.Exited():
		he.Status = fmt.Sprintf("exited with status %d", ee.ExitCode())
	case errors.As(err, &ee):
		he.Status = fmt.Sprintf("was killed (%s)", ee.ProcessState)
	default:
		he.Status = fmt.Sprintf("could not run (%v)", err)
	}
	return he
}

func hookEnv(hook string, ev Event) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		drop := false
		for _, v := range hookVars {
			drop = drop || name == v
		}
		if !drop {
			env = append(env, kv)
		}
	}
	env = append(env, "STASIS_HOOK="+hook, "STASIS_JOB="+ev.Job, "STASIS_STEP="+strconv.FormatInt(ev.Step, 10),
		"STASIS_PID="+strconv.Itoa(ev.PID), "STASIS_KIND="+ev.Kind)
	if ev.Home != "" {
		env = append(env, "STASIS_HOME="+ev.Home)
	}
	if hook != PreCheckpoint && ev.CheckpointID != "" {
		env = append(env, "STASIS_CHECKPOINT_ID="+ev.CheckpointID)
	}
	return env
}

// tail returns the last n bytes of s with its whitespace (newlines
// included) collapsed to single spaces.
func tail(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = "..." + s[len(s)-n:]
	}
	return s
}
