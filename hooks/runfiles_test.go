package hooks

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRunFileNamesAreSafeAndDistinct(t *testing.T) {
	plain := newRunFiles("/s", "llama-7b.v2")
	if plain.pidFile() != "/s/run/llama-7b.v2.pid" || plain.notice() != "/s/run/llama-7b.v2.preempt" {
		t.Fatalf("a plain job name is not used as is: %s, %s", plain.pidFile(), plain.notice())
	}
	seen := map[string]string{}
	for _, job := range []string{"team/llama 7b", "team_llama_7b", "team/llama_7b", "../../etc", strings.Repeat("x", 200)} {
		f := newRunFiles("/s", job)
		if filepath.Dir(f.pidFile()) != "/s/run" || len(filepath.Base(f.pidFile())) > 100 || strings.HasPrefix(filepath.Base(f.pidFile()), ".") {
			t.Errorf("job %q: pid file %s", job, f.pidFile())
		}
		if other, ok := seen[f.base]; ok {
			t.Errorf("jobs %q and %q share the file name %s", job, other, f.base)
		}
		seen[f.base] = job
	}
}

func TestPIDFileAdmitsOneRunPerJob(t *testing.T) {
	f := newRunFiles(t.TempDir(), "job")
	if _, running := f.runningPID(); running {
		t.Fatal("a job nobody runs is reported running")
	}
	held, err := f.lockPID("job")
	if err != nil {
		t.Fatal(err)
	}
	if pid, running := f.runningPID(); !running || pid != os.Getpid() {
		t.Fatalf("runningPID = %d, %v; want this process", pid, running)
	}
	if _, err := f.lockPID("job"); !errors.Is(err, ErrAlreadyRunning) {
		t.Fatalf("a second run of the job got %v, want ErrAlreadyRunning", err)
	}
	f.release(held)
	if _, running := f.runningPID(); running {
		t.Fatal("the job is still reported running after its run released it")
	}
	again, err := f.lockPID("job")
	if err != nil {
		t.Fatalf("the job cannot run again after a release: %v", err)
	}
	f.release(again)
}

func TestLeftoverPIDFileIsNotARun(t *testing.T) {
	f := newRunFiles(t.TempDir(), "job")
	os.MkdirAll(f.dir, 0o700)
	// What a stasis run killed with SIGKILL leaves: its PID, no lock.
	if err := os.WriteFile(f.pidFile(), []byte("1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if pid, running := f.runningPID(); running {
		t.Fatalf("a leftover PID file (PID %d) is taken for a running stasis run", pid)
	}
	held, err := f.lockPID("job")
	if err != nil {
		t.Fatalf("a leftover PID file blocks the next run: %v", err)
	}
	f.release(held)
}
