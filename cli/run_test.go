package cli_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stasis-ckpt/stasis/cli"
	"github.com/stasis-ckpt/stasis/hooks/hookstest"
)

// Tests of `stasis run` and `stasis hook prestop`: the real binary, real
// jobs, real signals. Those that checkpoint processes need root and CRIU
// (requireCRIU); the Python training loop needs python3 with NumPy.

// runningStasis is a `stasis run` started in the background.
type runningStasis struct {
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
}

func startRun(t *testing.T, home string, args ...string) *runningStasis {
	t.Helper()
	return startCommand(t, home, exec.Command(stasisBin, append([]string{"run"}, args...)...))
}

// startCommand starts cmd, which runs `stasis run` (in a wrapper such as
// unshare), in the background, with home as its store.
func startCommand(t *testing.T, home string, cmd *exec.Cmd) *runningStasis {
	t.Helper()
	r := &runningStasis{cmd: cmd}
	r.cmd.Env = append(os.Environ(), "STASIS_HOME="+home, "STASIS_BIN="+stasisBin)
	r.cmd.Stdout, r.cmd.Stderr = &r.stdout, &r.stderr
	// A job's leftover holding stasis's stdout must not hang the test.
	r.cmd.WaitDelay = 5 * time.Second
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if r.cmd.ProcessState == nil {
			r.cmd.Process.Kill()
			r.cmd.Wait()
		}
		if t.Failed() {
			t.Logf("%s: stderr:\n%s", strings.Join(r.cmd.Args, " "), r.stderr.String())
		}
	})
	return r
}

func (r *runningStasis) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := r.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal stasis run: %v", err)
	}
}

// wait waits for stasis run to exit (at most a minute) and returns how.
func (r *runningStasis) wait(t *testing.T) result {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- r.cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		r.cmd.Process.Kill()
		<-done
		t.Fatalf("stasis run did not end; stderr: %s", r.stderr.String())
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{code: code, stdout: r.stdout.String(), stderr: r.stderr.String()}
}

func expectExit(t *testing.T, r result, want int) {
	t.Helper()
	if r.code != want {
		t.Fatalf("stasis run exited %d, want %d; stderr:\n%s", r.code, want, r.stderr)
	}
}

// jobState is $STASIS_HOME/run/J.json, written by the job's stasis run.
type jobState struct {
	PID        int    `json:"pid"`
	JobPID     int    `json:"job_pid"`
	State      string `json:"state"`
	Attempts   int    `json:"attempts"`
	Checkpoint string `json:"checkpoint"`
	Error      string `json:"error"`
}

// waitJobState waits until the job's stasis run reports a state that ok
// accepts.
func waitJobState(t *testing.T, home, job string, ok func(jobState) bool) jobState {
	t.Helper()
	var st jobState
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		data, err := os.ReadFile(filepath.Join(home, "run", job+".json"))
		if err == nil && json.Unmarshal(data, &st) == nil && ok(st) {
			return st
		}
	}
	t.Fatalf("job %s: stasis run never reached the awaited state (last: %+v)", job, st)
	return st
}

func jobRunning(st jobState) bool { return st.State == "running" && st.JobPID > 0 }

func waitLine(t *testing.T, path, line string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		data, _ := os.ReadFile(path)
		for _, l := range strings.Split(string(data), "\n") {
			if l == line {
				return
			}
		}
	}
	t.Fatalf("%s never got the line %q", path, line)
}

func TestRunForwardsSignalsAndPassesTheJobStatusOn(t *testing.T) {
	home, out := t.TempDir(), filepath.Join(t.TempDir(), "signals")
	r := startRun(t, home, "--job", "signals", "--", "testdata/signals.sh", out)
	waitLine(t, out, "ready")
	for _, sig := range []struct {
		number syscall.Signal
		name   string
	}{{syscall.SIGINT, "INT"}, {syscall.SIGHUP, "HUP"}, {syscall.SIGUSR2, "USR2"}} {
		r.signal(t, sig.number)
		waitLine(t, out, sig.name)
	}
	r.signal(t, syscall.SIGTERM)
	res := r.wait(t)
	expectExit(t, res, 3) // the job's own status
	waitLine(t, out, "TERM")
	if strings.Contains(res.stderr, "stasis") {
		t.Errorf("a job that ended by itself made stasis run say: %s", res.stderr)
	}
	if recs := list(t, home); len(recs) != 0 {
		t.Fatalf("forwarded signals made checkpoints: %+v", recs)
	}
}

