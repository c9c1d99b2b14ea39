package cli_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/cli"
	"github.com/stasis-ckpt/stasis/criu"
)

// The tests in this file run real CRIU on real process trees. They need
// root and a CRIU >= 4.0 (`make` builds one into bin/criu); without them
// they skip and say why.

// requirePython skips a test whose job is a Python script where there is
// no python3.
func requirePython(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed")
	}
}

func requireCRIU(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("CRIU needs root")
	}
	if os.Getenv("STASIS_CRIU") == "" {
		if abs, err := filepath.Abs("../bin/criu"); err == nil {
			if _, err := os.Stat(abs); err == nil {
				t.Setenv("STASIS_CRIU", abs)
			}
		}
	}
	if _, _, err := criu.Resolve(""); err != nil {
		t.Skipf("no usable CRIU (run make): %v", err)
	}
}

// startDetached starts a command in its own session, orphaned so that init
// is its parent, as a job started by a scheduler would be; returns its PID.
func startDetached(t *testing.T, args ...string) int {
	t.Helper()
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	out, err := exec.Command("sh", "-c", "setsid "+strings.Join(quoted, " ")+" </dev/null >/dev/null 2>&1 & echo $!").Output()
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { killTree(pid) })
	return pid
}

func killTree(pid int) {
	syscall.Kill(-pid, syscall.SIGKILL) // its session's process group
	syscall.Kill(pid, syscall.SIGKILL)
}

// alive reports whether pid runs (not a zombie, not gone).
func alive(pid int) bool {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return false
	}
	return !strings.Contains(string(status), "State:\tZ")
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if !alive(pid) {
			return
		}
	}
	t.Fatalf("PID %d is still running", pid)
}

// counts reads the numbers a counter appended to out.
func counts(t *testing.T, out string) []int {
	t.Helper()
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var ns []int
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if n, err := strconv.Atoi(line); err == nil {
			ns = append(ns, n)
		}
	}
	return ns
}

// waitCounting waits until out holds more than n numbers.
func waitCounting(t *testing.T, out string, n int) []int {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(out); err == nil {
			if ns := counts(t, out); len(ns) > n {
				return ns
			}
		}
	}
	t.Fatalf("%s stopped growing at %d numbers", out, n)
	return nil
}

// consecutive fails unless ns is 1, 2, 3, ... with no gap or repeat: what a
// counter frozen, dumped and restored exactly must leave.
func consecutive(t *testing.T, ns []int) {
	t.Helper()
	for i, n := range ns {
		if n != i+1 {
			t.Fatalf("count %d is %d: the restored job did not go on from where it stopped (%v ...)", i+1, n, ns[max(0, i-3):min(len(ns), i+3)])
		}
	}
}

func checkpointPID(t *testing.T, home string, pid int, args ...string) string {
	t.Helper()
	r := mustRun(t, home, append([]string{"checkpoint", "--pid", strconv.Itoa(pid)}, args...)...)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	id := lines[len(lines)-1]
	if !uuidLine.MatchString(id) {
		t.Fatalf("checkpoint printed %q last, not an ID", id)
	}
	return id
}

func restorePID(t *testing.T, home string, args ...string) int {
	t.Helper()
	return restoredPID(t, mustRun(t, home, append([]string{"restore"}, args...)...))
}

// restoredPID reads the PID a restore printed last, and ends that process
// when the test ends.
func restoredPID(t *testing.T, r result) int {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	pid, err := strconv.Atoi(lines[len(lines)-1])
	if err != nil {
		t.Fatalf("restore printed %q last, not a PID", lines[len(lines)-1])
	}
	t.Cleanup(func() { killTree(pid) })
	return pid
}

// checkpointedCounter starts testdata/counter.sh, checkpoints it into home
// with args (the job ends), and returns its PID, the checkpoint's ID, the
// counter's file and how many numbers it held at the checkpoint.
func checkpointedCounter(t *testing.T, home string, args ...string) (pid int, id, out string, atDump int) {
	t.Helper()
	out = filepath.Join(t.TempDir(), "count")
	pid = startDetached(t, "testdata/counter.sh", out)
	waitCounting(t, out, 5)
	id = checkpointPID(t, home, pid, args...)
	waitGone(t, pid)
	return pid, id, out, len(counts(t, out))
}

func TestCheckpointRestoreCounter(t *testing.T) {
	requireCRIU(t)
	home := t.TempDir()
	pid, id, out, atDump := checkpointedCounter(t, home, "--job", "counter", "--step", "7")
	if recs := list(t, home); len(recs) != 1 || recs[0].ID != id || recs[0].Kind != "process" || recs[0].Step != 7 {
		t.Fatalf("ls after checkpoint: %+v", recs)
	}
	mustRun(t, home, "verify", id)

	restored := restorePID(t, home, "--job", "counter", "--latest")
	if restored != pid {
		t.Errorf("restored as PID %d, was %d", restored, pid)
	}
	ns := waitCounting(t, out, atDump+10)
	consecutive(t, ns)
}

