package checkpoint

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stasis-ckpt/stasis/criu"
	"golang.org/x/sys/unix"
)

// startHolder starts testdata/holder.py holding what, outside this
// process's tree (as a job is outside stasis's), and returns its PID once
// it holds it all; it is killed when the test ends.
func startHolder(t *testing.T, what ...string) int {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the preflight reads other processes' /proc/PID/map_files: root only")
	}
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed")
	}
	ready := filepath.Join(t.TempDir(), "ready")
	args := []string{"python3", "testdata/holder.py", ready}
	for _, a := range append(args, what...) {
		if strings.ContainsRune(a, '\'') {
			t.Fatalf("argument %q", a)
		}
	}
	out, err := exec.Command("sh", "-c", "setsid '"+strings.Join(append(args, what...), "' '")+"' </dev/null >/dev/null 2>&1 & echo $!").Output()
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Kill(pid, unix.SIGKILL) })
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(ready); err == nil {
			return pid
		}
		if unix.Kill(pid, 0) != nil {
			break
		}
	}
	t.Fatalf("holder.py %v did not get ready", what)
	return 0
}

// preflightOf runs the preflight on pid's tree with the user's options o.
func preflightOf(t *testing.T, pid int, o criu.Options) (*Plan, criu.Options, error) {
	t.Helper()
	tree, err := Tree(pid)
	if err != nil {
		t.Fatal(err)
	}
	return Preflight(tree, o)
}

// chosen returns the plan's choice of option, failing when there is none.
func chosen(t *testing.T, plan *Plan, option string) Choice {
	t.Helper()
	for _, c := range plan.Options {
		if c.Option == option {
			return c
		}
	}
	t.Fatalf("the preflight did not choose %s: %+v", option, plan.Options)
	return Choice{}
}

func TestPreflightChoosesFromWhatTheTreeHolds(t *testing.T) {
	dir := t.TempDir()
	t.Run("nothing", func(t *testing.T) {
		plan, o, err := preflightOf(t, startHolder(t), criu.Options{})
		if err != nil || len(plan.Options) != 0 || o.FileLocks || o.LinkRemap || o.ExtUnixSockets || o.GhostLimit != 0 || plan.GhostBytes != 0 {
			t.Fatalf("plan %+v, options %+v, %v", plan, o, err)
		}
	})
	t.Run("flags", func(t *testing.T) {
		plan, o, err := preflightOf(t, startHolder(t), criu.Options{FileLocks: true, TCPEstablished: true})
		if err != nil || !o.FileLocks || !o.TCPEstablished {
			t.Fatalf("options %+v, %v", o, err)
		}
		if c := chosen(t, plan, "file_locks"); c.By != "flag" || c.Why != "--file-locks" {
			t.Fatalf("choice %+v", c)
		}
	})
	t.Run("file lock", func(t *testing.T) {
		lock := filepath.Join(dir, "lock")
		pid := startHolder(t, "flock:"+lock)
		plan, o, err := preflightOf(t, pid, criu.Options{})
		if err != nil || !o.FileLocks {
			t.Fatalf("options %+v, %v", o, err)
		}
		c := chosen(t, plan, "file_locks")
		if want := fmt.Sprintf("PID %d (python3) holds a FLOCK WRITE lock on %s", pid, lock); c.By != "preflight" || c.Why != want {
			t.Fatalf("choice %+v, want why %q", c, want)
		}
	})
	t.Run("ghost files", func(t *testing.T) {
		// PyTorch's unlinked segments are 2 MiB; zdtm's
		// ghost_multi_hole00 holds one of 4 MiB; a small one fits
		// CRIU's default, and a memfd is memory to CRIU.
		pid := startHolder(t, "ghost:100000", "ghost:3145728", "ghostmap:5242880", "memfd:3145728")
		plan, o, err := preflightOf(t, pid, criu.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if o.GhostLimit != 7<<20 || o.LinkRemap || o.FileLocks {
			t.Fatalf("options %+v, want a ghost limit of 7 MiB (5 MiB and a quarter, in MiB)", o)
		}
		c := chosen(t, plan, "ghost_limit")
		if c.Value != strconv.Itoa(7<<20) || !strings.Contains(c.Why, "/dev/shm/stasis-preflight-") || !strings.Contains(c.Why, "of 5120 KiB") {
			t.Fatalf("choice %+v", c)
		}
		if min := int64(100000 + 3<<20 + 5<<20); plan.GhostBytes < min || plan.GhostBytes > min+1<<20 {
			t.Fatalf("ghost bytes %d, want the three files' (%d) and no memfd", plan.GhostBytes, min)
		}
	})
	t.Run("small ghost file", func(t *testing.T) {
		plan, o, err := preflightOf(t, startHolder(t, "ghost:100000"), criu.Options{})
		if err != nil || o.GhostLimit != 0 || len(plan.Options) != 0 || plan.GhostBytes == 0 {
			t.Fatalf("plan %+v, options %+v, %v", plan, o, err)
		}
	})
	t.Run("link remap", func(t *testing.T) {
		remap := t.TempDir()
		pid := startHolder(t, "linkremap:"+remap)
		plan, o, err := preflightOf(t, pid, criu.Options{})
		if err != nil || !o.LinkRemap || o.GhostLimit != 0 {
			t.Fatalf("options %+v, %v", o, err)
		}
		if c := chosen(t, plan, "link_remap"); !strings.Contains(c.Why, filepath.Join(remap, "a")+" (deleted), unlinked there but linked elsewhere") {
			t.Fatalf("choice %+v", c)
		}
	})
}

func TestPreflightUnixSockets(t *testing.T) {
	dir := t.TempDir()
	t.Run("datagram to a name outside", func(t *testing.T) {
		// As a job's logging to /dev/log: the peer, outside the tree,
		// is this test.
		path := filepath.Join(dir, "log")
		sink, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
		if err != nil {
			t.Fatal(err)
		}
		defer sink.Close()
		pid := startHolder(t, "dgram:"+path)
		plan, o, err := preflightOf(t, pid, criu.Options{})
		if err != nil || !o.ExtUnixSockets {
			t.Fatalf("options %+v, %v", o, err)
		}
		if c := chosen(t, plan, "ext_unix_sk"); c.Why != fmt.Sprintf("PID %d (python3) has a datagram socket connected to %s, outside the tree", pid, path) {
			t.Fatalf("choice %+v", c)
		}
	})
	t.Run("stream to a process outside", func(t *testing.T) {
		path := filepath.Join(dir, "server")
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		accepted := make(chan net.Conn, 1)
		go func() {
			c, _ := l.Accept()
			accepted <- c
		}()
		pid := startHolder(t, "stream:"+path)
		if c := <-accepted; c != nil {
			defer c.Close()
		}
		_, _, err = preflightOf(t, pid, criu.Options{ExtUnixSockets: true})
		want := fmt.Sprintf("whose other end PID %d (", os.Getpid())
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), fmt.Sprintf("PID %d (python3) holds a unix stream socket", pid)) || !strings.Contains(err.Error(), want) {
			t.Fatalf("err %v, want a refusal naming this process (%s)", err, want)
		}
	})
}