func TestRunExitCodesOfTheCommand(t *testing.T) {
	home, tmp := t.TempDir(), t.TempDir()
	notExecutable := filepath.Join(tmp, "job.sh")
	os.WriteFile(notExecutable, []byte("#!/bin/sh\n"), 0o644)
	for _, tc := range []struct {
		name    string
		args    []string
		code    int
		message string
	}{
		{"exit status", []string{"--job", "j", "--", "sh", "-c", "exit 9"}, 9, ""},
		{"killed by a signal", []string{"--job", "j", "--", "sh", "-c", "kill -KILL $$"}, 128 + 9, ""},
		{"not found", []string{"--job", "j", "--", "no-such-command-here"}, cli.ExitCommandNotFound, `command not found: no-such-command-here`},
		{"not executable", []string{"--job", "j", "--", notExecutable}, cli.ExitCannotExecute, `cannot execute: .*job\.sh: permission denied`},
		{"no job", []string{"--", "true"}, cli.ExitRunFailed, `needs --job`},
		{"unknown flag", []string{"--job", "j", "--frobnicate", "--", "true"}, cli.ExitRunFailed, `frobnicate`},
		{"signal it cannot own", []string{"--job", "j", "--signal", "KILL", "--", "true"}, cli.ExitRunFailed, `--signal: "KILL" is not a signal`},
		{"no command", []string{"--job", "j"}, cli.ExitRunFailed, `no command to run`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, home, append([]string{"run"}, tc.args...)...)
			if tc.message == "" {
				if r.code != tc.code {
					t.Fatalf("exit %d, want %d: %s", r.code, tc.code, r.stderr)
				}
				return
			}
			expectCode(t, r, tc.code, tc.message)
		})
	}
}

func TestRunFlagsOfTheCommandAreItsOwn(t *testing.T) {
	home := t.TempDir()
	r := mustRun(t, home, "run", "--job", "echo", "sh", "-c", `echo "$0 $1 $STASIS_JOB"`, "--mode", "--grace")
	if got := strings.TrimSpace(r.stdout); got != "--mode --grace echo" {
		t.Fatalf("the command got %q", got)
	}
}

func TestRunRefusesASecondRunOfTheSameJob(t *testing.T) {
	home, out := t.TempDir(), filepath.Join(t.TempDir(), "signals")
	first := startRun(t, home, "--job", "once", "--", "testdata/signals.sh", out)
	waitJobState(t, home, "once", jobRunning)
	expectCode(t, run(t, home, "run", "--job", "once", "--", "true"), cli.ExitRunFailed, `already running under stasis run: job "once" is run by PID \d+`)
	first.signal(t, syscall.SIGTERM)
	expectExit(t, first.wait(t), 3)
	if entries := entriesIn(t, filepath.Join(home, "run")); len(entries) != 0 {
		t.Fatalf("stasis run left %v in run/", entries)
	}
}

// pythonWithNumPy returns a python3 that can import numpy.
func pythonWithNumPy(t *testing.T) string {
	t.Helper()
	var tried []string
	for _, name := range []string{"python3", "/usr/bin/python3"} {
		py, err := exec.LookPath(name)
		if err != nil {
			continue
		}
		if exec.Command(py, "-c", "import numpy").Run() == nil {
			return py
		}
		tried = append(tried, py)
	}
	t.Skipf("no python3 with NumPy (tried %v); Debian's python3-numpy provides one", tried)
	return ""
}

func pythonPath(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs("../python")
	if err != nil {
		t.Fatal(err)
	}
	return "PYTHONPATH=" + p
}

// trainPreemptResume runs train.py under stasis run --mode app, preempts it
// mid-run, and checks the requeue: exit 75, one new checkpoint, and a
// second run that resumes at the saved step with the same weights and
// trains to the end.
func trainPreemptResume(t *testing.T, saver string) {
	py := pythonWithNumPy(t)
	home, tmp := t.TempDir(), t.TempDir()
	out, hookOut := filepath.Join(tmp, "steps"), t.TempDir()
	t.Setenv("HOOK_OUT", hookOut)
	t.Setenv("PYTHONPATH", strings.TrimPrefix(pythonPath(t), "PYTHONPATH="))
	hook := hookstest.Script(t, "hook_env.sh")
	const total = 60
	args := []string{"--job", "train", "--mode", "app", "--grace", "60s", "--post-checkpoint", hook, "--", py, "testdata/train.py", out, strconv.Itoa(total), saver}

	first := startRun(t, home, args...)
	waitCounting(t, out, 5)
	first.signal(t, syscall.SIGUSR1)
	res := first.wait(t)
	expectExit(t, res, cli.ExitPreempted)
	recs := list(t, home, "--job", "train")
	if len(recs) != 1 {
		t.Fatalf("after the preemption: %+v", recs)
	}
	saved := recs[0]
	done := counts(t, out)
	if int64(len(done)) != saved.Step {
		t.Fatalf("the checkpoint is of step %d, but the job had done %d steps", saved.Step, len(done))
	}
	if !strings.Contains(res.stderr, "checkpointed as "+saved.ID) {
		t.Errorf("stasis run does not name the checkpoint: %s", res.stderr)
	}
	env := hookstest.ReadEnv(t, filepath.Join(hookOut, "post_checkpoint.env"))
	if env["STASIS_CHECKPOINT_ID"] != saved.ID || env["STASIS_KIND"] != "app" || env["STASIS_JOB"] != "train" || env["STASIS_STEP"] != strconv.FormatInt(saved.Step, 10) {
		t.Errorf("the post_checkpoint hook saw %v", env)
	}

	second := startRun(t, home, args...)
	res = second.wait(t)
	expectExit(t, res, 0)
	if want := fmt.Sprintf("train.py: resumed at step %d; the weights match", saved.Step); !strings.Contains(res.stdout, want) {
		t.Fatalf("the second run did not resume at step %d:\n%s%s", saved.Step, res.stdout, res.stderr)
	}
	all := counts(t, out)
	for i, n := range all {
		if n != i {
			t.Fatalf("step %d of the two runs is %d: the resumed run did not go on from the checkpoint (%v)", i, n, all)
		}
	}
	if len(all) != total {
		t.Fatalf("%d steps done, want %d", len(all), total)
	}
}

