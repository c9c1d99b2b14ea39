package cli_test

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stasis-ckpt/stasis/cli"
)

// The tests of gpu_logic_test.go run once more (gpuBackends) on a driver
// whose libcuda lacks the checkpoint API (the stand-in built with
// -DNO_CHECKPOINT_API), so that stasis makes the checkpoint calls through
// cuda-checkpoint: the stand-in of cuda/testdata/fakecuda/cuda-checkpoint.c,
// which makes the stand-in driver's calls. The driver calls (calls.log) are
// those of the API path; tool.log shows that the tool made them, with
// which arguments. The tests here are the tool's own.

// newToolDriver is newFakeDriver with a libcuda without the checkpoint API,
// mapped by the counters and loaded by stasis, and cuda-checkpoint named
// by $STASIS_CUDA_CHECKPOINT.
func newToolDriver(t *testing.T) (*fakeDriver, string) {
	t.Helper()
	f := newFakeDriver(t)
	bin := t.TempDir()
	f.lib = filepath.Join(bin, "libcuda.so.1")
	tool := filepath.Join(bin, "cuda-checkpoint")
	for _, args := range [][]string{
		{"-shared", "-fPIC", "-DNO_CHECKPOINT_API", "-o", f.lib, "../cuda/testdata/fakecuda/libcuda.c"},
		{"-o", tool, "../cuda/testdata/fakecuda/cuda-checkpoint.c"},
	} {
		if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
			t.Fatalf("gcc %v: %v\n%s", args, err, out)
		}
	}
	t.Setenv("STASIS_LIBCUDA", f.lib)
	t.Setenv("STASIS_CUDA_CHECKPOINT", tool)
	return f, tool
}

// toolRuns returns the cuda-checkpoint runs since the last call, with the
// PID written P.
func (f *fakeDriver) toolRuns(t *testing.T, pid int) []string {
	t.Helper()
	path := filepath.Join(f.dir, "tool.log")
	data, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	os.Remove(path)
	var runs []string
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if l != "" {
			runs = append(runs, strings.ReplaceAll(l, "--pid "+strconv.Itoa(pid), "--pid P"))
		}
	}
	return runs
}

func (f *fakeDriver) wantToolRuns(t *testing.T, pid int, want ...string) {
	t.Helper()
	if got := f.toolRuns(t, pid); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("cuda-checkpoint runs:\n got  %q\n want %q", got, want)
	}
}

// TestToolStepByStep drives `stasis cuda` through cuda-checkpoint, once
// named by $STASIS_CUDA_CHECKPOINT and once found beside a stasis binary.
func TestToolStepByStep(t *testing.T) {
	f, tool := newToolDriver(t)
	home := t.TempDir()
	pid := f.start(t, filepath.Join(t.TempDir(), "count"))
	p := strconv.Itoa(pid)
	for _, step := range []struct{ args, want string }{
		{"state", "running"},
		{"lock --timeout 1500ms", "locked"},
		{"checkpoint", "checkpointed"},
		{"restore", "locked"},
		{"unlock", "running"},
	} {
		args := append([]string{"cuda"}, strings.Fields(step.args)...)
		r := mustRun(t, home, append(args, "--pid", p)...)
		if !regexp.MustCompile(`^` + step.want + ` \(\S+\)\n$`).MatchString(r.stdout) {
			t.Fatalf("stasis cuda %s: %q", step.args, r.stdout)
		}
	}
	f.wantCalls(t, pid, "lock P 0", "checkpoint P 0", "restore P 0", "unlock P 0")
	if runs := f.toolRuns(t, pid); len(runs) != 9 || runs[1] != "--action lock --pid P --timeout 1500" {
		t.Fatalf("cuda-checkpoint runs: %q", runs)
	}
	expectCode(t, run(t, home, "cuda", "unlock", "--pid", p), cli.ExitError,
		`^stasis: cuda-checkpoint --action unlock --pid \d+: Could not unlock on process ID \d+: "the operation cannot be performed in the present state" \(exit status 1\)\n$`)
	f.toolRuns(t, pid)

	// Beside the binary: a copy of stasis with the tool next to it, no
	// $STASIS_CUDA_CHECKPOINT, no cuda-checkpoint on PATH.
	dir := t.TempDir()
	copyExecutable(t, stasisBin, filepath.Join(dir, "stasis"))
	copyExecutable(t, tool, filepath.Join(dir, "cuda-checkpoint"))
	t.Setenv("STASIS_CUDA_CHECKPOINT", "")
	t.Setenv("PATH", pathWithoutTool(t))
	r := runWithHome(t, home, exec.Command(filepath.Join(dir, "stasis"), "cuda", "state", "--pid", p))
	if r.code != 0 || !strings.HasPrefix(r.stdout, "running ") {
		t.Fatalf("stasis beside cuda-checkpoint: exit %d, %q, %q", r.code, r.stdout, r.stderr)
	}
	f.wantToolRuns(t, pid, "--get-state --pid P")
}

func copyExecutable(t *testing.T, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}

