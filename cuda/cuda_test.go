package cuda

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// buildLib compiles C source into a shared library named libcuda.so.1,
// with the extra gcc flag when one is given.
func buildLib(t *testing.T, src, flag string) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc is needed to build a stand-in driver")
	}
	lib := filepath.Join(t.TempDir(), "libcuda.so.1")
	args := []string{"-shared", "-fPIC", "-o", lib, src}
	if flag != "" {
		args = append(args, flag)
	}
	if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return lib
}

func TestUUIDs(t *testing.T) {
	var b [16]byte
	for i := range b {
		b[i] = byte(0xa0 + i)
	}
	s := FormatUUID(b)
	if s != "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf" {
		t.Fatalf("FormatUUID = %s", s)
	}
	for _, in := range []string{s, strings.TrimPrefix(s, "GPU-"), strings.ToUpper(s[4:])} {
		if got, err := ParseUUID(in); err != nil || got != b {
			t.Errorf("ParseUUID(%q) = %x, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "GPU-12", "GPU-zz0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf"} {
		if _, err := ParseUUID(bad); err == nil {
			t.Errorf("ParseUUID(%q) accepted", bad)
		}
	}
}

func TestLoadUnavailable(t *testing.T) {
	if _, err := load(filepath.Join(t.TempDir(), "libcuda.so.1")); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("missing library: %v", err)
	}
	src := filepath.Join(t.TempDir(), "not-a-driver.c")
	os.WriteFile(src, []byte("int cuInit(unsigned f) { return 0; }\n"), 0o600)
	if _, err := load(buildLib(t, src, "")); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "lacks cuDeviceGet, cuDeviceGetCount") {
		t.Fatalf("library without the device calls: %v", err)
	}
	// A library without the checkpoint API, like drivers before 570, and
	// no cuda-checkpoint: the library loads (for the memory calls), the
	// process calls fail naming both ways out.
	src = filepath.Join(t.TempDir(), "old.c")
	os.WriteFile(src, []byte("int cuInit(unsigned f) { return 0; }\nint cuDriverGetVersion(int *v) { *v = 12020; return 0; }\n"+
		"int cuDeviceGetCount(int *n) { *n = 0; return 0; }\nint cuDeviceGet(int *d, int o) { return 1; }\n"+
		"int cuDeviceGetName(char *s, int n, int d) { return 1; }\nint cuDeviceGetUuid(void *u, int d) { return 1; }\n"), 0o600)
	lib := buildLib(t, src, "")
	noTool(t)
	d, err := load(lib)
	if err != nil {
		t.Fatal(err)
	}
	if b := d.Backend(); b.Kind != "" {
		t.Fatalf("backend %+v without the API or cuda-checkpoint", b)
	}
	err = d.Lock(1, 0)
	if !errors.Is(err, ErrUnavailable) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("lock without a backend: %v", err)
	}
	for _, want := range []string{"lacks the checkpoint API", "no cuda-checkpoint was found", "upgrade the NVIDIA driver to 570 or later", "install NVIDIA's cuda-checkpoint", "$STASIS_CUDA_CHECKPOINT"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	if _, err := d.ProcessState(1); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("state without a backend: %v", err)
	}
}

// noTool makes sure no cuda-checkpoint is found.
func noTool(t *testing.T) {
	t.Helper()
	t.Setenv(ToolEnv, "")
	t.Setenv("PATH", t.TempDir())
}

