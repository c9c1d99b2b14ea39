package cli_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stasis-ckpt/stasis/cli"
)

// These tests move a job between the stand-in driver's two GPUs (see
// gpu_logic_test.go): the driver calls in order, the GPU pairs given, and
// where the job ends up.

// onTwoGPUs starts a counter that maps the stand-in driver, on GPU 0 of
// two.
func onTwoGPUs(t *testing.T) (*fakeDriver, int, string) {
	t.Helper()
	f := newFakeDriver(t)
	f.set(t, "devices", "2")
	out := filepath.Join(t.TempDir(), "count")
	pid := f.start(t, out)
	f.set(t, fmt.Sprintf("%d.gpu", pid), "0")
	return f, pid, out
}

func TestMigrate(t *testing.T) {
	f, pid, out := onTwoGPUs(t)
	home := t.TempDir()
	p := strconv.Itoa(pid)
	r := mustRun(t, home, "migrate", "--pid", p, "--to-gpu", "1")
	// The driver needs every GPU in the pairs: 0 goes to 1, 1 to 0.
	f.wantCalls(t, pid, "lock P 0", "checkpoint P 0", "restore P 0 0>1 1>0", "unlock P 0")
	if !regexp.MustCompile(`^migrated PID \d+ \(GPU 0 -> GPU 1, GPU 1 -> GPU 0\): lock \S+, checkpoint \S+, restore \S+, unlock \S+, total \S+\n$`).MatchString(r.stdout) {
		t.Errorf("output %q", r.stdout)
	}
	if f.gpu(t, pid) != "1" || f.state(t, pid) != "0" {
		t.Fatalf("after the migration: GPU %s, state %s", f.gpu(t, pid), f.state(t, pid))
	}
	consecutive(t, waitCounting(t, out, len(counts(t, out))+5))

	// Already there: nothing happens.
	r = mustRun(t, home, "migrate", "--pid", p, "--to-gpu", "GPU-11121314-1516-1718-191a-1b1c1d1e1f20")
	if !strings.Contains(r.stdout, "nothing to do") {
		t.Errorf("a migration to where the job runs: %q", r.stdout)
	}
	f.wantCalls(t, pid)

	// Back by --gpu-map, with the timings as JSON.
	r = mustRun(t, home, "migrate", "--pid", p, "--gpu-map", "1=0", "--json")
	f.wantCalls(t, pid, "lock P 0", "checkpoint P 0", "restore P 0 0>1 1>0", "unlock P 0")
	var res struct {
		Moves []struct {
			From struct{ Index int } `json:"from"`
			To   struct{ Index int } `json:"to"`
		} `json:"moves"`
		CUDAPIDs []int   `json:"cuda_pids"`
		Total    float64 `json:"total_seconds"`
		Restore  float64 `json:"restore_seconds"`
	}
	if err := jsonUnmarshal(r.stdout, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Moves) != 2 || res.Moves[1].From.Index != 1 || res.Moves[1].To.Index != 0 || len(res.CUDAPIDs) != 1 || res.CUDAPIDs[0] != pid || res.Total < res.Restore {
		t.Errorf("--json: %+v", res)
	}
	if f.gpu(t, pid) != "0" {
		t.Fatalf("back on GPU %s, want 0", f.gpu(t, pid))
	}
	consecutive(t, waitCounting(t, out, len(counts(t, out))+5))
}

// TestMigrateRollsBack makes the restore onto the new GPU fail: the job is
// restored onto its old GPU and unlocked, and runs on.
func TestMigrateRollsBack(t *testing.T) {
	f, pid, out := onTwoGPUs(t)
	f.set(t, "fail-restore-pairs", "")
	r := run(t, t.TempDir(), "migrate", "--pid", strconv.Itoa(pid), "--to-gpu", "1")
	expectCode(t, r, cli.ExitError, `the migration failed and was rolled back; the job runs on: cuCheckpointProcessRestore\(pid \d+\): CUDA_ERROR_UNKNOWN`)
	f.wantCalls(t, pid, "lock P 0", "checkpoint P 0", "restore P 999 0>1 1>0", "restore P 0", "unlock P 0")
	if f.gpu(t, pid) != "0" || f.state(t, pid) != "0" {
		t.Fatalf("after the rollback: GPU %s, state %s", f.gpu(t, pid), f.state(t, pid))
	}
	consecutive(t, waitCounting(t, out, len(counts(t, out))+5))
}

// TestMigrateRollsBackMovedProcesses migrates a tree of two CUDA
// processes and fails the restore of the second: the first, already on
// the new GPU, is moved back, and both run on their old GPU.
func TestMigrateRollsBackMovedProcesses(t *testing.T) {
	f := newFakeDriver(t)
	f.set(t, "devices", "2")
	root, pids, outs := twoCUDAProcesses(t, f)
	a, b := outs[0], outs[1]
	first, second := strconv.Itoa(pids[0]), strconv.Itoa(pids[1])
	kids := []string{first, second}
	f.set(t, "fail-restore-pairs", second)
	r := run(t, t.TempDir(), "migrate", "--pid", strconv.Itoa(root), "--gpu-map", "0=1")
	expectCode(t, r, cli.ExitError, `the migration failed and was rolled back`)
	want := []string{
		"lock " + first + " 0", "lock " + second + " 0", "checkpoint " + first + " 0", "checkpoint " + second + " 0",
		"restore " + first + " 0 0>1 1>0", "restore " + second + " 999 0>1 1>0",
		"checkpoint " + first + " 0", "restore " + first + " 0 1>0 0>1", // moved back
		"restore " + second + " 0", "unlock " + second + " 0", "unlock " + first + " 0",
	}
	if got := f.calls(t); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("driver calls:\n got  %q\n want %q", got, want)
	}
	for _, k := range kids {
		pid, _ := strconv.Atoi(k)
		if f.gpu(t, pid) != "0" || f.state(t, pid) != "0" {
			t.Errorf("PID %d after the rollback: GPU %s, state %s", pid, f.gpu(t, pid), f.state(t, pid))
		}
	}
	waitCounting(t, a, len(counts(t, a))+3)
	waitCounting(t, b, len(counts(t, b))+3)
}