func TestCheckpointRestorePipelineTree(t *testing.T) {
	requireCRIU(t)
	home, tmp := t.TempDir(), t.TempDir()
	out := filepath.Join(tmp, "count")
	pid := startDetached(t, "testdata/pipeline.sh", out)
	waitCounting(t, out, 5)
	var show struct {
		Meta struct {
			Processes []struct {
				PID  int    `json:"pid"`
				Comm string `json:"comm"`
			} `json:"processes"`
		} `json:"meta"`
	}
	id := checkpointPID(t, home, pid, "--compress", "zstd")
	waitGone(t, pid)
	atDump := len(counts(t, out))
	r := mustRun(t, home, "show", "--json", id)
	if err := jsonUnmarshal(r.stdout, &show); err != nil {
		t.Fatal(err)
	}
	if len(show.Meta.Processes) < 3 {
		t.Fatalf("the tree has %d processes in the checkpoint, want 3 or more", len(show.Meta.Processes))
	}
	restorePID(t, home, id)
	ns := waitCounting(t, out, atDump+10)
	consecutive(t, ns) // the pipe's contents and the open file came back
	for _, p := range show.Meta.Processes {
		// A `sleep 0.02` caught in the checkpoint ends right after the
		// restore, as it would have without one; the shells must run on.
		if p.Comm != "sleep" && !alive(p.PID) {
			t.Errorf("process %d of the tree is not running after the restore", p.PID)
		}
	}
}

func TestCheckpointLeaveRunningAndPIDTaken(t *testing.T) {
	requireCRIU(t)
	home, tmp := t.TempDir(), t.TempDir()
	out := filepath.Join(tmp, "count")
	pid := startDetached(t, "testdata/counter.sh", out)
	waitCounting(t, out, 5)
	id := checkpointPID(t, home, pid, "--leave-running")
	before := len(counts(t, out))
	ns := waitCounting(t, out, before+5)
	if !alive(pid) {
		t.Fatal("--leave-running: the process is gone")
	}
	consecutive(t, ns)

	// The original still holds the PID: a plain message, the PID-in-use
	// exit code, and the job untouched.
	r := run(t, home, "restore", "--pid-wait", "200ms", id)
	expectCode(t, r, cli.ExitPIDInUse, fmt.Sprintf(`PID %d is held by .*--pid-wait`, pid))
	if !alive(pid) {
		t.Fatal("a refused restore harmed the running process")
	}

	killTree(pid)
	waitGone(t, pid)
	if restored := restorePID(t, home, id); restored != pid {
		t.Errorf("restored as PID %d, was %d", restored, pid)
	}
	waitCounting(t, out, len(counts(t, out))+5)
}

