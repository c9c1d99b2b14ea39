package cli_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stasis-ckpt/stasis/cli"
)

// preflightJSON is the preflight's record, in `checkpoint --json` and in
// the manifest's meta.
type preflightJSON struct {
	CUDAPIDs    []int `json:"cuda_pids"`
	NotCUDAPIDs []int `json:"not_cuda_pids"`
	Options     []struct {
		Option, Value, By, Why string
	} `json:"options"`
	GhostBytes int64 `json:"ghost_bytes"`
}

// option returns what the preflight says of option, and whether it chose it.
func (p preflightJSON) option(name string) (by, value, why string, ok bool) {
	for _, o := range p.Options {
		if o.Option == name {
			return o.By, o.Value, o.Why, true
		}
	}
	return "", "", "", false
}

// checkpointJSON runs `checkpoint --pid pid --json` with args and returns
// the new ID and the preflight's record.
func checkpointJSON(t *testing.T, home string, pid int, args ...string) (string, preflightJSON) {
	t.Helper()
	r := mustRun(t, home, append([]string{"checkpoint", "--pid", strconv.Itoa(pid), "--json"}, args...)...)
	var out struct {
		Record struct {
			ID string `json:"id"`
		} `json:"record"`
		Preflight preflightJSON `json:"preflight"`
	}
	if err := jsonUnmarshal(r.stdout, &out); err != nil {
		t.Fatalf("%v: %s", err, r.stdout)
	}
	return out.Record.ID, out.Preflight
}

// dataLoaderLines reads testdata/dataloader.py's checks.
func dataLoaderLines(t *testing.T, out string) []string {
	t.Helper()
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(data)), "\n")
}

// waitDataLoader waits until the job's parent has made more than n
// checks and every worker has counted more than its count in had, and
// fails on a bad check. It returns the checks and the workers' counts.
func waitDataLoader(t *testing.T, out string, n int, had []int) (int, []int) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(out); err != nil {
			continue
		}
		lines := dataLoaderLines(t, out)
		for _, l := range lines {
			if strings.Contains(l, " bad ") {
				t.Fatalf("the job saw wrong shared memory: %s", l)
			}
		}
		now := make([]int, len(had))
		ahead := len(lines) > n
		for w := range had {
			if _, err := os.Stat(fmt.Sprintf("%s.%d", out, w+1)); err != nil {
				ahead = false
				break
			}
			ns := counts(t, fmt.Sprintf("%s.%d", out, w+1))
			now[w] = len(ns)
			ahead = ahead && now[w] > had[w]
		}
		if ahead {
			return len(lines), now
		}
	}
	t.Fatalf("the job stopped: %d checks, workers at %v", len(dataLoaderLines(t, out)), had)
	return 0, nil
}

// TestCheckpointDataLoaderShapedJob checkpoints a CPU job shaped like a
// training job with DataLoader workers (testdata/dataloader.py: forked
// workers sharing a segment of /dev/shm unlinked while open, a memfd, a
// named semaphore, a parent holding a file lock) with a plain `stasis
// checkpoint --pid P`: the preflight chooses the CRIU options it needs,
// and the job restored goes on with its shared memory, semaphore and lock.
func TestCheckpointDataLoaderShapedJob(t *testing.T) {
	requireCRIU(t)
	requirePython(t)
	home, tmp := t.TempDir(), t.TempDir()
	out := filepath.Join(tmp, "out")
	pid := startDetached(t, "python3", "testdata/dataloader.py", out, "2")
	t.Cleanup(func() {
		if name, err := os.ReadFile(out + ".sem"); err == nil {
			os.Remove(strings.TrimSpace(string(name)))
		}
	})
	checks, workers := waitDataLoader(t, out, 3, []int{0, 0})

	id, plan := checkpointJSON(t, home, pid)
	if len(plan.CUDAPIDs) != 0 || len(plan.NotCUDAPIDs) != 0 {
		t.Fatalf("a CPU job has CUDA processes: %+v", plan)
	}
	if by, _, why, ok := plan.option("file_locks"); !ok || by != "preflight" || !strings.Contains(why, fmt.Sprintf("PID %d (python3) holds a FLOCK WRITE lock on %s.lock", pid, out)) {
		t.Errorf("file_locks: %q %q %v", by, why, ok)
	}
	if by, _, why, ok := plan.option("link_remap"); !ok || by != "preflight" || !strings.Contains(why, "/dev/shm/sem.") {
		t.Errorf("link_remap (the semaphore): %q %q %v", by, why, ok)
	}
	if by, value, why, ok := plan.option("ghost_limit"); !ok || by != "preflight" || value != strconv.Itoa(3<<20) || !strings.Contains(why, "/dev/shm/stasis-dataloader-") {
		t.Errorf("ghost_limit (the 2 MiB segment): %q %q %q %v", by, value, why, ok)
	}
	if plan.GhostBytes < 2<<20 {
		t.Errorf("ghost bytes %d, want the 2 MiB segment", plan.GhostBytes)
	}
	waitGone(t, pid)
	lock, err := os.OpenFile(out+".lock", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()

	restored := restorePID(t, home, id)
	if restored != pid {
		t.Fatalf("restored as PID %d, checkpointed as %d", restored, pid)
	}
	waitDataLoader(t, out, checks+5, workers)
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); !errors.Is(err, syscall.EWOULDBLOCK) {
		t.Fatalf("flock of the job's lock file: %v, want it held by the restored job", err)
	}
}

