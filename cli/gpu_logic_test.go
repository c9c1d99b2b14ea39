package cli_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stasis-ckpt/stasis/cli"
)

// These tests run stasis's GPU state machine (lock, checkpoint, dump,
// rollback, restore, recover) against real processes and real CRIU on a
// machine without a GPU. The NVIDIA driver is replaced by a stand-in,
// testdata/fakecuda/libcuda.c, that implements the checkpoint API's state
// transitions, logs every call and fails on request; the processes map it
// as CUDA programs map libcuda. The real driver is exercised on the GPU
// machine by scripts/gpu-e2e.sh.

type fakeDriver struct {
	dir     string // state files, calls.log, fail-* switches
	lib     string
	counter string
}

func newFakeDriver(t *testing.T) *fakeDriver {
	t.Helper()
	requireCRIU(t)
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc is needed to build the stand-in driver")
	}
	bin := t.TempDir()
	f := &fakeDriver{dir: t.TempDir(), lib: filepath.Join(bin, "libcuda.so.1"), counter: filepath.Join(bin, "counter")}
	for _, args := range [][]string{
		{"-shared", "-fPIC", "-o", f.lib, "../cuda/testdata/fakecuda/libcuda.c"},
		{"-o", f.counter, "../cuda/testdata/fakecuda/counter.c", "-ldl"},
	} {
		if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
			t.Fatalf("gcc %v: %v\n%s", args, err, out)
		}
	}
	t.Setenv("STASIS_LIBCUDA", f.lib)
	t.Setenv("STASIS_LIBNVML", f.lib)
	t.Setenv("STASIS_FAKE_CUDA_DIR", f.dir)
	return f
}

// start runs a counter that maps the stand-in driver.
func (f *fakeDriver) start(t *testing.T, out string) int {
	t.Helper()
	pid := startDetached(t, f.counter, f.lib, out)
	waitCounting(t, out, 3)
	return pid
}

// calls returns the driver calls made so far, as "call pid result".
func (f *fakeDriver) calls(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(f.dir, "calls.log"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(data)), "\n")
}

func (f *fakeDriver) wantCalls(t *testing.T, pid int, want ...string) {
	t.Helper()
	for i := range want {
		want[i] = strings.Replace(want[i], " P ", fmt.Sprintf(" %d ", pid), 1)
	}
	got := f.calls(t)
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("driver calls:\n got  %q\n want %q", got, want)
	}
	os.Remove(filepath.Join(f.dir, "calls.log"))
}

// state is pid's checkpoint state in the stand-in ("0" is running).
func (f *fakeDriver) state(t *testing.T, pid int) string {
	t.Helper()
	return f.perProcess(t, pid, "state")
}

// gpu is the GPU the stand-in says pid runs on.
func (f *fakeDriver) gpu(t *testing.T, pid int) string {
	t.Helper()
	return f.perProcess(t, pid, "gpu")
}

// perProcess reads the stand-in's file <pid>.<what>; "0" when there is none.
func (f *fakeDriver) perProcess(t *testing.T, pid int, what string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(f.dir, fmt.Sprintf("%d.%s", pid, what)))
	if os.IsNotExist(err) {
		return "0"
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}