// TestRestoreRefusesCorruptImages flips one byte of a checkpoint in turn
// inside a memory image (pages-N.img) and inside a small image, and
// restores with the memory filled in by stasis (the default), streamed to
// CRIU, and with --verify-first. A small image is refused before CRIU
// runs; a memory image is refused before CRIU runs with --verify-first,
// filled, the write into the rebuilt tree stops at the bad chunk and CRIU
// undoes the restore, and streamed, CRIU stops where the bad chunk begins
// and undoes the restore.
// Every time the error names the chunk, the tree does not run, and the
// checkpoint, mended, restores after all.
func TestRestoreRefusesCorruptImages(t *testing.T) {
	requireCRIU(t)
	requirePython(t)
	// 32 MiB of memory: its image spans several chunks, so that one of
	// them holds nothing but memory.
	home := t.TempDir()
	out := filepath.Join(t.TempDir(), "count")
	pid := startDetached(t, "python3", "testdata/memory.py", out, "32")
	waitCounting(t, out, 3)
	id := checkpointPID(t, home, pid)
	waitGone(t, pid)
	atDump := len(counts(t, out))
	s, err := catalog.Open(home, catalog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.ReadManifest(id)
	if err != nil {
		t.Fatal(err)
	}
	// chunkOf finds the data file chunk holding the middle of the first
	// entry that match accepts, and where that chunk lies in its file
	// (the memory copied early has a data file of its own).
	chunkOf := func(match func(name string) bool) (file string, index int, fileOffset int64) {
		for _, e := range m.Entries {
			if e.Type == catalog.EntryFile && e.Size > 0 && match(e.Path) {
				df := m.Files[e.File]
				i := int((e.Offset + e.Size/2) / df.ChunkSize)
				return df.Name, i, df.Chunks[i].Offset + df.Chunks[i].Stored/2
			}
		}
		t.Fatal("no such image in the checkpoint")
		return "", 0, 0
	}
	isPages := func(n string) bool { return strings.HasPrefix(n, "pages-") }
	isCore := func(n string) bool { return strings.HasPrefix(n, "core-") }
	for _, c := range []struct {
		name      string
		image     func(string) bool
		args      []string
		criuRan   bool
		errSuffix string
	}{
		{"memory image, filled", isPages, nil, true, `CRIU undid the restore; nothing of the tree runs`},
		{"memory image, filled, new PID namespace", isPages, []string{"--new-pidns"}, true, `CRIU undid the restore; nothing of the tree runs`},
		{"memory image, streamed", isPages, []string{"--pages", "stream"}, true, `CRIU stopped the restore there; nothing of the tree runs`},
		{"memory image, --verify-first", isPages, []string{"--verify-first"}, false, ``},
		{"small image", isCore, nil, false, ``},
	} {
		t.Run(c.name, func(t *testing.T) {
			logs, _ := filepath.Glob(filepath.Join(home, "logs", "*restore.log"))
			name, index, off := chunkOf(c.image)
			data := filepath.Join(home, "checkpoints", id, name)
			good, err := os.ReadFile(data)
			if err != nil {
				t.Fatal(err)
			}
			bad := bytes.Clone(good)
			bad[off] ^= 0x01
			if err := os.WriteFile(data, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			defer os.WriteFile(data, good, 0o600)
			r := run(t, home, append([]string{"restore", id}, c.args...)...)
			expectCode(t, r, cli.ExitCorrupt, fmt.Sprintf(`%s: chunk %d at offset \d+: checksum mismatch.*%s`, regexp.QuoteMeta(name), index, c.errSuffix))
			// A tree CRIU undid was killed before it ran, but may take a
			// moment to be gone (its PID is the original's); it never
			// counted.
			for deadline := time.Now().Add(10 * time.Second); (alive(pid) || len(running(out)) > 0) && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
			}
			if alive(pid) || len(running(out)) > 0 {
				t.Fatalf("the tree runs after a restore from corrupted images (PIDs %v)", append(running(out), pid))
			}
			if n := len(counts(t, out)); n != atDump {
				t.Fatalf("the tree counted after a restore from corrupted images: %d counts, %d at the dump", n, atDump)
			}
			after, _ := filepath.Glob(filepath.Join(home, "logs", "*restore.log"))
			if ran := len(after) > len(logs); ran != c.criuRan {
				t.Fatalf("CRIU ran: %v, want %v (restore logs kept: %v)", ran, c.criuRan, after)
			}
		})
	}
	if restored := restorePID(t, home, id); restored != pid {
		t.Errorf("restored as PID %d, was %d", restored, pid)
	}
	consecutive(t, waitCounting(t, out, atDump+5))
}

func TestCheckpointErrors(t *testing.T) {
	requireCRIU(t)
	home, tmp := t.TempDir(), t.TempDir()
	expectCode(t, run(t, home, "checkpoint", "--pid", "999999"), cli.ExitNotFound, `no such process: PID 999999`)

	out := filepath.Join(tmp, "count")
	pid := startDetached(t, "testdata/counter.sh", out)
	waitCounting(t, out, 3)

	t.Setenv("STASIS_CRIU", filepath.Join(tmp, "no-criu-here"))
	expectCode(t, run(t, home, "checkpoint", "--pid", strconv.Itoa(pid)), cli.ExitMissingTool, `criu is not installed.*make`)
	old := filepath.Join(tmp, "criu-3.17")
	os.WriteFile(old, []byte("#!/bin/sh\necho 'Version: 3.17.1'\n"), 0o755)
	t.Setenv("STASIS_CRIU", old)
	expectCode(t, run(t, home, "checkpoint", "--pid", strconv.Itoa(pid)), cli.ExitMissingTool, `CRIU 3\.17\.1; kernels from 6\.13 on need CRIU >= 4\.1`)
	expectCode(t, run(t, home, "restore", "--job", "x", "--latest"), cli.ExitNotFound, `no complete checkpoint`)
	if !alive(pid) {
		t.Fatal("a refused checkpoint stopped the process")
	}
	waitCounting(t, out, len(counts(t, out))+3)
	if recs := list(t, home); len(recs) != 0 {
		t.Fatalf("refused checkpoints are listed: %+v", recs)
	}
}

// TestCRIUVersionCached checkpoints through a wrapper around the real
// CRIU that counts the times it is asked its version and, asked, answers
// a version that is not the real one: stasis asks once, then goes by its
// cache, and the checkpoints record the version CRIU logged.
func TestCRIUVersionCached(t *testing.T) {
	requireCRIU(t)
	real, err := criu.Find()
	if err != nil {
		t.Fatal(err)
	}
	home, tmp := t.TempDir(), t.TempDir()
	asked := filepath.Join(tmp, "asked")
	wrapper := filepath.Join(tmp, "criu")
	script := fmt.Sprintf("#!/bin/sh\nif [ \"$1\" = --version ]; then echo asked >>'%s'; echo 'Version: 4.0.7'; exit 0; fi\nexec '%s' \"$@\"\n", asked, real)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	_, realVersion, err := criu.Resolve(real)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("STASIS_CRIU", wrapper)

	out := filepath.Join(tmp, "count")
	pid := startDetached(t, "testdata/counter.sh", out)
	defer syscall.Kill(pid, syscall.SIGKILL)
	waitCounting(t, out, 3)
	for i := range 3 {
		id := checkpointPID(t, home, pid, "--leave-running")
		var show struct {
			Meta struct {
				CRIUVersion string `json:"criu_version"`
			} `json:"meta"`
		}
		if err := jsonUnmarshal(mustRun(t, home, "show", "--json", id).stdout, &show); err != nil {
			t.Fatal(err)
		}
		if show.Meta.CRIUVersion != criu.FormatVersion(realVersion) {
			t.Fatalf("checkpoint %d records CRIU %s; CRIU logged %s", i, show.Meta.CRIUVersion, criu.FormatVersion(realVersion))
		}
	}
	raw, _ := os.ReadFile(asked)
	if n := strings.Count(string(raw), "asked"); n != 1 {
		t.Fatalf("CRIU was asked its version %d times in three checkpoints, want once", n)
	}
	waitCounting(t, out, len(counts(t, out))+3)
}

// TestKill9DuringCheckpoint kills stasis with SIGKILL at random moments of
// checkpoints of a process holding 256 MiB. The job must never end up both
// dead and without a checkpoint: when no checkpoint is listed it runs on
// (CRIU resumes it once stasis, its post-dump step, is gone).
func TestKill9DuringCheckpoint(t *testing.T) {
	requireCRIU(t)
	requirePython(t)
	tmp := t.TempDir()
	rng := rand.New(rand.NewPCG(3, 4))

	// How long one checkpoint of such a process takes here, to spread the
	// kills over it.
	calib := filepath.Join(tmp, "calibrate")
	pid := startDetached(t, "python3", "testdata/memory.py", calib, "256")
	waitCounting(t, calib, 3)
	start := time.Now()
	checkpointPID(t, filepath.Join(tmp, "calibrate-home"), pid)
	full := time.Since(start)
	waitGone(t, pid)

	for round := 0; round < 6; round++ {
		home := filepath.Join(tmp, fmt.Sprintf("home%d", round))
		out := filepath.Join(tmp, fmt.Sprintf("count%d", round))
		pid := startDetached(t, "python3", "testdata/memory.py", out, "256")
		waitCounting(t, out, 3)

		cmd := exec.Command(stasisBin, "checkpoint", "--pid", strconv.Itoa(pid))
		cmd.Env = append(os.Environ(), "STASIS_HOME="+home)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(rng.Int64N(int64(full))))
		cmd.Process.Kill()
		cmd.Wait()

		// CRIU notices that stasis is gone and resumes or kills the tree.
		time.Sleep(time.Second)
		recs := list(t, home)
		switch {
		case len(recs) == 0:
			n := len(counts(t, out))
			waitCounting(t, out, n+5)
			t.Logf("round %d: killed before the commit; the job runs on", round)
		case alive(pid):
			t.Logf("round %d: killed between the commit and CRIU's end; the job was resumed and the checkpoint kept", round)
		default:
			mustRun(t, home, "verify", recs[0].ID)
			t.Logf("round %d: the checkpoint completed before the kill", round)
		}
		mustRun(t, home, "gc")
		if staged := entriesIn(t, filepath.Join(home, "staging")); len(staged) != 0 {
			t.Fatalf("gc left %v", staged)
		}
		killTree(pid)
		waitGone(t, pid)
	}
	if scratch, _ := filepath.Glob(filepath.Join(catalog.RAMScratchBase(), "stasis-dump-*")); len(scratch) > 0 {
		t.Errorf("gc left scratch directories: %v", scratch)
	}
}

