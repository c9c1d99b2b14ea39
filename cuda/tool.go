package cuda

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The cuda-checkpoint backend: where libcuda lacks the checkpoint API
// (drivers before 570), the process checkpoint calls go through NVIDIA's
// cuda-checkpoint binary (github.com/NVIDIA/cuda-checkpoint), which drives
// the same steps in the driver. Its command line, as its --help documents
// it:
//
//	cuda-checkpoint --get-state --pid P           prints running, locked, checkpointed or failed
//	cuda-checkpoint --action lock|checkpoint|restore|unlock --pid P [--timeout MS] [--device-map OLD=NEW,...]
//	cuda-checkpoint --get-restore-tid --pid P     prints the thread ID
//
// It exits 0 on success; on failure it says why on one line
// (`Could not lock on process ID 42: "device not ready"`) and exits
// non-zero. --device-map (restores onto other GPUs, GPUs named by UUID)
// came with CUDA 13.0; without it, restores that need GPU pairs are
// refused.

// ToolEnv is the environment variable that names the cuda-checkpoint
// binary.
const ToolEnv = "STASIS_CUDA_CHECKPOINT"

// FindTool finds cuda-checkpoint: the file $STASIS_CUDA_CHECKPOINT names
// when it is set (it must be executable), else a cuda-checkpoint beside
// the running binary, else one on PATH. where says which of the three.
func FindTool() (path, where string, err error) {
	if p := os.Getenv(ToolEnv); p != "" {
		if err := isExecutable(p); err != nil {
			return "", "", fmt.Errorf("$%s names %s, which %v", ToolEnv, p, err)
		}
		return p, "$" + ToolEnv, nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "cuda-checkpoint")
		if isExecutable(p) == nil {
			return p, "the directory of " + filepath.Base(exe), nil
		}
	}
	if p, err := exec.LookPath("cuda-checkpoint"); err == nil {
		return p, "PATH", nil
	}
	return "", "", errors.New("no cuda-checkpoint was found")
}

func isExecutable(p string) error {
	st, err := os.Stat(p)
	switch {
	case err != nil:
		return errors.New("does not exist")
	case !st.Mode().IsRegular():
		return errors.New("is not a file")
	case st.Mode().Perm()&0o111 == 0:
		return errors.New("is not executable")
	}
	return nil
}

// ToolError is a cuda-checkpoint run that failed.
type ToolError struct {
	Args   []string // its arguments
	PID    int
	Exit   string // "exit status 1", "signal: killed"
	Output string // what it said (stderr, then stdout), on one line
	// TimedOut is set for a lock that timed out (the driver's
	// CUDA_ERROR_NOT_READY, "device not ready").
	TimedOut bool
}

func (e *ToolError) Error() string {
	cmd := "cuda-checkpoint " + strings.Join(e.Args, " ")
	if e.Output == "" {
		return fmt.Sprintf("%s: %s", cmd, e.Exit)
	}
	return fmt.Sprintf("%s: %s (%s)", cmd, e.Output, e.Exit)
}

// tool is the cuda-checkpoint backend.
type tool struct {
	path     string
	helpOnce sync.Once
	remapErr error
}

// timeoutPattern matches what a lock that timed out says.
var timeoutPattern = regexp.MustCompile(`(?i)not[ _]ready|timed? ?out`)

// failurePattern matches a failure that cuda-checkpoint reports with exit
// status 0 (stasis trusts the message over the status).
var failurePattern = regexp.MustCompile(`(?m)^\s*Could not \S+ on process ID`)

// run runs cuda-checkpoint with args about pid and returns its stdout.
func (t *tool) run(pid int, args ...string) (string, error) {
	cmd := exec.Command(t.path, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		return "", fmt.Errorf("%w: cannot run %s: %v", ErrUnavailable, t.path, err)
	}
	raw := stderr.String() + "\n" + stdout.String()
	if err == nil && !failurePattern.MatchString(raw) {
		return stdout.String(), nil
	}
	said := oneLine(raw)
	e := &ToolError{Args: args, PID: pid, Exit: "exit status 0", Output: said}
	if exitErr != nil {
		e.Exit = exitErr.Error()
	}
	e.TimedOut = len(args) > 1 && args[0] == "--action" && args[1] == "lock" && timeoutPattern.MatchString(said)
	return "", e
}

// oneLine joins the non-empty lines of s with "; ", at most 300 bytes.
func oneLine(s string) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	out := strings.Join(lines, "; ")
	if len(out) > 300 {
		out = strings.ToValidUTF8(out[:297], "") + "..."
	}
	return out
}

func (t *tool) action(pid int, action string, more ...string) error {
	_, err := t.run(pid, append([]string{"--action", action, "--pid", strconv.Itoa(pid)}, more...)...)
	return err
}