// twoCUDAProcesses starts a tree of two counters that map the stand-in
// driver, on GPU 0 of two, and returns its root, the two counters and their
// output files.
func twoCUDAProcesses(t *testing.T, f *fakeDriver) (root int, kids []int, outs []string) {
	t.Helper()
	tmp := t.TempDir()
	outs = []string{filepath.Join(tmp, "a"), filepath.Join(tmp, "b")}
	root = startDetached(t, "sh", "-c", fmt.Sprintf("%q %q %q & %q %q %q & wait", f.counter, f.lib, outs[0], f.counter, f.lib, outs[1]))
	for _, out := range outs {
		waitCounting(t, out, 3)
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", root, root))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range strings.Fields(string(data)) {
		pid, _ := strconv.Atoi(k)
		kids = append(kids, pid)
	}
	if len(kids) != 2 {
		t.Fatalf("children %v", kids)
	}
	return root, kids, outs
}

// TestMigrateWatchdogMovesBack kills stasis migrate once the first of two
// CUDA processes is on its new GPU and the second is being restored: the
// watchdog moves the first back and restores the second onto its old GPU,
// so the job is not left split across GPUs.
func TestMigrateWatchdogMovesBack(t *testing.T) {
	f := newFakeDriver(t)
	f.set(t, "devices", "2")
	root, kids, outs := twoCUDAProcesses(t, f)
	f.set(t, "slow-restore", "")
	home := t.TempDir()
	cmd := exec.Command(stasisBin, "migrate", "--pid", strconv.Itoa(root), "--gpu-map", "0=1")
	cmd.Env = append(os.Environ(), "STASIS_HOME="+home)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); f.gpu(t, kids[0]) != "1"; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("the first process never moved")
		}
	}
	cmd.Process.Kill() // the second is in its (slow) restore
	cmd.Wait()
	for _, pid := range kids {
		for deadline := time.Now().Add(30 * time.Second); f.state(t, pid) != "0" || f.gpu(t, pid) != "0"; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				logs, _ := filepath.Glob(filepath.Join(home, "logs", "*"))
				var report []byte
				for _, l := range logs {
					b, _ := os.ReadFile(l)
					report = append(report, b...)
				}
				t.Fatalf("PID %d after stasis died: GPU %s, state %s; want GPU 0, running; calls %q; watchdog: %s", pid, f.gpu(t, pid), f.state(t, pid), f.calls(t), report)
			}
		}
	}
	for _, out := range outs {
		waitCounting(t, out, len(counts(t, out))+3)
	}
	logs, _ := filepath.Glob(filepath.Join(home, "logs", "*"))
	var report []byte
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		report = append(report, b...)
	}
	if !strings.Contains(string(report), "died mid-migration") || !strings.Contains(string(report), fmt.Sprintf(`"pid":%d,"before":"locked","action":"moved back to its old GPUs","ok":true`, kids[0])) {
		t.Fatalf("watchdog report: %s", report)
	}
}

func TestMigrateRefuses(t *testing.T) {
	f, pid, out := onTwoGPUs(t)
	home := t.TempDir()
	p := strconv.Itoa(pid)
	expectCode(t, run(t, home, "migrate", "--pid", p, "--to-gpu", "5"), cli.ExitMismatch, `--to-gpu 5 is not a GPU of this machine \(it has 2\)`)
	expectCode(t, run(t, home, "migrate", "--pid", p, "--gpu-map", "0=7"), cli.ExitMismatch, `--gpu-map names GPU 7, which is not a GPU of this machine`)
	expectCode(t, run(t, home, "migrate", "--pid", p, "--to-gpu", "one"), cli.ExitUsage, `--to-gpu: "one" is neither a GPU index nor a GPU UUID`)
	expectCode(t, run(t, home, "migrate", "--pid", p), cli.ExitUsage, `either --gpu-map OLD=NEW,... or --to-gpu N`)
	expectCode(t, run(t, home, "migrate", "--pid", p, "--to-gpu", "1", "--gpu-map", "0=1"), cli.ExitUsage, `either --gpu-map`)
	plain := startDetached(t, "testdata/counter.sh", filepath.Join(t.TempDir(), "plain"))
	expectCode(t, run(t, home, "migrate", "--pid", strconv.Itoa(plain), "--to-gpu", "1"), cli.ExitUsage, `no process of the tree of PID \d+ uses CUDA`)
	f.wantCalls(t, pid)

	// A lock that times out: rolled back, exit 10.
	f.set(t, "fail-lock", "")
	expectCode(t, run(t, home, "migrate", "--pid", p, "--to-gpu", "1", "--gpu-lock-timeout", "200ms"), cli.ExitGPUTimeout,
		`migration failed and was rolled back; the job runs on: GPU work of PID \d+ did not finish within the lock timeout of 200ms`)
	f.wantCalls(t, pid, "lock P 600")
	if f.gpu(t, pid) != "0" || f.state(t, pid) != "0" {
		t.Fatalf("after a lock timeout: GPU %s, state %s", f.gpu(t, pid), f.state(t, pid))
	}
	waitCounting(t, out, len(counts(t, out))+3)
}