func jsonUnmarshal(s string, v any) error {
	if s == "" {
		return errors.New("empty output")
	}
	return jsonDecode([]byte(s), v)
}

// TestCRIUFailureKeepsJobRunning checkpoints a process connected to a unix
// socket served from outside its tree. CRIU refuses; the error quotes
// CRIU's own reason, nothing is listed, and the job keeps running.
func TestCRIUFailureKeepsJobRunning(t *testing.T) {
	requireCRIU(t)
	requirePython(t)
	home, tmp := t.TempDir(), t.TempDir()
	out := filepath.Join(tmp, "count")
	// A counter whose session's leader, the shell, is outside the tree:
	// CRIU refuses it without --shell-job, which the user must decide.
	shell := startDetached(t, "sh", "-c", "testdata/counter.sh \"$0\" & wait", out)
	waitCounting(t, out, 3)
	kids, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", shell, shell))
	if err != nil || len(strings.Fields(string(kids))) != 1 {
		t.Fatalf("the shell's children: %q, %v", kids, err)
	}
	pid, _ := strconv.Atoi(strings.Fields(string(kids))[0])

	r := run(t, home, "checkpoint", "--pid", strconv.Itoa(pid))
	expectCode(t, r, cli.ExitError, `criu dump failed; criu says: The root process \d+ is not a session leader\. Consider using --shell-job option.*\(log: `+regexp.QuoteMeta(home)+`/logs/[^ ]+-dump\.log\)`)
	logs, _ := filepath.Glob(filepath.Join(home, "logs", "*-dump.log"))
	if len(logs) != 1 {
		t.Fatalf("the failed dump's log was not kept: %v", logs)
	}
	if strings.Contains(r.stderr, "RLIMIT_NOFILE") {
		t.Errorf("the error quotes CRIU's harmless lines: %s", r.stderr)
	}
	if recs := list(t, home); len(recs) != 0 {
		t.Fatalf("a failed checkpoint is listed: %+v", recs)
	}
	waitCounting(t, out, len(counts(t, out))+5)
	if staged := entriesIn(t, filepath.Join(home, "staging")); len(staged) != 0 {
		t.Fatalf("a failed checkpoint left %v", staged)
	}
}

