package cuda

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// buildTool compiles the stand-in cuda-checkpoint into dir.
func buildTool(t *testing.T, dir string) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc is needed to build the stand-in cuda-checkpoint")
	}
	bin := filepath.Join(dir, "cuda-checkpoint")
	if out, err := exec.Command("gcc", "-o", bin, "testdata/fakecuda/cuda-checkpoint.c").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return bin
}

// toolDriver loads the stand-in driver without the checkpoint API, with
// the stand-in cuda-checkpoint (bin) named by $STASIS_CUDA_CHECKPOINT and
// their state in dir.
func toolDriver(t *testing.T) (d *Driver, bin, dir string) {
	t.Helper()
	lib := buildLib(t, "testdata/fakecuda/libcuda.c", "-DNO_CHECKPOINT_API")
	bin = buildTool(t, t.TempDir())
	dir = t.TempDir()
	t.Setenv("STASIS_FAKE_CUDA_DIR", dir)
	t.Setenv(ToolEnv, bin)
	d, err := load(lib)
	if err != nil {
		t.Fatal(err)
	}
	return d, bin, dir
}

// script writes an executable shell script.
func script(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "cuda-checkpoint")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func readLog(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	os.Remove(path)
	return strings.TrimSpace(string(data))
}

// TestToolBackend loads the stand-in driver without the checkpoint API:
// the process calls go through the stand-in cuda-checkpoint, states move
// as with the API, errors quote the tool, and a lock failure is a timeout.
func TestToolBackend(t *testing.T) {
	d, bin, dir := toolDriver(t)
	if b := d.Backend(); b.Kind != BackendTool || b.Path != bin || !strings.Contains(b.Reason, "lacks the checkpoint API") || !strings.Contains(b.Reason, "$"+ToolEnv) {
		t.Fatalf("backend %+v", b)
	}
	os.WriteFile(filepath.Join(dir, "devices"), []byte("2"), 0o600)
	if _, err := d.PrimaryContext(0); err != nil {
		t.Fatalf("the memory calls, without the checkpoint API: %v", err)
	}
	devs, err := d.Devices()
	if err != nil || len(devs) != 2 {
		t.Fatalf("Devices = %+v, %v", devs, err)
	}
	gpu0, _ := ParseUUID(devs[0].UUID)
	gpu1, _ := ParseUUID(devs[1].UUID)
	swap := []GPUPair{{Old: gpu0, New: gpu1}, {Old: gpu1, New: gpu0}}
	const pid = 4242
	walk(t, d, pid, []step{
		{func() error { return d.Lock(pid, 250e6) }, Locked},
		{func() error { return d.Checkpoint(pid) }, Checkpointed},
		{func() error { return d.Restore(pid, swap) }, Locked},
		{func() error { return d.Unlock(pid) }, Running},
	})
	if got := readLog(t, filepath.Join(dir, "calls.log")); got != "lock 4242 0\ncheckpoint 4242 0\nrestore 4242 0 0>1 1>0\nunlock 4242 0" {
		t.Fatalf("driver calls:\n%s", got)
	}
	toolLog := readLog(t, filepath.Join(dir, "tool.log"))
	for _, want := range []string{
		"--action lock --pid 4242 --timeout 250\n--get-state --pid 4242\n--action checkpoint --pid 4242\n",
		"--action restore --pid 4242 --device-map " + devs[0].UUID + "=" + devs[1].UUID + "," + devs[1].UUID + "=" + devs[0].UUID + "\n",
		"--help\n",
	} {
		if !strings.Contains(toolLog, want) {
			t.Fatalf("tool runs:\n%s\nlack %q", toolLog, want)
		}
	}

	err = d.Unlock(pid) // not locked
	var te *ToolError
	if !errors.As(err, &te) || te.PID != pid || TimedOut(err) ||
		err.Error() != `cuda-checkpoint --action unlock --pid 4242: Could not unlock on process ID 4242: "the operation cannot be performed in the present state" (exit status 1)` {
		t.Fatalf("unlock of a running process: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "fail-lock"), nil, 0o600)
	if err := d.Lock(pid, 0); !TimedOut(err) || !strings.Contains(err.Error(), `--timeout 1: Could not lock on process ID 4242: "device not ready"`) {
		t.Fatalf("failing lock: %v", err)
	}
	if tid, err := d.RestoreThreadID(pid); err != nil || tid != pid {
		t.Fatalf("RestoreThreadID = %d, %v", tid, err)
	}
}

// TestToolWithoutDeviceMap: a cuda-checkpoint from before CUDA 13.0 has no
// --device-map; a restore onto other GPUs is refused before the tool runs,
// one onto the same GPUs goes on.
func TestToolWithoutDeviceMap(t *testing.T) {
	d, _, dir := toolDriver(t)
	os.WriteFile(filepath.Join(dir, "tool-no-device-map"), nil, 0o600)
	os.WriteFile(filepath.Join(dir, "4242.state"), []byte("2"), 0o600)
	var gpu0, gpu1 [16]byte
	gpu1[0] = 1
	for _, err := range []error{d.CanRemap(), d.Restore(4242, []GPUPair{{Old: gpu0, New: gpu1}})} {
		if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "cannot restore GPU state onto other GPUs: its --help lists no --device-map") {
			t.Fatalf("remap with a tool without --device-map: %v", err)
		}
	}
	if got := readLog(t, filepath.Join(dir, "calls.log")); got != "" {
		t.Fatalf("a refused restore called the driver: %s", got)
	}
	if err := d.Restore(4242, nil); err != nil {
		t.Fatal(err)
	}
	if err := ToolCanRemap(buildTool(t, t.TempDir())); err == nil {
		t.Fatal("ToolCanRemap: a tool without --device-map can remap")
	}
}

// TestToolOutput runs tools that say things in other ways than the
// stand-in does.
func TestToolOutput(t *testing.T) {
	tl := func(body string) *tool { return &tool{path: script(t, body)} }

	// Failures: one line, stderr first, the exit status; only a lock
	// can time out.
	err := tl(`echo 'Could not lock on process ID 7: "device not ready"' >&2; exit 1`).lock(7, 0)
	var te *ToolError
	if !errors.As(err, &te) || !te.TimedOut || !TimedOut(err) || te.Exit != "exit status 1" {
		t.Fatalf("lock timeout: %#v", err)
	}
	if !TimedOut(tl(`echo "CUDA_ERROR_NOT_READY"; exit 3`).lock(7, 0)) || !TimedOut(tl(`echo "lock timed out"; exit 1`).lock(7, 0)) {
		t.Fatal("other ways of saying the lock timed out")
	}
	for _, err := range []error{tl(`echo "invalid argument" >&2; exit 1`).lock(7, 0), tl(`echo "device not ready" >&2; exit 1`).checkpoint(7)} {
		if !errors.As(err, &te) || TimedOut(err) {
			t.Fatalf("not a lock timeout: %v", err)
		}
	}
	err = tl("echo first; echo; echo '  second  ' >&2; echo third >&2; exit 2").unlock(7)
	if err == nil || err.Error() != "cuda-checkpoint --action unlock --pid 7: second; third; first (exit status 2)" {
		t.Fatalf("multi-line output: %v", err)
	}
	if err := tl(strings.Repeat("echo 0123456789012345678901234567890123456789;", 20) + "exit 1").unlock(7); err == nil || len(err.Error()) > 400 || !strings.Contains(err.Error(), "...") {
		t.Fatalf("long output: %v", err)
	}
	if err := tl("exit 1").unlock(7); err == nil || err.Error() != "cuda-checkpoint --action unlock --pid 7: exit status 1" {
		t.Fatalf("silent failure: %v", err)
	}
	if err := tl("kill -9 $$").checkpoint(7); !errors.As(err, &te) || te.Exit != "signal: killed" {
		t.Fatalf("killed tool: %v", err)
	}
	// A failure reported with exit status 0 is a failure.
	if err := tl(`echo 'Could not checkpoint on process ID 7: "unknown error"'`).checkpoint(7); !errors.As(err, &te) || te.Exit != "exit status 0" {
		t.Fatalf("failure with exit status 0: %v", err)
	}
	if err := tl(`echo warning >&2; echo 'Could not checkpoint on process ID 7: "unknown error"' >&2`).checkpoint(7); err == nil ||
		err.Error() != `cuda-checkpoint --action checkpoint --pid 7: warning; Could not checkpoint on process ID 7: "unknown error" (exit status 0)` {
		t.Fatalf("failure after another line, with exit status 0: %v", err)
	}
	if err := tl(`echo "checkpointed"`).checkpoint(7); err != nil {
		t.Fatalf("success with output: %v", err)
	}
	// A tool that cannot run.
	if err := (&tool{path: filepath.Join(t.TempDir(), "gone")}).unlock(7); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("missing tool: %v", err)
	}

	// --get-state and --get-restore-tid.
	if s, err := tl("echo 'CUDA state: Checkpointed.'").state(7); err != nil || s != Checkpointed {
		t.Fatalf("labelled state: %v, %v", s, err)
	}
	for _, out := range []string{"", "unlocked", "running or locked", "42"} {
		if _, err := tl("echo '" + out + "'").state(7); err == nil || !strings.Contains(err.Error(), "cannot read a state") {
			t.Errorf("state from %q: %v", out, err)
		}
	}
	if tid, err := tl("echo 'restore thread: 4321'").restoreThreadID(7); err != nil || tid != 4321 {
		t.Fatalf("restore tid: %d, %v", tid, err)
	}
	for _, out := range []string{"", "none", "1 2", "0"} {
		if _, err := tl("echo '" + out + "'").restoreThreadID(7); err == nil {
			t.Errorf("thread ID read from %q", out)
		}
	}
}