// TestGPUForkedWorkersAreCPUProcesses checkpoints a stand-in CUDA process
// with two forked workers (they have the library mapped and never
// initialized CUDA, as a DataLoader's fork workers): the driver is asked
// about all three, only the parent is locked and checkpointed, the
// workers are CRIU's alone, and the restored tree counts on.
func TestGPUForkedWorkersAreCPUProcesses(t *testing.T) {
	eachBackend(t, testGPUForkedWorkers)
}

func testGPUForkedWorkers(t *testing.T, b gpuBackend, f *fakeDriver) {
	home, tmp := t.TempDir(), t.TempDir()
	out := filepath.Join(tmp, "count")
	pid := startDetached(t, f.counter, f.lib, out, "2")
	waitCounting(t, out, 3)
	waitCounting(t, out+".1", 3)
	waitCounting(t, out+".2", 3)
	id, plan := checkpointJSON(t, home, pid)
	if len(plan.CUDAPIDs) != 1 || plan.CUDAPIDs[0] != pid || len(plan.NotCUDAPIDs) != 2 {
		t.Fatalf("preflight %+v, want PID %d the one CUDA process and its two workers not", plan, pid)
	}
	f.wantCalls(t, pid, "lock P 0", "checkpoint P 0")
	if b.tool {
		w1, w2 := plan.NotCUDAPIDs[0], plan.NotCUDAPIDs[1]
		f.wantToolRuns(t, pid, "--get-state --pid P", fmt.Sprintf("--get-state --pid %d", w1), fmt.Sprintf("--get-state --pid %d", w2),
			"--action lock --pid P --timeout 10000", "--action checkpoint --pid P")
	}
	waitGone(t, pid)
	at := []int{len(counts(t, out)), len(counts(t, out+".1")), len(counts(t, out+".2"))}
	restorePID(t, home, id)
	f.wantCalls(t, pid, "restore P 0", "unlock P 0")
	for i, name := range []string{out, out + ".1", out + ".2"} {
		consecutive(t, waitCounting(t, name, at[i]+3))
	}
}

// TestPreflightRefusesADeviceMapping checkpoints a job that maps a device
// (a page of an idle loop device, where a DataLoader worker forked from a
// CUDA process maps the NVIDIA devices it inherited, which no CI machine
// has): CRIU could not dump it ("Can't handle non-regular mapping"), so the
// preflight refuses in one line (exit 16) before anything is touched, and
// the job runs on.
func TestPreflightRefusesADeviceMapping(t *testing.T) {
	requireCRIU(t)
	requirePython(t)
	const device = "/dev/loop0"
	if st, err := os.Stat(device); err != nil || st.Mode()&os.ModeDevice == 0 {
		t.Skipf("%s is needed as a device to map", device)
	}
	home, tmp := t.TempDir(), t.TempDir()
	ready := filepath.Join(tmp, "ready")
	pid := startDetached(t, "python3", "../checkpoint/testdata/holder.py", ready, "device:"+device)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		if time.Now().After(deadline) || !alive(pid) {
			t.Fatal("holder.py did not map the device")
		}
	}
	expectCode(t, run(t, home, "checkpoint", "--pid", strconv.Itoa(pid)), cli.ExitRefused,
		fmt.Sprintf(`^stasis: cannot checkpoint: PID %d \(python3\) maps the device %s \(at 0x[0-9a-f]+, 7:0\), which CRIU cannot dump\n$`, pid, device))
	if !alive(pid) || tracedBy(pid) != 0 {
		t.Fatal("the refused job does not run on")
	}
	if recs := list(t, home); len(recs) != 0 {
		t.Fatalf("a refused checkpoint is listed: %+v", recs)
	}
}

