package restore

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stasis-ckpt/stasis/checkpoint"
	"github.com/stasis-ckpt/stasis/criu"
)

func treeOf(pid int) checkpoint.Meta {
	return checkpoint.Meta{Processes: []checkpoint.Process{{PID: pid, Threads: []int{pid}}}}
}

// freePID is a PID no process holds now.
func freePID(t *testing.T) int {
	t.Helper()
	data, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		t.Fatal(err)
	}
	max, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	for pid := max - 1; pid > 1; pid-- {
		if h, _ := checkpoint.PIDHolder(pid); h == "" {
			return pid
		}
	}
	t.Fatal("no free PID")
	return 0
}

// zombie is a child of this test that has ended and is not reaped yet.
func zombie(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Wait() })
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, z := checkpoint.PIDHolder(cmd.Process.Pid); z {
			return cmd.Process.Pid
		}
	}
	t.Fatal("true did not end")
	return 0
}

func TestNeedNewPIDNS(t *testing.T) {
	ctx := context.Background()
	held, free, dead := os.Getpid(), freePID(t), zombie(t)
	for _, c := range []struct {
		name  string
		pid   int
		mode  PIDNSMode
		want  bool
		taken string // what the reason says, "" for none
	}{
		{"free, never", free, PIDNSNever, false, ""},
		{"free, auto", free, PIDNSAuto, false, ""},
		{"free, always", free, PIDNSAlways, true, ""},
		{"running holder, auto", held, PIDNSAuto, true, "is held by"},
		{"zombie holder, auto", dead, PIDNSAuto, true, "a zombie"},
	} {
		// A running holder sends auto into a namespace at once, without
		// the wait that a zombie gets.
		wait := time.Duration(0)
		if c.pid == held {
			wait = time.Hour
		}
		got, taken, err := needNewPIDNS(ctx, treeOf(c.pid), c.mode, wait)
		if err != nil || got != c.want || !strings.Contains(taken, c.taken) || (c.taken == "") != (taken == "") {
			t.Errorf("%s: %v, %q, %v; want %v, %q", c.name, got, taken, err, c.want, c.taken)
		}
	}
	for _, pid := range []int{held, dead} {
		_, _, err := needNewPIDNS(ctx, treeOf(pid), PIDNSNever, 0)
		if !errors.Is(err, ErrPIDInUse) || !strings.Contains(err.Error(), "--new-pidns") {
			t.Errorf("PID %d taken, never: %v", pid, err)
		}
	}
}

func TestParsePIDNSMode(t *testing.T) {
	for _, s := range []string{"auto", "always", "never"} {
		if m, err := ParsePIDNSMode(s); err != nil || string(m) != s {
			t.Errorf("%s: %v %v", s, m, err)
		}
	}
	if _, err := ParsePIDNSMode("sometimes"); err == nil {
		t.Error("sometimes: no error")
	}
}

// TestPIDTakenDuringRestore: CRIU failing because a PID was taken after
// stasis checked it is ErrPIDInUse (exit 9), with the way out; other CRIU
// failures are left as they are.
func TestPIDTakenDuringRestore(t *testing.T) {
	taken := &criu.Error{Op: "restore", Err: errors.New("exit status 1"), Log: "restore.log", Excerpt: []string{"Can't fork for 4242: File exists"}}
	err := pidTakenDuringRestore(taken)
	if !errors.Is(err, ErrPIDInUse) || !strings.Contains(err.Error(), "--new-pidns") || !strings.Contains(err.Error(), "4242") {
		t.Fatalf("a PID taken during the restore: %v", err)
	}
	other := &criu.Error{Op: "restore", Err: errors.New("exit status 1"), Excerpt: []string{"Can't open file"}}
	if err := pidTakenDuringRestore(other); err != error(other) {
		t.Fatalf("another CRIU failure became %v", err)
	}
}