// TestCheckpointFast: the job is paused only for the dump into RAM and
// keeps running; the checkpoint is listed once stored, verifies, and
// restores to where it was taken.
func TestCheckpointFast(t *testing.T) {
	requireCRIU(t)
	home, tmp := t.TempDir(), t.TempDir()
	out := filepath.Join(tmp, "count")
	pid := startDetached(t, "testdata/counter.sh", out)
	waitCounting(t, out, 5)
	r := mustRun(t, home, "checkpoint", "--pid", strconv.Itoa(pid), "--fast", "--json")
	var res struct {
		Record struct {
			ID string `json:"id"`
		} `json:"record"`
		Pause float64 `json:"pause_seconds"`
		Total float64 `json:"total_seconds"`
	}
	if err := jsonUnmarshal(r.stdout, &res); err != nil {
		t.Fatal(err)
	}
	if res.Pause <= 0 || res.Pause > res.Total {
		t.Errorf("pause %v s of a total %v s", res.Pause, res.Total)
	}
	if !alive(pid) {
		t.Fatal("--fast: the job is gone")
	}
	consecutive(t, waitCounting(t, out, len(counts(t, out))+5))
	mustRun(t, home, "verify", res.Record.ID)
	killTree(pid)
	waitGone(t, pid)
	restorePID(t, home, res.Record.ID)
	waitCounting(t, out, len(counts(t, out))+5)
}

// tracedBy returns the PID tracing pid (0 when none).
func tracedBy(pid int) int {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "TracerPid:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// waitSeized waits until CRIU has seized pid (it is being traced).
func waitSeized(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); tracedBy(pid) == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("CRIU never seized the job")
		}
	}
}

// TestCtrlCDuringDump sends SIGINT to stasis's whole process group, as a
// terminal's Ctrl-C does, while CRIU has the job seized. CRIU runs in a
// process group of its own, so it is not killed mid-dump; stasis cancels,
// CRIU resumes the job, and nothing is listed.
func TestCtrlCDuringDump(t *testing.T) {
	requireCRIU(t)
	requirePython(t)
	home, tmp := t.TempDir(), t.TempDir()
	out := filepath.Join(tmp, "count")
	pid := startDetached(t, "python3", "testdata/memory.py", out, "512")
	waitCounting(t, out, 3)
	cmd := exec.Command(stasisBin, "checkpoint", "--pid", strconv.Itoa(pid))
	cmd.Env = append(os.Environ(), "STASIS_HOME="+home)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	waitSeized(t, pid)
	syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
	err := cmd.Wait()
	ee, ok := err.(*exec.ExitError)
	if !ok {
		t.Skipf("the checkpoint finished before the signal arrived (%v)", err)
	}
	if ee.ExitCode() != cli.ExitInterrupted {
		t.Fatalf("exit %d after Ctrl-C, want %d", ee.ExitCode(), cli.ExitInterrupted)
	}
	for deadline := time.Now().Add(20 * time.Second); tracedBy(pid) != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the job is still seized after the interrupted checkpoint")
		}
	}
	waitCounting(t, out, len(counts(t, out))+5)
	if recs := list(t, home); len(recs) != 0 {
		t.Fatalf("an interrupted checkpoint is listed: %+v", recs)
	}
}

// nsPIDs returns a process's PIDs, outermost first (NSpid).
func nsPIDs(t *testing.T, pid int) []int {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
			var ids []int
			for _, f := range strings.Fields(v) {
				n, _ := strconv.Atoi(f)
				ids = append(ids, n)
			}
			return ids
		}
	}
	return nil
}