// TestRunAppModeSavedThroughTheCLI: the training loop saves and loads with
// `stasis save` and `stasis load`.
func TestRunAppModeSavedThroughTheCLI(t *testing.T) {
	trainPreemptResume(t, "cli")
}

// TestRunAppModeSavedThroughThePythonPackage: the same with the stasis
// Python package's save and load (over bin/libstasis.so, which `make`
// builds).
func TestRunAppModeSavedThroughThePythonPackage(t *testing.T) {
	py := pythonWithNumPy(t)
	check := exec.Command(py, "-c", "import stasis; stasis.library_path()")
	check.Env = append(os.Environ(), pythonPath(t))
	if out, err := check.CombinedOutput(); err != nil {
		t.Skipf("the stasis Python package cannot load its library: %s", lastLine(string(out)))
	}
	trainPreemptResume(t, "package")
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// readPIDs reads the "PID CHILD" line ignore_notice.sh writes.
func readPIDs(t *testing.T, path string) (int, int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		var job, child int
		if _, err := fmt.Sscan(string(data), &job, &child); err == nil {
			return job, child
		}
	}
	t.Fatalf("%s: no PIDs", path)
	return 0, 0
}

// TestRunJobIgnoringTheNotice: the job neither saves nor exits; once the
// grace is over stasis run stops its whole tree (SIGTERM is ignored, so
// SIGKILL) and exits 124, with nothing listed. A second preemption signal
// in the meantime changes nothing, and SIGTERM is held, not forwarded.
func TestRunJobIgnoringTheNotice(t *testing.T) {
	home, pids := t.TempDir(), filepath.Join(t.TempDir(), "pids")
	r := startRun(t, home, "--job", "deaf", "--grace", "3s", "--kill-after", "500ms", "--", "testdata/ignore_notice.sh", pids)
	job, child := readPIDs(t, pids)
	r.signal(t, syscall.SIGUSR1)
	waitJobState(t, home, "deaf", func(st jobState) bool { return st.State == "checkpointing" })
	r.signal(t, syscall.SIGUSR1)
	r.signal(t, syscall.SIGTERM)
	res := r.wait(t)
	expectExit(t, res, cli.ExitNoCheckpoint)
	for _, want := range []string{`SIGUSR1 during the checkpoint under way: ignored`, `SIGTERM held until the checkpoint ends`,
		`stasis: job "deaf" was preempted and has no new checkpoint: no checkpoint within the grace period \(3s\)`} {
		if !regexp.MustCompile(want).MatchString(res.stderr) {
			t.Errorf("stderr does not say %q:\n%s", want, res.stderr)
		}
	}
	for _, pid := range []int{job, child} {
		if alive(pid) {
			t.Errorf("PID %d of the job's tree outlived stasis run", pid)
		}
	}
	if recs := list(t, home); len(recs) != 0 {
		t.Fatalf("listed: %+v", recs)
	}
}

// TestRunKilledTakesItsJobAlong: stasis run killed with SIGKILL leaves
// nothing of its job running unsupervised (the root dies of
// PR_SET_PDEATHSIG, its child, which ignores SIGTERM, of the guard), and
// the next run of the job can start.
func TestRunKilledTakesItsJobAlong(t *testing.T) {
	home, pids := t.TempDir(), filepath.Join(t.TempDir(), "pids")
	r := startRun(t, home, "--job", "orphan", "--", "testdata/ignore_notice.sh", pids)
	job, child := readPIDs(t, pids)
	waitJobState(t, home, "orphan", jobRunning)
	r.cmd.Process.Kill()
	r.wait(t)
	waitGone(t, job)
	waitGone(t, child)
	mustRun(t, home, "run", "--job", "orphan", "--", "true")
}