// TestPreflightRefusesAStreamSocketOutside checkpoints a job connected to
// a unix stream server outside its tree: CRIU cannot dump one end of such a
// connection, with any option, so the preflight refuses in one line (exit
// 16) naming both processes, before CRIU runs (no log), and the job runs
// on; --ext-unix-sk does not change that.
func TestPreflightRefusesAStreamSocketOutside(t *testing.T) {
	requireCRIU(t)
	requirePython(t)
	home, tmp := t.TempDir(), t.TempDir()
	sock, out := filepath.Join(tmp, "sock"), filepath.Join(tmp, "count")
	server := startDetached(t, "python3", "testdata/unix_server.py", sock)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the unix server did not start")
		}
	}
	pid := startDetached(t, "python3", "testdata/unix_client.py", sock, out)
	waitCounting(t, out, 3)
	for _, flags := range [][]string{nil, {"--ext-unix-sk"}} {
		r := run(t, home, append([]string{"checkpoint", "--pid", strconv.Itoa(pid)}, flags...)...)
		expectCode(t, r, cli.ExitRefused, fmt.Sprintf(`^stasis: cannot checkpoint: PID %d \(python3\) holds a unix stream socket \(socket:\[\d+\]\) whose other end PID %d \(python3\) holds, outside the tree; CRIU cannot dump one end of such a connection: checkpoint a tree that holds both ends, or close the connection first\n$`, pid, server))
	}
	if logs, _ := filepath.Glob(filepath.Join(home, "logs", "*")); len(logs) != 0 {
		t.Fatalf("CRIU ran: %v", logs)
	}
	if recs := list(t, home); len(recs) != 0 {
		t.Fatalf("a refused checkpoint is listed: %+v", recs)
	}
	waitCounting(t, out, len(counts(t, out))+5)
}

// TestCheckpointJobLoggingOutside checkpoints a job whose datagram socket
// is connected to a named socket outside its tree (as a job logging to
// /dev/log): the preflight sets ext_unix_sk, the job is checkpointed with
// no flags, and the restored job's socket is connected to that name again:
// the reader outside gets its datagrams.
func TestCheckpointJobLoggingOutside(t *testing.T) {
	requireCRIU(t)
	requirePython(t)
	home, tmp := t.TempDir(), t.TempDir()
	path, out := filepath.Join(tmp, "log"), filepath.Join(tmp, "count")
	sink, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	pid := startDetached(t, "python3", "testdata/dgram_logger.py", path, out)
	waitCounting(t, out, 3)
	id, plan := checkpointJSON(t, home, pid)
	if by, _, why, ok := plan.option("ext_unix_sk"); !ok || by != "preflight" || why != fmt.Sprintf("PID %d (python3) has a datagram socket connected to %s, outside the tree", pid, path) {
		t.Fatalf("ext_unix_sk: %q %q %v", by, why, ok)
	}
	waitGone(t, pid)
	at := len(counts(t, out))
	// What the job sent before the checkpoint: nothing sends now.
	buf := make([]byte, 64)
	for {
		sink.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if _, err := sink.Read(buf); err != nil {
			break
		}
	}
	restorePID(t, home, id)
	sink.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := sink.Read(buf)
	if err != nil {
		t.Fatalf("no datagram from the restored job: %v", err)
	}
	if got, err := strconv.Atoi(string(buf[:n])); err != nil || got <= at {
		t.Fatalf("the restored job sent %q, want a count past %d", buf[:n], at)
	}
	consecutive(t, waitCounting(t, out, at+5))
}