// TestRestoreNewPIDNS restores a checkpoint while the original still holds
// its PID: refused with the way out named, then restored into a new PID
// namespace, where the copy has its old PID, and both run. The copy is
// checkpointed from inside its namespace, under the PID it has there; when
// it ends, so does the namespace's init.
// running lists the live processes whose command line holds arg, in any
// PID namespace.
func running(arg string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); bytes.Contains(cmd, []byte(arg)) && alive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// memcheckLines reads what testdata/memcheck.py appended to out: one line
// per check, "ROLE N ok" or "ROLE N bad WHAT".
func memcheckLines(t *testing.T, out string) []string {
	t.Helper()
	data, err := os.ReadFile(out)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(data)), "\n")
}

// waitMemchecks waits until both processes of memcheck.py have checked
// their memory twice more after line from, and fails on any check that
// found it changed.
func waitMemchecks(t *testing.T, out string, from int) int {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		lines := memcheckLines(t, out)
		seen := map[string]int{}
		for _, l := range lines[min(from, len(lines)):] {
			f := strings.Fields(l)
			if len(f) < 3 {
				continue // being written
			}
			if f[2] != "ok" {
				t.Fatalf("memory differs after the restore: %q", l)
			}
			seen[f[0]]++
		}
		if seen["parent"] >= 2 && seen["child"] >= 2 {
			return len(lines)
		}
	}
	t.Fatalf("memcheck.py stopped checking (%s)", out)
	return 0
}

// startMemcheck starts testdata/memcheck.py (CRIU and Python needed) with
// a new store, and returns the store, the file it writes its checks to,
// its PID and how many checks it has written once both processes check.
func startMemcheck(t *testing.T) (home, out string, pid, from int) {
	t.Helper()
	requireCRIU(t)
	requirePython(t)
	home, out = t.TempDir(), filepath.Join(t.TempDir(), "checks")
	pid = startDetached(t, "python3", "testdata/memcheck.py", out)
	return home, out, pid, waitMemchecks(t, out, 0)
}