func TestParseState(t *testing.T) {
	for out, want := range map[string]State{"running\n": Running, "locked": Locked, "  checkpointed  \n": Checkpointed, "failed": Failed, "CU_PROCESS_STATE_LOCKED": Locked} {
		if s, err := parseState(out); err != nil || s != want {
			t.Errorf("parseState(%q) = %v, %v", out, s, err)
		}
	}
}

func TestFindTool(t *testing.T) {
	dir := t.TempDir()
	onPath := script(t, "exit 0")
	t.Setenv("PATH", filepath.Dir(onPath))
	t.Setenv(ToolEnv, "")
	if p, where, err := FindTool(); err != nil || p != onPath || where != "PATH" {
		t.Fatalf("on PATH: %s, %s, %v", p, where, err)
	}
	named := script(t, "exit 0")
	t.Setenv(ToolEnv, named)
	if p, where, err := FindTool(); err != nil || p != named || where != "$"+ToolEnv {
		t.Fatalf("named: %s, %s, %v", p, where, err)
	}
	// A name that does not work is an error, not a reason to look on.
	plain := filepath.Join(dir, "plain")
	os.WriteFile(plain, nil, 0o644)
	for p, why := range map[string]string{plain: "is not executable", dir: "is not a file", filepath.Join(dir, "gone"): "does not exist"} {
		t.Setenv(ToolEnv, p)
		if _, _, err := FindTool(); err == nil || err.Error() != "$"+ToolEnv+" names "+p+", which "+why {
			t.Errorf("%s: %v", p, err)
		}
	}
	t.Setenv(ToolEnv, "")
	t.Setenv("PATH", dir)
	if _, _, err := FindTool(); err == nil || !strings.Contains(err.Error(), "no cuda-checkpoint was found") {
		t.Fatalf("none: %v", err)
	}
}