func TestPreStopWithoutAJob(t *testing.T) {
	expectCode(t, run(t, t.TempDir(), "hook", "prestop", "--job", "none"), cli.ExitNotFound, `no stasis run of job "none" is running in this store .*give --pid`)
}

// TestPreStopTimesOut: prestop against a stasis run whose job ignores the
// notice gives up after --timeout with 124; stasis run goes on to stop the
// job at the end of its own grace.
func TestPreStopTimesOut(t *testing.T) {
	home, pids := t.TempDir(), filepath.Join(t.TempDir(), "pids")
	r := startRun(t, home, "--job", "deaf", "--grace", "30s", "--kill-after", "100ms", "--", "testdata/ignore_notice.sh", pids)
	waitJobState(t, home, "deaf", jobRunning)
	expectCode(t, run(t, home, "hook", "prestop", "--job", "deaf", "--timeout", "500ms"), cli.ExitNoCheckpoint, `job "deaf" has no new checkpoint after 500ms`)
	if st := waitJobState(t, home, "deaf", func(jobState) bool { return true }); st.State != "checkpointing" {
		t.Fatalf("prestop did not start the checkpoint: %+v", st)
	}
	r.cmd.Process.Kill()
	r.wait(t)
}

// TestPreCheckpointHookFailureLeavesTheJobAlone: `stasis checkpoint` with a
// failing pre_checkpoint hook stops before anything is frozen: exit 12,
// the hook, its status and its stderr on one line, the job running,
// nothing listed.
func TestPreCheckpointHookFailureLeavesTheJobAlone(t *testing.T) {
	home, out := t.TempDir(), filepath.Join(t.TempDir(), "count")
	pid := startDetached(t, "testdata/counter.sh", out)
	waitCounting(t, out, 3)
	hook := hookstest.Script(t, "hook_fail.sh")
	r := run(t, home, "checkpoint", "--pid", strconv.Itoa(pid), "--pre-checkpoint", hook)
	expectCode(t, r, cli.ExitHookFailed, `^stasis: no checkpoint taken, the job runs on: pre_checkpoint hook `+regexp.QuoteMeta(hook)+` exited with status 3: checking the job's data cannot quiesce the job: the data loader is busy\n$`)
	waitCounting(t, out, len(counts(t, out))+5)
	if recs := list(t, home); len(recs) != 0 {
		t.Fatalf("listed: %+v", recs)
	}
	if staged := entriesIn(t, filepath.Join(home, "staging")); len(staged) != 0 {
		t.Fatalf("staging holds %v", staged)
	}
}