// TestStandInDriver drives the binding through the stand-in driver the
// GPU-less tests use: states move as the API documents, errors carry
// their names, and a lock failure is recognised as a timeout.
func TestStandInDriver(t *testing.T) {
	d, err := load(buildLib(t, "testdata/fakecuda/libcuda.c", ""))
	if err != nil {
		t.Fatal(err)
	}
	if b := d.Backend(); b.Kind != BackendAPI {
		t.Fatalf("backend %+v for a library with the API", b)
	}
	dir := t.TempDir()
	t.Setenv("STASIS_FAKE_CUDA_DIR", dir)
	if v, err := d.DriverVersion(); err != nil || v != 13000 {
		t.Fatalf("DriverVersion = %d, %v", v, err)
	}
	devs, err := d.Devices()
	if err != nil || len(devs) != 1 || devs[0].Name != "Fake GPU" || devs[0].UUID != "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f" {
		t.Fatalf("Devices = %+v, %v", devs, err)
	}
	const pid = 4242
	gpu0, _ := ParseUUID(devs[0].UUID)
	walk(t, d, pid, []step{
		{func() error { return d.Lock(pid, 0) }, Locked},
		{func() error { return d.Checkpoint(pid) }, Checkpointed},
		{func() error { return d.Restore(pid, []GPUPair{{Old: gpu0, New: gpu0}}) }, Locked},
		{func() error { return d.Unlock(pid) }, Running},
	})
	err = d.Unlock(pid) // not locked
	var ce *Error
	if !errors.As(err, &ce) || ce.Name != "CUDA_ERROR_ILLEGAL_STATE" || ce.PID != pid || TimedOut(err) {
		t.Fatalf("unlock of a running process: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "fail-lock"), nil, 0o600)
	if err := d.Lock(pid, 0); !TimedOut(err) || !strings.Contains(err.Error(), "cuCheckpointProcessLock(pid 4242): CUDA_ERROR_NOT_READY") {
		t.Fatalf("failing lock: %v", err)
	}
	if tid, err := d.RestoreThreadID(pid); err != nil || tid != pid {
		t.Fatalf("RestoreThreadID = %d, %v", tid, err)
	}
}

// step is one process call and the state it leaves the process in.
type step struct {
	do   func() error
	want State
}

// walk makes the calls of steps in order, checking the state after each.
func walk(t *testing.T, d *Driver, pid int, steps []step) {
	t.Helper()
	for i, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if st, err := d.ProcessState(pid); err != nil || st != s.want {
			t.Fatalf("step %d: state %v, %v; want %v", i, st, err, s.want)
		}
	}
}

// TestNVML asks the stand-in, which also stands in for NVML, which GPUs
// processes use.
func TestNVML(t *testing.T) {
	lib := buildLib(t, "testdata/fakecuda/libcuda.c", "")
	dir := t.TempDir()
	t.Setenv("STASIS_LIBNVML", lib)
	t.Setenv("STASIS_FAKE_CUDA_DIR", dir)
	os.WriteFile(filepath.Join(dir, "devices"), []byte("3"), 0o600)
	os.WriteFile(filepath.Join(dir, "100.gpu"), []byte("2"), 0o600)
	os.WriteFile(filepath.Join(dir, "200.gpu"), []byte("0"), 0o600)
	// More processes on GPU 1 than the first call has room for.
	for pid := 1000; pid < 1100; pid++ {
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("%d.gpu", pid)), []byte("1"), 0o600)
	}
	n, err := LoadNVML()
	if err != nil {
		t.Fatal(err)
	}
	for pid, want := range map[int]string{100: "[GPU-12131415-1617-1819-1a1b-1c1d1e1f2021]", 200: "[GPU-10111213-1415-1617-1819-1a1b1c1d1e1f]", 300: "[]", 1099: "[GPU-11121314-1516-1718-191a-1b1c1d1e1f20]"} {
		if got, err := n.ProcessGPUs(pid); err != nil || fmt.Sprint(got) != want {
			t.Errorf("PID %d uses %v (%v), want %s", pid, got, err, want)
		}
	}
}

func TestUsesCUDA(t *testing.T) {
	sleeper := exec.Command("sleep", "30")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sleeper.Process.Kill(); sleeper.Wait() }()
	if UsesCUDA(sleeper.Process.Pid) {
		t.Fatal("sleep has no libcuda mapped")
	}
	if UsesCUDA(-1) {
		t.Fatal("no process has PID -1")
	}
	if _, err := load(buildLib(t, "testdata/fakecuda/libcuda.c", "")); err != nil {
		t.Fatal(err)
	}
	if !UsesCUDA(os.Getpid()) {
		t.Fatal("this process mapped a libcuda.so.1 and UsesCUDA does not see it")
	}
}

func TestVersionLess(t *testing.T) {
	in := []string{"/usr/local/cuda-12.9/t", "/usr/local/cuda-12.10/t", "/usr/local/cuda-13.0/t", "/usr/local/cuda-11.8/t"}
	for i := range in {
		for j := range in {
			if VersionLess(in[i], in[j]) && VersionLess(in[j], in[i]) {
				t.Fatalf("%s and %s both less than each other", in[i], in[j])
			}
		}
	}
	if !VersionLess("/usr/local/cuda-12.9/t", "/usr/local/cuda-12.10/t") {
		t.Error("12.9 should sort before 12.10")
	}
	if !VersionLess("/usr/local/cuda-12.10/t", "/usr/local/cuda-13.0/t") {
		t.Error("12.10 should sort before 13.0")
	}
}
