package cuda

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestNotInitialized runs the stand-in's counter with a forked worker (a
// DataLoader's shape: the parent initialized CUDA, the worker inherited
// the library and never did) and asks each backend for both states: the
// parent runs, the worker is not a CUDA process.
func TestNotInitialized(t *testing.T) {
	for _, backend := range []string{"api", "cuda-checkpoint"} {
		t.Run(backend, func(t *testing.T) {
			var d *Driver
			var lib string
			if backend == "api" {
				lib = buildLib(t, "testdata/fakecuda/libcuda.c", "")
				t.Setenv("STASIS_FAKE_CUDA_DIR", t.TempDir())
				var err error
				if d, err = load(lib); err != nil {
					t.Fatal(err)
				}
			} else {
				lib = buildLib(t, "testdata/fakecuda/libcuda.c", "-DNO_CHECKPOINT_API")
				d, _, _ = toolDriver(t)
			}
			parent, worker := startWithWorker(t, lib)
			if st, err := d.ProcessState(parent); err != nil || st != Running || NotInitialized(err) {
				t.Fatalf("the parent: %v, %v", st, err)
			}
			_, err := d.ProcessState(worker)
			if !NotInitialized(err) {
				t.Fatalf("the forked worker: %v, want CUDA_ERROR_NOT_INITIALIZED", err)
			}
			if want := "initialization error"; backend == "api" {
				if want = fmt.Sprintf("cuCheckpointProcessGetState(pid %d): CUDA_ERROR_NOT_INITIALIZED", worker); err.Error() != want {
					t.Fatalf("error %q, want %q", err, want)
				}
			} else if !strings.Contains(err.Error(), want) {
				t.Fatalf("error %q does not say %q", err, want)
			}
			// Other failures are not "not initialized".
			if err := d.Unlock(parent); err == nil || NotInitialized(err) {
				t.Fatalf("unlock of a running process: %v", err)
			}
		})
	}
	if NotInitialized(nil) || NotInitialized(errors.New("initialization error")) {
		t.Fatal("NotInitialized takes only the driver's and the tool's errors")
	}
}

// startWithWorker starts the stand-in counter on lib with one forked
// worker and returns both PIDs; both end with the test.
func startWithWorker(t *testing.T, lib string) (parent, worker int) {
	t.Helper()
	counter := filepath.Join(t.TempDir(), "counter")
	if out, err := exec.Command("gcc", "-o", counter, "testdata/fakecuda/counter.c", "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	out := filepath.Join(t.TempDir(), "count")
	cmd := exec.Command(counter, lib, out, "1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	parent = cmd.Process.Pid
	t.Cleanup(func() {
		if worker != 0 {
			if p, err := os.FindProcess(worker); err == nil {
				p.Kill()
			}
		}
		cmd.Process.Kill()
		cmd.Wait()
	})
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		kids, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", parent, parent))
		if f := strings.Fields(string(kids)); len(f) == 1 {
			worker, _ = strconv.Atoi(f[0])
		}
		if _, err := os.Stat(out + ".1"); err == nil && worker != 0 {
			return parent, worker
		}
	}
	t.Fatal("the counter's worker did not start counting")
	return 0, 0
}