// TestRunWithFailingPreCheckpointHookFromConfig: the hook named in
// config.toml fails at the preemption; the job runs on, nothing is listed,
// and once the grace is over the job is stopped and stasis run exits 124.
func TestRunWithFailingPreCheckpointHookFromConfig(t *testing.T) {
	home, out := t.TempDir(), filepath.Join(t.TempDir(), "count")
	hook := hookstest.Script(t, "hook_fail.sh")
	config := fmt.Sprintf("[hooks]\npre_checkpoint = %q\n\n[run]\nmode = \"process\"\ngrace = \"5s\"\nkill_after = \"1s\"\n", hook)
	if err := os.WriteFile(filepath.Join(home, "config.toml"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	r := startRun(t, home, "--job", "hooked", "--", "testdata/counter.sh", out)
	st := waitJobState(t, home, "hooked", jobRunning)
	r.signal(t, syscall.SIGUSR1)
	failed := waitJobState(t, home, "hooked", func(st jobState) bool { return st.State == "failed" })
	if !strings.Contains(failed.Error, "pre_checkpoint hook "+hook+" exited with status 3") {
		t.Errorf("the run's state says: %q", failed.Error)
	}
	waitCounting(t, out, len(counts(t, out))+5)
	if recs := list(t, home); len(recs) != 0 {
		t.Fatalf("listed: %+v", recs)
	}
	res := r.wait(t)
	expectExit(t, res, cli.ExitNoCheckpoint)
	if !strings.Contains(res.stderr, "checkpoint failed, the job runs on: no checkpoint taken, the job runs on: pre_checkpoint hook") {
		t.Errorf("stderr: %s", res.stderr)
	}
	if alive(st.JobPID) {
		t.Fatal("the job outlived stasis run")
	}
}

// TestRunProcessModePreemptRestoreAndExitStatus: preempted, the job's tree
// is checkpointed with CRIU and stasis run exits 75; the next run restores
// it as its own child, relays its output, and passes on its exit status
// when it ends by itself.
func TestRunProcessModePreemptRestoreAndExitStatus(t *testing.T) {
	requireCRIU(t)
	home, out := t.TempDir(), filepath.Join(t.TempDir(), "count")
	args := []string{"--job", "counter", "--mode", "process", "--", "testdata/count_to.sh", out, "150"}
	st, res := preemptCounter(t, home, "counter", out, args)
	atDump := len(counts(t, out))
	recs := list(t, home)
	if len(recs) != 1 || recs[0].Kind != "process" || recs[0].Job != "counter" {
		t.Fatalf("after the preemption: %+v", recs)
	}
	if alive(st.JobPID) {
		t.Fatal("the job runs on after its checkpoint")
	}
	if !strings.Contains(res.stdout, fmt.Sprintf("count %d\n", atDump)) {
		t.Errorf("the job's output before the dump was not relayed: %q", lastLine(res.stdout))
	}

	second := startRun(t, home, args...)
	restored := waitJobState(t, home, "counter", jobRunning)
	// The job gets its PID back: here, or, when another process took it
	// during the restore (PIDs wrap quickly on a busy machine), inside the
	// new PID namespace stasis run then restores it into (--new-pidns
	// auto), where it is the innermost of its PIDs.
	if restored.JobPID != st.JobPID {
		if ids := nsPIDs(t, restored.JobPID); len(ids) < 2 || ids[len(ids)-1] != st.JobPID {
			t.Errorf("restored as PID %d (NSpid %v), was %d", restored.JobPID, ids, st.JobPID)
		}
	}
	res = second.wait(t)
	expectExit(t, res, 7) // count_to.sh's own status, collected from the restored job
	consecutive(t, counts(t, out))
	if n := len(counts(t, out)); n != 150 {
		t.Fatalf("the restored job stopped at %d", n)
	}
	if !strings.Contains(res.stdout, "count 150\n") {
		t.Errorf("the restored job's output was not relayed: %q", lastLine(res.stdout))
	}
	if !strings.Contains(res.stderr, "restored job \"counter\" (PID") {
		t.Errorf("stderr: %s", res.stderr)
	}
}

// preemptCounter runs `stasis run args` for job, whose counter appends to
// out, until the counter has counted 10 more, then preempts it (exit 75).
// It returns the job's state while it ran and how stasis run ended.
func preemptCounter(t *testing.T, home, job, out string, args []string) (jobState, result) {
	t.Helper()
	before := 0
	if _, err := os.Stat(out); err == nil {
		before = len(counts(t, out))
	}
	r := startRun(t, home, args...)
	st := waitJobState(t, home, job, jobRunning)
	waitCounting(t, out, before+10)
	r.signal(t, syscall.SIGUSR1)
	res := r.wait(t)
	expectExit(t, res, cli.ExitPreempted)
	return st, res
}

// TestRunSecondSignalDuringProcessCheckpoint: a second preemption signal
// while CRIU dumps the job starts no second checkpoint, and SIGTERM is held
// out of the dump: one checkpoint, which restores a job that runs.
func TestRunSecondSignalDuringProcessCheckpoint(t *testing.T) {
	requireCRIU(t)
	requirePython(t)
	home, out := t.TempDir(), filepath.Join(t.TempDir(), "count")
	args := []string{"--job", "big", "--mode", "process", "--", "python3", "testdata/memory.py", out, "256"}
	r := startRun(t, home, args...)
	st := waitJobState(t, home, "big", jobRunning)
	waitCounting(t, out, 3)
	r.signal(t, syscall.SIGUSR1)
	waitSeized(t, st.JobPID)
	r.signal(t, syscall.SIGUSR1)
	r.signal(t, syscall.SIGTERM)
	res := r.wait(t)
	expectExit(t, res, cli.ExitPreempted)
	if !strings.Contains(res.stderr, "SIGUSR1 during the checkpoint under way: ignored") || !strings.Contains(res.stderr, "SIGTERM held until the checkpoint ends") {
		t.Errorf("stderr: %s", res.stderr)
	}
	if recs := list(t, home); len(recs) != 1 {
		t.Fatalf("listed: %+v", recs)
	}
	again := startRun(t, home, args...)
	waitJobState(t, home, "big", jobRunning)
	// Had SIGTERM gone into the dump, the restored job would die of it.
	waitCounting(t, out, len(counts(t, out))+10)
	again.signal(t, syscall.SIGTERM)
	expectExit(t, again.wait(t), 128+int(syscall.SIGTERM))
}

// TestRunKilledDuringProcessCheckpoint: stasis run killed with SIGKILL while
// CRIU dumps its job: the job dies with it, and the store holds either a
// complete checkpoint or, after gc, nothing.
func TestRunKilledDuringProcessCheckpoint(t *testing.T) {
	requireCRIU(t)
	requirePython(t)
	home, out := t.TempDir(), filepath.Join(t.TempDir(), "count")
	r := startRun(t, home, "--job", "big", "--mode", "process", "--", "python3", "testdata/memory.py", out, "256")
	st := waitJobState(t, home, "big", jobRunning)
	waitCounting(t, out, 3)
	r.signal(t, syscall.SIGUSR1)
	waitSeized(t, st.JobPID)
	r.cmd.Process.Kill()
	r.wait(t)
	waitGone(t, st.JobPID)
	mustRun(t, home, "gc")
	if staged := entriesIn(t, filepath.Join(home, "staging")); len(staged) != 0 {
		t.Fatalf("gc left %v", staged)
	}
	switch recs := list(t, home); len(recs) {
	case 0:
		t.Log("killed before the commit: no checkpoint")
	case 1:
		mustRun(t, home, "verify", recs[0].ID)
		t.Log("killed after the commit: the checkpoint is complete")
	default:
		t.Fatalf("listed: %+v", recs)
	}
}

// TestRunAppFallsBackToProcessCheckpoint: with --fallback process, a job
// that ignores the notice is checkpointed with CRIU instead; the next run
// restores it.
func TestRunAppFallsBackToProcessCheckpoint(t *testing.T) {
	requireCRIU(t)
	home, out := t.TempDir(), filepath.Join(t.TempDir(), "count")
	args := []string{"--job", "legacy", "--fallback", "process", "--fallback-after", "300ms", "--", "testdata/counter.sh", out}
	r := startRun(t, home, args...)
	waitJobState(t, home, "legacy", jobRunning)
	waitCounting(t, out, 5)
	r.signal(t, syscall.SIGUSR1)
	res := r.wait(t)
	expectExit(t, res, cli.ExitPreempted)
	if !strings.Contains(res.stderr, "the job has not taken up the notice after 300ms: process checkpoint instead") {
		t.Errorf("stderr: %s", res.stderr)
	}
	recs := list(t, home)
	if len(recs) != 1 || recs[0].Kind != "process" {
		t.Fatalf("listed: %+v", recs)
	}
	atDump := len(counts(t, out))
	again := startRun(t, home, args...)
	waitJobState(t, home, "legacy", jobRunning)
	consecutive(t, waitCounting(t, out, atDump+10))
	again.signal(t, syscall.SIGTERM)
	expectExit(t, again.wait(t), 128+int(syscall.SIGTERM))
}

// TestPreStopAgainstStasisRun: prestop has the job's stasis run checkpoint
// it and returns once the checkpoint is committed; stasis run exits 75.
func TestPreStopAgainstStasisRun(t *testing.T) {
	requireCRIU(t)
	home, out := t.TempDir(), filepath.Join(t.TempDir(), "count")
	r := startRun(t, home, "--job", "pod", "--mode", "process", "--signal", "TERM,USR1", "--", "testdata/counter.sh", out)
	waitJobState(t, home, "pod", jobRunning)
	waitCounting(t, out, 5)
	p := mustRun(t, home, "hook", "prestop", "--job", "pod", "--timeout", "60s")
	id := lastLine(p.stdout)
	expectExit(t, r.wait(t), cli.ExitPreempted)
	recs := list(t, home)
	if len(recs) != 1 || recs[0].ID != id {
		t.Fatalf("prestop printed %s; listed: %+v", id, recs)
	}
	// The run has released the job: a prestop now finds none.
	expectCode(t, run(t, home, "hook", "prestop", "--job", "pod"), cli.ExitNotFound, `no stasis run of job "pod"`)
}

// counterWithEnvHook is a detached counter.sh, with hook_env.sh set to
// record its variables in hookOut.
type counterWithEnvHook struct {
	home, out, hookOut, hook string
	pid                      int
}

func startCounterWithEnvHook(t *testing.T) counterWithEnvHook {
	t.Helper()
	c := counterWithEnvHook{home: t.TempDir(), out: filepath.Join(t.TempDir(), "count"), hookOut: t.TempDir(), hook: hookstest.Script(t, "hook_env.sh")}
	t.Setenv("HOOK_OUT", c.hookOut)
	c.pid = startDetached(t, "testdata/counter.sh", c.out)
	waitCounting(t, c.out, 3)
	return c
}

// TestPreStopBarePID: a process not run by stasis run is checkpointed in
// process mode, ends with the dump, and its hooks see it.
func TestPreStopBarePID(t *testing.T) {
	requireCRIU(t)
	c := startCounterWithEnvHook(t)
	home, out, hookOut, hook, pid := c.home, c.out, c.hookOut, c.hook, c.pid
	pidFile := filepath.Join(t.TempDir(), "job.pid")
	os.WriteFile(pidFile, []byte(strconv.Itoa(pid)+"\n"), 0o600)
	p := mustRun(t, home, "hook", "prestop", "--job", "bare", "--pid-file", pidFile, "--pre-checkpoint", hook, "--post-checkpoint", hook)
	id := lastLine(p.stdout)
	waitGone(t, pid)
	recs := list(t, home)
	if len(recs) != 1 || recs[0].ID != id || recs[0].Kind != "process" || recs[0].Job != "bare" {
		t.Fatalf("prestop printed %s; listed: %+v", id, recs)
	}
	pre, post := hookstest.ReadEnv(t, filepath.Join(hookOut, "pre_checkpoint.env")), hookstest.ReadEnv(t, filepath.Join(hookOut, "post_checkpoint.env"))
	if pre["STASIS_PID"] != strconv.Itoa(pid) || pre["STASIS_JOB"] != "bare" || post["STASIS_CHECKPOINT_ID"] != id {
		t.Fatalf("hooks saw pre %v, post %v", pre, post)
	}
	restorePID(t, home, id)
	waitCounting(t, out, len(counts(t, out))+5)
}

// TestHooksOfCheckpointAndRestoreSeeTheirEnvironment: post_checkpoint and
// post_restore hooks, named by flags, see the checkpoint's ID, job, step,
// the PID and the kind.
func TestHooksOfCheckpointAndRestoreSeeTheirEnvironment(t *testing.T) {
	requireCRIU(t)
	c := startCounterWithEnvHook(t)
	home, hookOut, hook, pid := c.home, c.hookOut, c.hook, c.pid
	id := checkpointPID(t, home, pid, "--job", "env", "--step", "41", "--post-checkpoint", hook)
	waitGone(t, pid)
	restored := restorePID(t, home, id, "--post-restore", hook)
	for hook, want := range map[string]map[string]string{
		"post_checkpoint": {"STASIS_HOOK": "post_checkpoint", "STASIS_CHECKPOINT_ID": id, "STASIS_JOB": "env", "STASIS_STEP": "41", "STASIS_PID": strconv.Itoa(pid), "STASIS_KIND": "process", "STASIS_HOME": home},
		"post_restore":    {"STASIS_HOOK": "post_restore", "STASIS_CHECKPOINT_ID": id, "STASIS_JOB": "env", "STASIS_STEP": "41", "STASIS_PID": strconv.Itoa(restored), "STASIS_KIND": "process", "STASIS_HOME": home},
	} {
		got := hookstest.ReadEnv(t, filepath.Join(hookOut, hook+".env"))
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s hook: %s=%q, want %q", hook, k, got[k], v)
			}
		}
	}
}

