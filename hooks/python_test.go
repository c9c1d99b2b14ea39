package hooks

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The Python side of the protocol (python/stasis/_run.py), driven by the
// notice that Run writes (writeNotice).

func pythonCommand(t *testing.T, env []string, code string) *exec.Cmd {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed")
	}
	pkg, _ := filepath.Abs("../python")
	cmd := exec.Command(py, "-c", code)
	cmd.Env = append(os.Environ(), append(env, "PYTHONPATH="+pkg)...)
	cmd.Stderr = os.Stderr
	return cmd
}

func TestPythonOutsideStasisRun(t *testing.T) {
	var unset []string
	for _, v := range []string{EnvPreemptFile, EnvResumeID, EnvResumeStep} {
		unset = append(unset, v+"=")
	}
	out, err := pythonCommand(t, unset, `
from stasis._run import preempted, preemption, on_preempt, resume_id, resume_step
print(preempted(), preemption(), on_preempt(print), resume_id(), resume_step())`).Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(out)); got != "False None None None None" {
		t.Fatalf("outside stasis run: %s", got)
	}
}

func TestPythonSeesTheNoticeAndAcknowledgesIt(t *testing.T) {
	notice := filepath.Join(t.TempDir(), "job.preempt")
	cmd := pythonCommand(t, []string{EnvPreemptFile + "=" + notice, EnvResumeID + "=5c1d", EnvResumeStep + "=1200"}, `
import os, threading
from stasis._run import preempted, preemption, on_preempt, resume_id, resume_step
path = os.environ["STASIS_PREEMPT_FILE"]
calls = []
fired = threading.Event()
def callback(notice):
    calls.append(notice)
    fired.set()
on_preempt(callback, interval=0.01)
print("before:", preempted(), os.path.exists(path + ".ack"), flush=True)
fired.wait(10)
print("after:", preempted(), preemption(), len(calls), calls[0] == preemption(),
      os.path.exists(path + ".ack"), resume_id(), resume_step(), flush=True)
`)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	lines := bufio.NewScanner(stdout)
	lines.Scan()
	if got := lines.Text(); got != "before: False False" {
		t.Fatalf("before the notice: %s", got)
	}
	if err := writeNotice(notice, syscall.SIGUSR1, time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)); err != nil {
		t.Fatal(err)
	}
	lines.Scan()
	want := "after: True {'signal': 'USR1', 'deadline': '2030-01-02T03:04:05Z'} 1 True True 5c1d 1200"
	if got := lines.Text(); got != want {
		t.Fatalf("after the notice:\ngot  %s\nwant %s", got, want)
	}
}
