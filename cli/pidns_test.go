package cli_test

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stasis-ckpt/stasis/cli"
)

// Tests of process trees in PID namespaces of their own: `stasis run`
// resuming a job whose PIDs are taken (--new-pidns), and checkpoints of
// trees that live in such a namespace. Real CRIU and real processes: they
// need root and CRIU (requireCRIU), some util-linux's unshare.

// takePID starts a process that holds pid, as a process of a fresh
// container would: ns_last_pid makes the next process of this PID
// namespace get pid. A shell does it, a single thread: a thread of this Go
// process could take pid between the two steps and keep it. Other
// processes may get pid first, or hold it for a while: the shell then
// tries again. The holder ends with the test.
func takePID(t *testing.T, pid int) {
	t.Helper()
	script := `p=$1
while :; do
	if [ ! -e /proc/$p ]; then
		echo $((p - 1)) >/proc/sys/kernel/ns_last_pid || exit 1
		sleep 1000 &
		[ $! -eq $p ] && { echo taken; wait; exit; }
		kill $!
	fi
	sleep 0.01
done`
	cmd := exec.Command("sh", "-c", script, "sh", strconv.Itoa(pid))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	taken := make(chan bool, 1)
	go func() {
		line := make([]byte, 6)
		n, _ := io.ReadFull(stdout, line)
		taken <- string(line[:n]) == "taken\n"
	}()
	select {
	case ok := <-taken:
		if !ok {
			t.Fatalf("could not take PID %d", pid)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("could not take PID %d in 30s: other processes keep getting it first", pid)
	}
}

// childOf is the one child of pid.
func childOf(t *testing.T, pid int) int {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(data))
	if len(f) != 1 {
		t.Fatalf("PID %d has children %v; want one", pid, f)
	}
	child, _ := strconv.Atoi(f[0])
	return child
}