// TestRunPreemptedWhileRestoring: the preemption signal comes while the
// job is being restored (its post_restore hook sends it, after leaving 40
// short-lived orphans to stasis run, a SIGCHLD each, and ends 3s later);
// it is not lost among the SIGCHLDs: once the job runs it is checkpointed
// again, with the grace counted from the signal's arrival, not from the
// end of the hook.
func TestRunPreemptedWhileRestoring(t *testing.T) {
	requireCRIU(t)
	home, out, hookOut := t.TempDir(), filepath.Join(t.TempDir(), "count"), t.TempDir()
	t.Setenv("HOOK_OUT", hookOut)
	args := []string{"--job", "busy", "--mode", "process", "--grace", "60s", "--", "testdata/counter.sh", out}
	preemptCounter(t, home, "busy", out, args)
	hook, err := filepath.Abs("testdata/busy_post_restore.sh")
	if err != nil {
		t.Fatal(err)
	}
	r := startRun(t, home, append([]string{"--post-restore", hook}, args...)...)
	res := r.wait(t)
	expectExit(t, res, cli.ExitPreempted)
	if recs := list(t, home); len(recs) != 2 {
		t.Fatalf("listed: %+v", recs)
	}
	m := regexp.MustCompile(`SIGUSR1: checkpointing job "busy" \(process mode, grace until (\S+)\)`).FindStringSubmatch(res.stderr)
	if m == nil {
		t.Fatalf("stderr does not say the job was checkpointed:\n%s", res.stderr)
	}
	deadline, err := time.Parse(time.RFC3339, m[1])
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(hookOut, "sent"))
	if err != nil {
		t.Fatal(err)
	}
	sent, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	// Counted from the end of the hook (3s after the signal), the
	// deadline would be at least sent+62.
	if got, most := deadline.Unix(), sent+61; got > most {
		t.Errorf("grace until %s (%d), counted from later than the signal's arrival (sent at %d)", m[1], got, sent)
	}
}