func (f *fakeDriver) set(t *testing.T, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(f.dir, name), []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// gpuBackend is one way stasis makes the CUDA calls: libcuda's checkpoint
// API, or cuda-checkpoint where libcuda lacks it (gpu_tool_test.go). The
// tests below run through each.
type gpuBackend struct {
	name string // as the manifest records it
	tool bool
	// How the backend says that the lock timed out, and that the CUDA
	// checkpoint failed.
	lockTimedOut, checkpointFailed string
}

var gpuBackends = []gpuBackend{
	{"api", false, `cuCheckpointProcessLock\(pid \d+\): CUDA_ERROR_NOT_READY`, `cuCheckpointProcessCheckpoint\(pid \d+\): CUDA_ERROR_UNKNOWN`},
	{"cuda-checkpoint", true,
		`cuda-checkpoint --action lock --pid \d+ --timeout 200: Could not lock on process ID \d+: "device not ready" \(exit status 1\)`,
		`cuda-checkpoint --action checkpoint --pid \d+: Could not checkpoint on process ID \d+: "unknown error" \(exit status 1\)`},
}

// eachBackend runs test as a subtest per backend, on the stand-in driver
// set up for it.
func eachBackend(t *testing.T, test func(t *testing.T, b gpuBackend, f *fakeDriver)) {
	for _, b := range gpuBackends {
		t.Run(b.name, func(t *testing.T) { test(t, b, b.driver(t)) })
	}
}

func (b gpuBackend) driver(t *testing.T) *fakeDriver {
	t.Helper()
	if b.tool {
		f, _ := newToolDriver(t)
		return f
	}
	return newFakeDriver(t)
}

func TestGPUCheckpointLeaveRunning(t *testing.T) {
	eachBackend(t, testGPUCheckpointLeaveRunning)
}

func testGPUCheckpointLeaveRunning(t *testing.T, b gpuBackend, f *fakeDriver) {
	home, tmp := t.TempDir(), t.TempDir()
	out := filepath.Join(tmp, "count")
	pid := f.start(t, out)
	id := checkpointPID(t, home, pid, "--leave-running")
	f.wantCalls(t, pid, "lock P 0", "checkpoint P 0", "restore P 0", "unlock P 0")
	if b.tool {
		f.wantToolRuns(t, pid, "--get-state --pid P", "--action lock --pid P --timeout 10000", "--action checkpoint --pid P", "--action restore --pid P", "--action unlock --pid P")
	}
	if s := f.state(t, pid); s != "0" {
		t.Fatalf("GPU state %s after --leave-running, want running (0)", s)
	}
	consecutive(t, waitCounting(t, out, len(counts(t, out))+5))
	var show struct {
		Meta struct {
			GPU struct {
				PIDs          []int `json:"pids"`
				DriverVersion int   `json:"driver_version"`
				Devices       []struct {
					Name string `json:"name"`
					UUID string `json:"uuid"`
				} `json:"devices"`
				Backend string `json:"backend"`
			} `json:"gpu"`
		} `json:"meta"`
	}
	if err := jsonUnmarshal(mustRun(t, home, "show", "--json", id).stdout, &show); err != nil {
		t.Fatal(err)
	}
	g := show.Meta.GPU
	if len(g.PIDs) != 1 || g.PIDs[0] != pid || g.DriverVersion != 13000 || len(g.Devices) != 1 ||
		g.Devices[0].Name != "Fake GPU" || g.Devices[0].UUID != "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f" || g.Backend != b.name {
		t.Fatalf("the manifest's GPU record: %+v", g)
	}
}

func TestGPUCheckpointThenRestore(t *testing.T) {
	eachBackend(t, testGPUCheckpointThenRestore)
}

func testGPUCheckpointThenRestore(t *testing.T, b gpuBackend, f *fakeDriver) {
	home, tmp := t.TempDir(), t.TempDir()
	out := filepath.Join(tmp, "count")
	pid := f.start(t, out)
	id := checkpointPID(t, home, pid)
	f.wantCalls(t, pid, "lock P 0", "checkpoint P 0")
	if b.tool {
		f.wantToolRuns(t, pid, "--get-state --pid P", "--action lock --pid P --timeout 10000", "--action checkpoint --pid P")
	}
	waitGone(t, pid)
	atDump := len(counts(t, out))

	// Another driver version: refused before CRIU runs, unless --force.
	f.set(t, "version", "12080")
	expectMismatches(t, run(t, home, "restore", id), []string{`driver: the checkpoint was made with a driver for CUDA 13\.0, this one is for CUDA 12\.8`}, nil)
	if alive(pid) {
		t.Fatal("a refused restore ran CRIU")
	}
	f.set(t, "gpu-name", "Other GPU")
	expectMismatches(t, run(t, home, "restore", id), []string{`driver: .*CUDA 12\.8`, `GPU 0 \(GPU-10111213-[0-9a-f-]+\) was a Fake GPU, GPU 0 \(GPU-10111213-[0-9a-f-]+\) that takes it over is a Other GPU`}, nil)
	f.set(t, "version", "13000")
	os.Remove(filepath.Join(f.dir, "gpu-name"))
	f.wantCalls(t, pid)

	restored := restorePID(t, home, id)
	if restored != pid {
		t.Fatalf("restored as %d, was %d", restored, pid)
	}
	f.wantCalls(t, pid, "restore P 0", "unlock P 0")
	if b.tool {
		f.wantToolRuns(t, pid, "--action restore --pid P", "--action unlock --pid P")
	}
	consecutive(t, waitCounting(t, out, atDump+5))
}

func TestGPULockTimeoutRollsBack(t *testing.T) {
	eachBackend(t, testGPULockTimeoutRollsBack)
}

func testGPULockTimeoutRollsBack(t *testing.T, b gpuBackend, f *fakeDriver) {
	home, tmp := t.TempDir(), t.TempDir()
	out := filepath.Join(tmp, "count")
	pid := f.start(t, out)
	f.set(t, "fail-lock", "")
	expectCode(t, run(t, home, "checkpoint", "--pid", strconv.Itoa(pid), "--gpu-lock-timeout", "200ms"),
		cli.ExitGPUTimeout, `rolled back; the job runs on: GPU work of PID \d+ did not finish within the lock timeout of 200ms \(raise --gpu-lock-timeout\): `+b.lockTimedOut+`\n$`)
	f.wantCalls(t, pid, "lock P 600")
	if s := f.state(t, pid); s != "0" || !alive(pid) {
		t.Fatalf("after a lock timeout: GPU state %s, alive %v", s, alive(pid))
	}
	waitCounting(t, out, len(counts(t, out))+3)
	if recs := list(t, home); len(recs) != 0 {
		t.Fatalf("a rolled-back checkpoint is listed: %+v", recs)
	}
}

func TestGPUCheckpointFailureRollsBack(t *testing.T) {
	eachBackend(t, testGPUCheckpointFailureRollsBack)
}

func testGPUCheckpointFailureRollsBack(t *testing.T, b gpuBackend, f *fakeDriver) {
	home, tmp := t.TempDir(), t.TempDir()
	out := filepath.Join(tmp, "count")
	pid := f.start(t, out)
	f.set(t, "fail-checkpoint", "")
	expectCode(t, run(t, home, "checkpoint", "--pid", strconv.Itoa(pid)), cli.ExitError, `rolled back; the job runs on: `+b.checkpointFailed+`\n$`)
	// Locked but never checkpointed: unlocked, not restored.
	f.wantCalls(t, pid, "lock P 0", "checkpoint P 999", "unlock P 0")
	if b.tool {
		f.wantToolRuns(t, pid, "--get-state --pid P", "--action lock --pid P --timeout 10000", "--action checkpoint --pid P", "--action unlock --pid P")
	}
	if s := f.state(t, pid); s != "0" {
		t.Fatalf("GPU state %s after the rollback", s)
	}
	waitCounting(t, out, len(counts(t, out))+3)
}

// TestGPUDumpFailureRollsBack makes CRIU fail after the CUDA checkpoint:
// CUDA restore and unlock follow, and the job runs on.
func TestGPUDumpFailureRollsBack(t *testing.T) {
	eachBackend(t, testGPUDumpFailureRollsBack)
}

func testGPUDumpFailureRollsBack(t *testing.T, _ gpuBackend, f *fakeDriver) {
	home, tmp := t.TempDir(), t.TempDir()
	out := filepath.Join(tmp, "count")
	pid := f.start(t, out)
	real := os.Getenv("STASIS_CRIU")
	broken := filepath.Join(tmp, "criu")
	script := fmt.Sprintf("#!/bin/sh\nif [ \"$1\" = swrk ] || [ \"$1\" = dump ]; then echo 'simulated CRIU crash' >&2; exit 1; fi\nexec %q \"$@\"\n", real)
	if err := os.WriteFile(broken, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("STASIS_CRIU", broken)
	r := run(t, home, "checkpoint", "--pid", strconv.Itoa(pid))
	expectCode(t, r, cli.ExitError, `rolled back; the job runs on: criu dump failed`)
	f.wantCalls(t, pid, "lock P 0", "checkpoint P 0", "restore P 0", "unlock P 0")
	waitCounting(t, out, len(counts(t, out))+3)
	if recs := list(t, home); len(recs) != 0 {
		t.Fatalf("a failed checkpoint is listed: %+v", recs)
	}
}

func TestGPURecover(t *testing.T) {
	eachBackend(t, testGPURecover)
}

func testGPURecover(t *testing.T, _ gpuBackend, f *fakeDriver) {
	home, tmp := t.TempDir(), t.TempDir()
	locked := f.start(t, filepath.Join(tmp, "a"))
	checkpointed := f.start(t, filepath.Join(tmp, "b"))
	running := f.start(t, filepath.Join(tmp, "c"))
	f.set(t, fmt.Sprintf("%d.state", locked), "1")
	f.set(t, fmt.Sprintf("%d.state", checkpointed), "2")

	// A new checkpoint refuses a process left in a checkpoint state.
	expectCode(t, run(t, home, "checkpoint", "--pid", strconv.Itoa(locked)), cli.ExitUsage, `is locked on the GPU side.*stasis recover --pid`)

	r := mustRun(t, home, "recover")
	for _, want := range []string{
		fmt.Sprintf("PID %d: locked: unlocked", locked),
		fmt.Sprintf("PID %d: checkpointed: restored and unlocked", checkpointed),
		fmt.Sprintf("PID %d: running: none", running),
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("recover did not report %q:\n%s", want, r.stdout)
		}
	}
	for _, pid := range []int{locked, checkpointed, running} {
		if s := f.state(t, pid); s != "0" {
			t.Errorf("PID %d: GPU state %s after recover", pid, s)
		}
	}
}

func TestGPUUnavailable(t *testing.T) {
	f := newFakeDriver(t)
	home, tmp := t.TempDir(), t.TempDir()
	out := filepath.Join(tmp, "count")
	pid := f.start(t, out)
	t.Setenv("STASIS_LIBCUDA", filepath.Join(tmp, "no-libcuda.so.1"))
	expectCode(t, run(t, home, "checkpoint", "--pid", strconv.Itoa(pid)), cli.ExitMissingTool, `PID \d+ uses CUDA: CUDA checkpointing is unavailable: .*no-libcuda\.so\.1`)
	waitCounting(t, out, len(counts(t, out))+3)
	expectCode(t, run(t, home, "recover"), cli.ExitMissingTool, `unavailable`)
}

// TestGPUWatchdog kills stasis with SIGKILL while the job is locked on the
// GPU side (during a slow CUDA checkpoint), in a checkpoint and in a
// migration, through the API and through cuda-checkpoint (which runs on
// after stasis dies): stasis's watchdog notices, and the job is restored
// onto its old GPU, unlocked, and runs on without anyone calling recover.
func TestGPUWatchdog(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		b    gpuBackend
	}{
		{"checkpoint", []string{"checkpoint"}, gpuBackends[0]},
		{"migrate", []string{"migrate", "--to-gpu", "1"}, gpuBackends[0]},
		{"checkpoint through cuda-checkpoint", []string{"checkpoint"}, gpuBackends[1]},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := c.b.driver(t)
			home, tmp := t.TempDir(), t.TempDir()
			out := filepath.Join(tmp, "count")
			pid := f.start(t, out)
			f.set(t, "devices", "2")
			f.set(t, fmt.Sprintf("%d.gpu", pid), "0")
			f.set(t, "slow-checkpoint", "")
			cmd := exec.Command(stasisBin, append(c.args, "--pid", strconv.Itoa(pid))...)
			cmd.Env = append(os.Environ(), "STASIS_HOME="+home)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(10 * time.Second); f.state(t, pid) != "1"; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("stasis never locked the job")
				}
			}
			if c.b.tool {
				// Killed once the (slow) checkpoint tool runs, so that
				// it outlives stasis.
				for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
					log, _ := os.ReadFile(filepath.Join(f.dir, "tool.log"))
					if strings.Contains(string(log), "--action checkpoint") {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("stasis never ran the checkpoint tool: %s", log)
					}
				}
			}
			cmd.Process.Kill()
			cmd.Wait()
			for deadline := time.Now().Add(10 * time.Second); f.state(t, pid) != "0"; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the job is still in GPU state %s after stasis died: no watchdog rescued it", f.state(t, pid))
				}
			}
			waitCounting(t, out, len(counts(t, out))+3)
			logs, _ := filepath.Glob(filepath.Join(home, "logs", "*-watchdog.log"))
			if len(logs) != 1 {
				t.Fatalf("watchdog logs: %v", logs)
			}
			report, _ := os.ReadFile(logs[0])
			if !strings.Contains(string(report), `"action":"unlocked"`) && !strings.Contains(string(report), `"action":"restored and unlocked"`) {
				t.Fatalf("watchdog report: %s", report)
			}
			if gpu := f.gpu(t, pid); gpu != "0" {
				t.Fatalf("the job is on GPU %s after the rescue, want its old GPU 0", gpu)
			}
			if c.b.tool {
				// The watchdog waited for the cuda-checkpoint that
				// stasis left running.
				f.wantCalls(t, pid, "lock P 0", "checkpoint P 0", "restore P 0", "unlock P 0")
			}
		})
	}
}