// parentOf is pid's parent.
func parentOf(t *testing.T, pid int) int {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// "pid (comm) state ppid ...": comm may hold spaces.
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// expectInNewPIDNS fails unless stasis run's stderr says it resumed the job
// into a new PID namespace, under its old PID there, because another
// process held that PID.
func expectInNewPIDNS(t *testing.T, res result, pid int) {
	t.Helper()
	if want := fmt.Sprintf("into a new PID namespace, where it is PID %d (PID %d is held by sleep", pid, pid); !strings.Contains(res.stderr, want) {
		t.Errorf("stasis run does not say %q:\n%s", want, res.stderr)
	}
}

// TestRunResumesInANewPIDNamespaceWhenAPIDIsTaken: a process-mode job is
// preempted, then another process takes its PID. The next stasis run
// (--new-pidns auto, the default) resumes it in a new PID namespace, where
// it has its old PID; preempted again, it is checkpointed from inside that
// namespace; the third run (the PID still taken) resumes it again and
// passes on its exit status. The counter goes on with no gap or repeat.
func TestRunResumesInANewPIDNamespaceWhenAPIDIsTaken(t *testing.T) {
	requireCRIU(t)
	home, out := t.TempDir(), filepath.Join(t.TempDir(), "count")
	args := []string{"--job", "moved", "--mode", "process", "--", "testdata/count_to.sh", out, "300"}
	first, _ := preemptCounter(t, home, "moved", out, args)
	takePID(t, first.JobPID)

	second := startRun(t, home, args...)
	resumed := waitJobState(t, home, "moved", jobRunning)
	if ids := nsPIDs(t, resumed.JobPID); len(ids) != 2 || ids[0] != resumed.JobPID || ids[1] != first.JobPID {
		t.Fatalf("the resumed job's PIDs (outermost first) are %v; want [%d %d]", ids, resumed.JobPID, first.JobPID)
	}
	if init := parentOf(t, resumed.JobPID); parentOf(t, init) != second.cmd.Process.Pid || nsPIDs(t, init)[1] != 1 {
		t.Fatalf("the resumed job's parent, PID %d, is not its namespace's init, a child of stasis run", init)
	}
	waitCounting(t, out, len(counts(t, out))+10)
	second.signal(t, syscall.SIGUSR1)
	res := second.wait(t)
	expectExit(t, res, cli.ExitPreempted)
	expectInNewPIDNS(t, res, first.JobPID)
	if alive(resumed.JobPID) {
		t.Fatal("the job runs on after its second checkpoint")
	}
	if recs := list(t, home); len(recs) != 2 {
		t.Fatalf("listed: %+v", recs)
	}

	res = startRun(t, home, args...).wait(t)
	expectExit(t, res, 7) // count_to.sh's own status, through the namespace's init
	expectInNewPIDNS(t, res, first.JobPID)
	consecutive(t, counts(t, out))
	if n := len(counts(t, out)); n != 300 {
		t.Fatalf("the job stopped at %d", n)
	}
	if !strings.Contains(res.stdout, "count 300\n") {
		t.Errorf("the resumed job's output was not relayed: %q", lastLine(res.stdout))
	}
}

// TestRunResumesInAFreshContainer: the closest this machine has to a new
// container. The second and third stasis run are PID 1 of a new PID
// namespace with its own /proc (unshare --pid --fork --mount-proc), where
// a process started first holds the job's PID. Each resumes the job in a
// PID namespace nested in that one; the second checkpoints it again from
// inside, and the third passes on its exit status.
func TestRunResumesInAFreshContainer(t *testing.T) {
	requireCRIU(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("util-linux's unshare is not installed")
	}
	home, out := t.TempDir(), filepath.Join(t.TempDir(), "count")
	args := []string{"--job", "pod", "--mode", "process", "--", "testdata/count_to.sh", out, "300"}
	first, _ := preemptCounter(t, home, "pod", out, args)
	inContainer := func() *runningStasis {
		script := fmt.Sprintf(`echo %d >/proc/sys/kernel/ns_last_pid; sleep 1000 & exec "$STASIS_BIN" run "$@"`, first.JobPID-1)
		return startCommand(t, home, exec.Command("unshare", append([]string{"--pid", "--fork", "--mount-proc", "sh", "-c", script, "sh"}, args...)...))
	}

	second := inContainer()
	waitJobState(t, home, "pod", jobRunning)
	waitCounting(t, out, len(counts(t, out))+10)
	// stasis run is unshare's child; the PID in run/pod.pid is 1, the
	// container's.
	if err := syscall.Kill(childOf(t, second.cmd.Process.Pid), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	res := second.wait(t)
	expectExit(t, res, cli.ExitPreempted)
	expectInNewPIDNS(t, res, first.JobPID)

	res = inContainer().wait(t)
	expectExit(t, res, 7)
	expectInNewPIDNS(t, res, first.JobPID)
	consecutive(t, counts(t, out))
	if n := len(counts(t, out)); n != 300 {
		t.Fatalf("the job stopped at %d", n)
	}
}

// TestRunInANewPIDNamespaceForwardsSignalsAndDiesWithStasis: with
// --new-pidns always, the job is resumed in a new PID namespace although
// its PIDs are free. stasis run forwards SIGTERM to it and passes on the
// status it died of; killed with SIGKILL, stasis run takes the job and
// the namespace's init along.
func TestRunInANewPIDNamespaceForwardsSignalsAndDiesWithStasis(t *testing.T) {
	requireCRIU(t)
	home, out := t.TempDir(), filepath.Join(t.TempDir(), "count")
	args := []string{"--job", "ns", "--mode", "process", "--new-pidns", "always", "--", "testdata/count_to.sh", out, "100000"}
	first, _ := preemptCounter(t, home, "ns", out, args)

	r := startRun(t, home, args...)
	resumed := waitJobState(t, home, "ns", jobRunning)
	if ids := nsPIDs(t, resumed.JobPID); len(ids) != 2 || ids[1] != first.JobPID {
		t.Fatalf("the resumed job's PIDs (outermost first) are %v; want %d inside a new namespace", ids, first.JobPID)
	}
	waitCounting(t, out, len(counts(t, out))+5)
	r.signal(t, syscall.SIGTERM)
	res := r.wait(t)
	expectExit(t, res, 128+int(syscall.SIGTERM))
	if !strings.Contains(res.stderr, "(--new-pidns always)") {
		t.Errorf("stderr: %s", res.stderr)
	}

	r = startRun(t, home, args...)
	resumed = waitJobState(t, home, "ns", jobRunning)
	init := parentOf(t, resumed.JobPID)
	waitCounting(t, out, len(counts(t, out))+5)
	r.cmd.Process.Kill()
	r.wait(t)
	waitGone(t, resumed.JobPID)
	waitGone(t, init)
}

// TestCheckpointRefusesAPIDNamespaceWithoutItsProc: CRIU dumps a tree of a
// nested PID namespace from inside, which needs that namespace's /proc in
// the tree's mount namespace. A tree that sees this machine's /proc is
// refused, and runs on.
func TestCheckpointRefusesAPIDNamespaceWithoutItsProc(t *testing.T) {
	requireCRIU(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("util-linux's unshare is not installed")
	}
	home, out := t.TempDir(), filepath.Join(t.TempDir(), "count")
	unshare := startDetached(t, "unshare", "--pid", "--fork", "sh", "-c", `"$0" "$1" & wait`, "testdata/counter.sh", out)
	waitCounting(t, out, 3)
	counter := childOf(t, childOf(t, unshare)) // unshare, sh (PID 1 in there), counter.sh
	if ids := nsPIDs(t, counter); len(ids) != 2 || ids[1] != 2 {
		t.Fatalf("counter.sh's PIDs are %v; want it PID 2 of a new namespace", ids)
	}
	r := run(t, home, "checkpoint", "--pid", strconv.Itoa(counter))
	expectCode(t, r, cli.ExitUsage, fmt.Sprintf(`PID %d runs in a PID namespace of its own whose /proc is not mounted in its mount namespace`, counter))
	waitCounting(t, out, len(counts(t, out))+3)
	if recs := list(t, home); len(recs) != 0 {
		t.Fatalf("listed: %+v", recs)
	}
}