// TestRunFallbackYieldsToALateAcknowledgement: the job takes up the notice
// only while the fallback's pre_checkpoint hook runs; it is not frozen, and
// its own save is the checkpoint.
func TestRunFallbackYieldsToALateAcknowledgement(t *testing.T) {
	home, hookOut := t.TempDir(), t.TempDir()
	t.Setenv("HOOK_OUT", hookOut)
	hook, err := filepath.Abs("testdata/fallback_pre_hook.sh")
	if err != nil {
		t.Fatal(err)
	}
	r := startRun(t, home, "--job", "late", "--grace", "60s", "--fallback", "process", "--fallback-after", "300ms", "--pre-checkpoint", hook, "--", "testdata/late_ack.sh")
	waitJobState(t, home, "late", jobRunning)
	r.signal(t, syscall.SIGUSR1)
	res := r.wait(t)
	expectExit(t, res, cli.ExitPreempted)
	recs := list(t, home)
	if len(recs) != 1 || recs[0].Kind != "files" || recs[0].Step != 7 {
		t.Fatalf("listed: %+v", recs)
	}
	if !strings.Contains(res.stderr, "the job took up the notice before its process checkpoint: waiting for its own checkpoint instead") {
		t.Errorf("stderr: %s", res.stderr)
	}
}