// TestGPUResumeFailureKeepsCheckpoint makes the CUDA restore fail after a
// --leave-running checkpoint is committed: the error says the checkpoint is
// stored and the job is stuck, the checkpoint is listed, and once the
// driver works again `stasis recover` brings the job back.
func TestGPUResumeFailureKeepsCheckpoint(t *testing.T) {
	f := newFakeDriver(t)
	home, tmp := t.TempDir(), t.TempDir()
	out := filepath.Join(tmp, "count")
	pid := f.start(t, out)
	f.set(t, "fail-restore", "")
	r := run(t, home, "checkpoint", "--pid", strconv.Itoa(pid), "--leave-running")
	expectCode(t, r, cli.ExitError, `checkpoint [0-9a-f-]+ is stored, but the job's GPU side could not be resumed`)
	if recs := list(t, home); len(recs) != 1 {
		t.Fatalf("the stored checkpoint is not listed: %+v", recs)
	}
	os.Remove(filepath.Join(f.dir, "fail-restore"))
	// The watchdog tried while the driver still failed; recover now.
	mustRun(t, home, "recover", "--pid", strconv.Itoa(pid))
	if s := f.state(t, pid); s != "0" {
		t.Fatalf("GPU state %s after recover", s)
	}
	waitCounting(t, out, len(counts(t, out))+3)
}