func TestDeviceKind(t *testing.T) {
	names := map[uint32]string{1: "mem", 195: "nvidia-frontend", 511: "nvidia-uvm", 10: "misc"}
	for _, c := range []struct {
		path string
		mode uint32
		rdev uint64
		want string
	}{
		{"/usr/lib/x86_64-linux-gnu/libcuda.so.1", unix.S_IFREG, 0, ""},
		{"/dev/zero", unix.S_IFCHR, unix.Mkdev(1, 5), ""},
		// What a worker forked from a CUDA process inherits.
		{"/dev/nvidiactl", unix.S_IFCHR, unix.Mkdev(195, 255), "nvidia"},
		{"/dev/nvidia0", unix.S_IFCHR, unix.Mkdev(195, 0), "nvidia"},
		{"/dev/nvidia-uvm", unix.S_IFCHR, unix.Mkdev(511, 0), "nvidia"},
		// In a container, by another path: the driver's name says.
		{"/run/gpu/uvm (deleted)", unix.S_IFCHR, unix.Mkdev(511, 0), "nvidia"},
		{"/dev/nvidia-uvm (deleted)", unix.S_IFCHR, unix.Mkdev(511, 0), "nvidia"},
		{"/dev/mem", unix.S_IFCHR, unix.Mkdev(1, 1), "device"},
		// CRIU's amdgpu plugin handles these where it is installed.
		{"/dev/dri/renderD128", unix.S_IFCHR, unix.Mkdev(226, 128), ""},
		{"/dev/kfd", unix.S_IFCHR, unix.Mkdev(235, 0), ""},
		{"/dev/vda", unix.S_IFBLK, unix.Mkdev(254, 0), "device"},
	} {
		if got := deviceKind(c.path, c.mode|0o600, c.rdev, names); got != c.want {
			t.Errorf("deviceKind(%s) = %q, want %q", c.path, got, c.want)
		}
	}
}

func TestGhostLimit(t *testing.T) {
	for size, want := range map[int64]int64{1: 1 << 20, 2 << 20: 3 << 20, 4 << 20: 5 << 20, 5 << 20: 7 << 20} {
		if got := ghostLimit(size); got != want {
			t.Errorf("ghostLimit(%d) = %d, want %d", size, got, want)
		}
	}
}

// TestPreflightRefusesAnIOUring: an io_uring (CRIU cannot dump it; an
// NCCL process group holds one) is refused before anything is touched,
// naming the way out.
func TestPreflightRefusesAnIOUring(t *testing.T) {
	if data, err := os.ReadFile("/proc/sys/kernel/io_uring_disabled"); err == nil && strings.TrimSpace(string(data)) != "0" {
		t.Skip("io_uring is disabled on this kernel (kernel.io_uring_disabled)")
	}
	pid := startHolder(t, "io_uring:8")
	_, _, err := preflightOf(t, pid, criu.Options{})
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "holds an io_uring") || !strings.Contains(err.Error(), "stasis.dcp") {
		t.Fatalf("an io_uring: %v, want a refusal naming it and the way out", err)
	}
}