// TestRunAppModeIgnoresACheckpointCreatedBeforeTheNotice: a checkpoint of
// the job that appears after the notice but was created before it (here
// imported) is not the job's answer: no checkpoint within the grace, 124.
func TestRunAppModeIgnoresACheckpointCreatedBeforeTheNotice(t *testing.T) {
	old, home, tmp := t.TempDir(), t.TempDir(), t.TempDir()
	data, export := filepath.Join(tmp, "data"), filepath.Join(tmp, "old.tar")
	if err := os.WriteFile(data, []byte("weights\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun(t, old, "save", "--job", "stale", "--step", "3", data)
	mustRun(t, old, "export", "--job", "stale", "--latest", "-o", export)
	r := startRun(t, home, "--job", "stale", "--grace", "3s", "--kill-after", "200ms", "--", "testdata/import_on_notice.sh", export)
	waitJobState(t, home, "stale", jobRunning)
	r.signal(t, syscall.SIGUSR1)
	res := r.wait(t)
	expectExit(t, res, cli.ExitNoCheckpoint)
	if recs := list(t, home); len(recs) != 1 || recs[0].Step != 3 {
		t.Fatalf("the job did not import its old checkpoint: %+v", recs)
	}
	if strings.Contains(res.stderr, "committed") {
		t.Fatalf("stasis run took the old checkpoint for the job's answer:\n%s", res.stderr)
	}
}

// TestPreStopWithTheRunsJobPIDGoesThroughTheRun: `hook prestop --pid P`,
// where P is the job of J's running stasis run (its root, or a process of
// its tree), has the run checkpoint it, as without --pid, rather than
// checkpoint P behind the run's back.
func TestPreStopWithTheRunsJobPIDGoesThroughTheRun(t *testing.T) {
	home, pids := t.TempDir(), filepath.Join(t.TempDir(), "pids")
	r := startRun(t, home, "--job", "deaf", "--grace", "30s", "--kill-after", "100ms", "--", "testdata/ignore_notice.sh", pids)
	job, child := readPIDs(t, pids)
	waitJobState(t, home, "deaf", jobRunning)
	for _, pid := range []int{job, child} {
		expectCode(t, run(t, home, "hook", "prestop", "--job", "deaf", "--pid", strconv.Itoa(pid), "--timeout", "300ms"), cli.ExitNoCheckpoint, `job "deaf" has no new checkpoint after 300ms`)
	}
	if st := waitJobState(t, home, "deaf", func(jobState) bool { return true }); st.State != "checkpointing" {
		t.Fatalf("prestop did not have the run checkpoint the job: %+v", st)
	}
	if !alive(job) || !alive(child) {
		t.Fatal("the job was checkpointed behind its run's back")
	}
	r.cmd.Process.Kill()
	r.wait(t)
}

// TestRunKeepsInheritedFilesFromTheJob: a file stasis run inherited (fd 3
// here) is not open in the job.
func TestRunKeepsInheritedFilesFromTheJob(t *testing.T) {
	home := t.TempDir()
	marker, err := os.Create(filepath.Join(t.TempDir(), "inherited-marker"))
	if err != nil {
		t.Fatal(err)
	}
	defer marker.Close()
	cmd := exec.Command(stasisBin, "run", "--job", "fds", "--", "sh", "-c", "ls -l /proc/$$/fd/")
	cmd.ExtraFiles = []*os.File{marker}
	res := startCommand(t, home, cmd).wait(t)
	expectExit(t, res, 0)
	if !strings.Contains(res.stdout, "->") {
		t.Fatalf("the job listed no files: %q", res.stdout)
	}
	if strings.Contains(res.stdout, "inherited-marker") {
		t.Fatalf("the job has stasis run's inherited file open:\n%s", res.stdout)
	}
}