func (t *tool) state(pid int) (State, error) {
	t.waitIdle(pid)
	return query(t, pid, "--get-state", parseState)
}

// query runs cuda-checkpoint OP --pid PID and reads what it prints.
func query[T any](t *tool, pid int, op string, parse func(string) (T, error)) (T, error) {
	out, err := t.run(pid, op, "--pid", strconv.Itoa(pid))
	if err == nil {
		var v T
		if v, err = parse(out); err == nil {
			return v, nil
		}
		err = fmt.Errorf("cuda-checkpoint %s --pid %d: %w", op, pid, err)
	}
	var zero T
	return zero, err
}

// idleWait bounds how long waitIdle waits.
const idleWait = 10 * time.Minute

// waitIdle waits, up to idleWait, while another cuda-checkpoint runs on
// pid. Unlike a driver call, a cuda-checkpoint step goes on when the
// stasis that started it is killed; the watchdog and recover, which begin
// with the state, must not act on the process before it ends.
func (t *tool) waitIdle(pid int) {
	for deadline := time.Now().Add(idleWait); t.busy(pid) && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
}

// busy reports whether a process runs this cuda-checkpoint on pid.
func (t *tool) busy(pid int) bool {
	entries, _ := os.ReadDir("/proc")
	self := strconv.Itoa(os.Getpid())
	for _, e := range entries {
		if e.Name() == self || e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		// The tool itself, or a script run by its interpreter.
		if i := slices.Index(args, t.path); i < 0 || i > 1 {
			continue
		}
		for i := 0; i+1 < len(args); i++ {
			if (args[i] == "--pid" || args[i] == "-p") && args[i+1] == strconv.Itoa(pid) {
				return true
			}
		}
	}
	return false
}

func (t *tool) lock(pid int, timeout time.Duration) error {
	return t.action(pid, "lock", "--timeout", strconv.FormatInt(lockMillis(timeout), 10))
}

func (t *tool) checkpoint(pid int) error { return t.action(pid, "checkpoint") }

func (t *tool) restore(pid int, pairs []GPUPair) error {
	if len(pairs) == 0 {
		return t.action(pid, "restore")
	}
	return t.action(pid, "restore", "--device-map", deviceMap(pairs))
}

func (t *tool) unlock(pid int) error { return t.action(pid, "unlock") }

func (t *tool) restoreThreadID(pid int) (int, error) {
	return query(t, pid, "--get-restore-tid", parseTID)
}

// canRemap asks the tool's --help, once, whether it has --device-map.
func (t *tool) canRemap() error {
	t.helpOnce.Do(func() {
		out, err := exec.Command(t.path, "--help").CombinedOutput()
		if !bytes.Contains(out, []byte("--device-map")) {
			why := "its --help lists no --device-map (it came with CUDA 13.0)"
			if err != nil && len(out) == 0 {
				why = "its --help failed: " + err.Error()
			}
			t.remapErr = fmt.Errorf("%w: %s cannot restore GPU state onto other GPUs: %s; restore onto the checkpoint's own GPUs, or install a newer cuda-checkpoint or an NVIDIA driver with the checkpoint API", ErrUnavailable, t.path, why)
		}
	})
	return t.remapErr
}

// ToolCanRemap says why the cuda-checkpoint at path cannot restore onto
// other GPUs (nil when it can).
func ToolCanRemap(path string) error {
	return (&tool{path: path}).canRemap()
}

// deviceMap writes GPU pairs as --device-map takes them:
// GPU-old=GPU-new,...
func deviceMap(pairs []GPUPair) string {
	m := make([]string, len(pairs))
	for i, p := range pairs {
		m[i] = FormatUUID(p.Old) + "=" + FormatUUID(p.New)
	}
	return strings.Join(m, ",")
}

// parseState reads --get-state's output: exactly one state name, as a
// word of its own ("running", or "state: running").
func parseState(out string) (State, error) {
	found := map[State]bool{}
	for _, w := range strings.FieldsFunc(strings.ToLower(out), func(r rune) bool {
		return !(r >= 'a' && r <= 'z')
	}) {
		for _, s := range []State{Running, Locked, Checkpointed, Failed} {
			if w == s.String() {
				found[s] = true
			}
		}
	}
	if len(found) == 1 {
		for s := range found {
			return s, nil
		}
	}
	return 0, fmt.Errorf("cannot read a state in %q", oneLine(out))
}

// parseTID reads --get-restore-tid's output: exactly one positive number.
func parseTID(out string) (int, error) {
	var tids []int
	for _, w := range strings.FieldsFunc(out, func(r rune) bool { return r < '0' || r > '9' }) {
		if n, err := strconv.Atoi(w); err == nil && n > 0 {
			tids = append(tids, n)
		}
	}
	if len(tids) != 1 {
		return 0, fmt.Errorf("cannot read a thread ID in %q", oneLine(out))
	}
	return tids[0], nil
}