// TestToolBusy: a cuda-checkpoint still running on a process (left by a
// killed stasis) is seen, and waited for, by the next state query.
func TestToolBusy(t *testing.T) {
	tl := &tool{path: script(t, `if [ "$1" = --get-state ]; then echo running; else sleep 30; fi`)}
	left := exec.Command(tl.path, "--action", "checkpoint", "--pid", "77")
	if err := left.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { left.Process.Kill(); left.Wait() }()
	for deadline := time.Now().Add(5 * time.Second); !tl.busy(77); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the running cuda-checkpoint is not seen")
		}
	}
	if tl.busy(78) || (&tool{path: script(t, "exit 0")}).busy(77) {
		t.Fatal("busy for another process, or another tool")
	}
	// The state query must not return before the left tool ends.
	var ended atomic.Bool
	type answer struct {
		s           State
		err         error
		afterTheEnd bool
	}
	got := make(chan answer, 1)
	go func() { s, err := tl.state(77); got <- answer{s, err, ended.Load()} }()
	time.Sleep(200 * time.Millisecond) // time for a state query that does not wait to return
	ended.Store(true)
	left.Process.Kill()
	left.Wait()
	if a := <-got; a.err != nil || a.s != Running || !a.afterTheEnd {
		t.Fatalf("state %v, %v, read after the tool ended: %v", a.s, a.err, a.afterTheEnd)
	}
}