// pathWithoutTool is $PATH without the directories that hold a
// cuda-checkpoint.
func pathWithoutTool(t *testing.T) string {
	t.Helper()
	var keep []string
	for _, d := range filepath.SplitList(os.Getenv("PATH")) {
		if _, err := os.Stat(filepath.Join(d, "cuda-checkpoint")); err != nil {
			keep = append(keep, d)
		}
	}
	return strings.Join(keep, string(filepath.ListSeparator))
}

// TestToolMissing: libcuda without the API and no cuda-checkpoint is exit
// 8 with one line naming both ways out, and the job runs on.
func TestToolMissing(t *testing.T) {
	f, _ := newToolDriver(t)
	home, tmp := t.TempDir(), t.TempDir()
	out := filepath.Join(tmp, "count")
	pid := f.start(t, out)
	t.Setenv("STASIS_CUDA_CHECKPOINT", "")
	t.Setenv("PATH", pathWithoutTool(t))
	expectCode(t, run(t, home, "checkpoint", "--pid", strconv.Itoa(pid)), cli.ExitMissingTool,
		`^stasis: PID \d+ uses CUDA: CUDA checkpointing is unavailable: \S+/libcuda\.so\.1 lacks the checkpoint API \(cuCheckpointProcess\*; drivers before 570\) and no cuda-checkpoint was found: upgrade the NVIDIA driver to 570 or later, or install NVIDIA's cuda-checkpoint \(on PATH, beside stasis, or named by \$STASIS_CUDA_CHECKPOINT\)\n$`)
	expectCode(t, run(t, home, "recover"), cli.ExitMissingTool, `lacks the checkpoint API .* no cuda-checkpoint was found`)
	f.wantCalls(t, pid)
	waitCounting(t, out, len(counts(t, out))+3)

	// $STASIS_CUDA_CHECKPOINT naming what is not there is no reason to
	// look elsewhere.
	t.Setenv("STASIS_CUDA_CHECKPOINT", filepath.Join(tmp, "cuda-checkpoint"))
	expectCode(t, run(t, home, "cuda", "state", "--pid", strconv.Itoa(pid)), cli.ExitMissingTool,
		`and \$STASIS_CUDA_CHECKPOINT names \S+/cuda-checkpoint, which does not exist: upgrade`)
}

// TestToolRemap: with --device-map, a migration and a restore onto the
// other GPU go through cuda-checkpoint; a cuda-checkpoint without it
// refuses both before anything changes (exit 8).
func TestToolRemap(t *testing.T) {
	f, _ := newToolDriver(t)
	f.set(t, "devices", "2")
	home, tmp := t.TempDir(), t.TempDir()
	out := filepath.Join(tmp, "count")
	pid := f.start(t, out)
	f.set(t, fmt.Sprintf("%d.gpu", pid), "0")
	p := strconv.Itoa(pid)
	gpu0, gpu1 := "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f", "GPU-11121314-1516-1718-191a-1b1c1d1e1f20"

	mustRun(t, home, "migrate", "--pid", p, "--to-gpu", "1")
	f.wantCalls(t, pid, "lock P 0", "checkpoint P 0", "restore P 0 0>1 1>0", "unlock P 0")
	if runs := f.toolRuns(t, pid); !slices.Contains(runs, "--help") || !slices.Contains(runs, "--action restore --pid P --device-map "+gpu0+"="+gpu1+","+gpu1+"="+gpu0) {
		t.Fatalf("cuda-checkpoint runs: %q", runs)
	}
	if f.gpu(t, pid) != "1" || f.state(t, pid) != "0" {
		t.Fatalf("after the migration: GPU %s, state %s", f.gpu(t, pid), f.state(t, pid))
	}

	f.set(t, "tool-no-device-map", "")
	refused := `\S+/cuda-checkpoint cannot restore GPU state onto other GPUs: its --help lists no --device-map \(it came with CUDA 13\.0\); restore onto the checkpoint's own GPUs, or install a newer cuda-checkpoint or an NVIDIA driver with the checkpoint API\n$`
	expectCode(t, run(t, home, "migrate", "--pid", p, "--to-gpu", "0"), cli.ExitMissingTool, refused)
	f.wantCalls(t, pid)
	if f.gpu(t, pid) != "1" || f.state(t, pid) != "0" {
		t.Fatalf("after a refused migration: GPU %s, state %s", f.gpu(t, pid), f.state(t, pid))
	}

	// A checkpoint, then restores: onto GPU 0 (the job ran on 1) refused
	// before CRIU runs; onto its own GPU it goes on.
	id := checkpointPID(t, home, pid)
	waitGone(t, pid)
	f.wantCalls(t, pid, "lock P 0", "checkpoint P 0")
	expectCode(t, run(t, home, "restore", "--gpu-map", "1=0", id), cli.ExitMissingTool, `^stasis: the restore moves GPU state onto other GPUs: CUDA checkpointing is unavailable: `+refused)
	if alive(pid) {
		t.Fatal("a refused restore ran CRIU")
	}
	f.wantCalls(t, pid)
	restorePID(t, home, id)
	f.wantCalls(t, pid, "restore P 0", "unlock P 0")
	consecutive(t, waitCounting(t, out, len(counts(t, out))+5))
}