// TestRestoreBringsBackEveryKindOfMemory checkpoints a parent and a child
// holding memory of every kind (private anonymous pages random, zero,
// nearly zero and untouched, shared copy-on-write with the child or
// rewritten by it; read-only and inaccessible anonymous memory; changed
// pages of a private file mapping; the heap) with the memory copied by
// stasis (as by default) and by CRIU, and restores it in each way the
// memory can come back, and in a new PID namespace; both processes find
// every byte as it was.
func TestRestoreBringsBackEveryKindOfMemory(t *testing.T) {
	home, out, pid, from := startMemcheck(t)
	copied := func(args ...string) (id string, copied int64, used string) {
		r := mustRun(t, home, append([]string{"checkpoint", "--json", "--pid", strconv.Itoa(pid)}, args...)...)
		var rep struct {
			Record struct {
				ID string `json:"id"`
			} `json:"record"`
			Copied  int64    `json:"copied_pages_bytes"`
			Used    string   `json:"dump_pages"`
			Early   int64    `json:"early_copied_bytes"`
			Dropped []string `json:"early_copy_dropped"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
			t.Fatalf("checkpoint --json printed %q: %v", r.stdout, err)
		}
		if rep.Copied > 0 && rep.Early == 0 && len(rep.Dropped) == 0 {
			// Each process holds runs of two whole chunks or more: an
			// early copy starts for each, and holds or is dropped (the
			// largest run may be memory the process changes); the
			// restores below check every byte either way.
			t.Errorf("--dump-pages copy made no early copy (copied %d bytes early, none dropped)", rep.Early)
		}
		return rep.Record.ID, rep.Copied, rep.Used
	}
	byCRIU, n, used := copied("--leave-running", "--dump-pages", "criu")
	if n != 0 || used != "criu" {
		t.Errorf("--dump-pages criu: stasis copied %d bytes of memory; dump_pages %q", n, used)
	}
	id, n, used := copied() // --dump-pages auto: copy, for a tree without CUDA
	if n < 2*(16<<20) || used != "copy" {
		t.Errorf("by default: stasis copied %d bytes of memory (the two processes hold more than %d); dump_pages %q", n, 2*(16<<20), used)
	}
	waitGone(t, pid)
	for _, args := range [][]string{{"--pages", "fill"}, {"--pages", "stream"}, {"--pages", "unpack"}, {"--new-pidns"}, {"--dump-pages=criu", "--pages", "fill"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			// The checkpoint stasis copied the memory of, restored every
			// way; CRIU's, with the default restore.
			ckpt := id
			if args[0] == "--dump-pages=criu" {
				ckpt, args = byCRIU, args[1:]
			}
			r := mustRun(t, home, append([]string{"restore", "--json", ckpt}, args...)...)
			var rep struct {
				PID    int    `json:"pid"`
				Pages  string `json:"pages"`
				Filled int64  `json:"filled_bytes"`
				Zero   int64  `json:"filled_zero_bytes"`
				Kept   int64  `json:"kept_for_criu_bytes"`
				// The memory read back and found as checkpointed, and
				// the shared memory that could not be.
				Checked   int64 `json:"checked_bytes"`
				Unchecked int64 `json:"unchecked_shared_bytes"`
			}
			if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
				t.Fatalf("restore --json printed %q: %v", r.stdout, err)
			}
			defer func() { killTree(rep.PID); waitGone(t, rep.PID) }()
			if rep.Pages == "fill" {
				// The random pages and the heap are written, the zero
				// pages left out, the file's changed pages kept for
				// CRIU; the read-only memory is CRIU's too.
				if rep.Filled < 8<<20 || rep.Zero < 4<<20 || rep.Kept < 1<<20 {
					t.Errorf("filled %d bytes, left out %d as zeros, kept %d for CRIU", rep.Filled, rep.Zero, rep.Kept)
				}
				// Every page is read back: the filled ones, the zeros,
				// CRIU's, and the shared memory and memfd in both
				// processes (mapped, and the memfd through its
				// descriptor too).
				if rep.Checked < rep.Filled+rep.Zero+rep.Kept+2*(3<<20) || rep.Unchecked != 0 {
					t.Errorf("checked %d bytes (filled %d, zeros %d, kept %d), %d of shared memory unchecked", rep.Checked, rep.Filled, rep.Zero, rep.Kept, rep.Unchecked)
				}
			} else if rep.Filled != 0 {
				t.Errorf("--pages %s filled %d bytes", rep.Pages, rep.Filled)
			}
			from = waitMemchecks(t, out, from)
		})
	}
}

// TestRestoreFailsOnWrongMemory restores a checkpoint with one byte of
// the memory stasis fills made wrong (a failpoint of the tests' build): the
// check of the restored memory finds it, CRIU undoes the restore (nothing
// of the tree is left), the error is one line with its own exit code; the
// same checkpoint then restores right.
func TestRestoreFailsOnWrongMemory(t *testing.T) {
	home, out, pid, from := startMemcheck(t)
	id := checkpointPID(t, home, pid)
	waitGone(t, pid)
	before := len(memcheckLines(t, out))
	t.Setenv("STASIS_FAILPOINTS", "fill-wrong-page")
	r := run(t, home, "restore", id)
	expectCode(t, r, cli.ExitMemory, `^stasis: restored memory differs from the checkpoint: process \d+ \(PID \d+ here\), mapping 0x[0-9a-f]+-0x[0-9a-f]+, page at 0x[0-9a-f]+ \(CRIU undid the restore; nothing of the tree runs\)`)
	// The tree CRIU undid goes (it may still be being torn down), and
	// never checked its memory: it never ran.
	waitGone(t, pid)
	if n := len(memcheckLines(t, out)); n != before {
		t.Fatalf("the tree of the failed restore ran: %d checks written, %d before", n, before)
	}
	t.Setenv("STASIS_FAILPOINTS", "")
	r = mustRun(t, home, "restore", id)
	restored, err := strconv.Atoi(strings.TrimSpace(r.stdout))
	if err != nil {
		t.Fatalf("restore printed %q", r.stdout)
	}
	defer func() { killTree(restored); waitGone(t, restored) }()
	waitMemchecks(t, out, from)
}

// TestDataLoaderScript runs scripts/gpu-dataloader.sh on the CPU, with few
// steps: a PyTorch training loop fed by a DataLoader with persistent
// workers (spawn and fork; the GPU machine runs all three start methods on
// the GPU), checkpointed a third of the way with a plain `stasis
// checkpoint` and restored, must write the same loss at every step as a
// run without a break. 90 steps of 50 ms and more leave the checkpoint
// seconds to freeze the job before it ends, even on a loaded machine (a
// tree caught ending fails its dump or restore, as it should).
func TestDataLoaderScript(t *testing.T) {
	requireCRIU(t)
	if err := exec.Command("/usr/bin/python3", "-c", "import torch").Run(); err != nil {
		t.Skip("Debian's PyTorch (python3-torch, which make installs) is not in /usr/bin/python3")
	}
	cmd := exec.Command("../scripts/gpu-dataloader.sh", "-n", "90", "-m", "spawn fork", "-D", "cpu", "-d", t.TempDir())
	cmd.Env = append(os.Environ(), "PATH=/usr/bin:"+os.Getenv("PATH"), "STASIS_CRIU="+os.Getenv("STASIS_CRIU"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("gpu-dataloader.sh: %v\n%s", err, out)
	}
	if n := strings.Count(string(out), "\nPASS "); n != 2 {
		t.Fatalf("%d of 2 start methods passed:\n%s", n, out)
	}
	t.Logf("%s", out)
}

// TestEarlyCopyDropped checkpoints, with --dump-pages copy, a process
// that rewrites every page of its memory without pause (busy.py), so that
// the pages stasis copies while CRIU dumps have changed by the freeze: the
// early copy is dropped, the memory copied from the frozen process, and
// the restored process finds its pages as one instant left them.
func TestEarlyCopyDropped(t *testing.T) {
	requireCRIU(t)
	requirePython(t)
	home := t.TempDir()
	out := filepath.Join(t.TempDir(), "passes")
	pid := startDetached(t, "python3", "testdata/busy.py", out)
	passes := func() []string {
		data, _ := os.ReadFile(out)
		return strings.Split(strings.TrimSpace(string(data)), "\n")
	}
	waitLines := func(n int) []string {
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if l := passes(); len(l) >= n {
				return l
			}
		}
		t.Fatalf("busy.py stopped at %d passes", len(passes()))
		return nil
	}
	waitLines(3)
	r := mustRun(t, home, "checkpoint", "--json", "--dump-pages", "copy", "--pid", strconv.Itoa(pid))
	var rep struct {
		Record struct {
			ID string `json:"id"`
		} `json:"record"`
		Early   int64    `json:"early_copied_bytes"`
		Dropped []string `json:"early_copy_dropped"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("checkpoint --json printed %q: %v", r.stdout, err)
	}
	if rep.Early != 0 || len(rep.Dropped) != 1 || !strings.Contains(rep.Dropped[0], "changed before the freeze") {
		t.Fatalf("copied %d bytes early; dropped: %q; want the one early copy dropped for changed memory", rep.Early, rep.Dropped)
	}
	waitGone(t, pid)
	before := len(passes())
	restorePID(t, home, rep.Record.ID)
	for _, l := range waitLines(before + 3)[before:] {
		if !strings.HasSuffix(l, " ok") {
			t.Fatalf("after the restore: %q", l)
		}
	}
}

func TestRestoreNewPIDNS(t *testing.T) {
	requireCRIU(t)
	home, tmp := t.TempDir(), t.TempDir()
	out := filepath.Join(tmp, "count")
	pid := startDetached(t, "testdata/counter.sh", out)
	waitCounting(t, out, 3)
	id := checkpointPID(t, home, pid, "--leave-running")
	expectCode(t, run(t, home, "restore", "--pid-wait", "100ms", id), cli.ExitPIDInUse, `restore into a new PID namespace \(--new-pidns\)`)

	copyPID := restorePID(t, home, "--new-pidns", id)
	ids := nsPIDs(t, copyPID)
	if len(ids) != 2 || ids[0] != copyPID || ids[1] != pid {
		t.Fatalf("the copy's PIDs (outermost first) are %v; want [%d %d]", ids, copyPID, pid)
	}
	if !alive(pid) || !alive(copyPID) {
		t.Fatalf("original alive %v, copy alive %v", alive(pid), alive(copyPID))
	}
	// Both count into the same file now: it grows twice as fast, and the
	// copy goes on from the checkpoint's count.
	waitCounting(t, out, len(counts(t, out))+10)

	initPID := parentOf(t, copyPID)
	if ids := nsPIDs(t, initPID); len(ids) != 2 || ids[1] != 1 {
		t.Fatalf("the copy's parent has PIDs %v; want the init of its namespace", ids)
	}
	again := checkpointPID(t, home, copyPID)
	waitGone(t, copyPID)
	waitGone(t, initPID)
	// The new checkpoint holds the PID the copy had inside, which the
	// original still holds here.
	expectCode(t, run(t, home, "restore", "--pid-wait", "100ms", again), cli.ExitPIDInUse, fmt.Sprintf(`PID %d is held by`, pid))
	if ids := nsPIDs(t, restorePID(t, home, "--new-pidns", again)); len(ids) != 2 || ids[1] != pid {
		t.Fatalf("restored again with PIDs %v; want %d inside a new namespace", ids, pid)
	}
}

// TestCheckpointIgnoresAnInheritedLauncherVariable: STASIS_CRIU_NSENTER in
// stasis's environment (a user's, or inherited) does not reach the criu
// launcher: the checkpoint is taken where it would be without it.
func TestCheckpointIgnoresAnInheritedLauncherVariable(t *testing.T) {
	requireCRIU(t)
	home, out := t.TempDir(), filepath.Join(t.TempDir(), "count")
	pid := startDetached(t, "testdata/counter.sh", out)
	waitCounting(t, out, 3)
	t.Setenv("STASIS_CRIU_NSENTER", "999999999")
	checkpointPID(t, home, pid, "--job", "env")
	if recs := list(t, home); len(recs) != 1 || recs[0].Kind != "process" {
		t.Fatalf("listed: %+v", recs)
	}
}
