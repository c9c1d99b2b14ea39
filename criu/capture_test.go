package criu

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestMain lets this test binary act as the action script of the CRIU it
// runs (dumpStreamed names the running binary), as stasis's own does.
func TestMain(m *testing.M) {
	if hook, code := RunActionHook(os.Args[1:]); hook {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// dumpSide plays CRIU's part of a streamed dump over a real unix socket, as
// img-streamer.c does it: a request, then the read end of a pipe that it
// then writes the file into.
type dumpSide struct {
	t *testing.T
	c *net.UnixConn
}

func dialCapture(t *testing.T, dir string) *dumpSide {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: filepath.Join(dir, CaptureSocket), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	return &dumpSide{t: t, c: c}
}

// create asks to create name and returns the pipe to write it into.
func (s *dumpSide) create(name string) *os.File {
	s.t.Helper()
	if _, err := s.c.Write(request(name)); err != nil {
		s.t.Fatal(err)
	}
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		s.t.Fatal(err)
	}
	if _, _, err := s.c.WriteMsgUnix([]byte{0}, unix.UnixRights(fds[0]), nil); err != nil {
		s.t.Fatal(err)
	}
	unix.Close(fds[0])
	return os.NewFile(uintptr(fds[1]), name)
}

// collect is a receiver that keeps every file in memory.
type collect struct {
	mu    sync.Mutex
	files map[string][]byte
}

func (c *collect) receive(name string, r io.Reader) error {
	data, err := io.ReadAll(r)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.files == nil {
		c.files = map[string][]byte{}
	}
	c.files[name] = data
	return err
}

// TestImageCapture: files written at once through two pipes arrive whole;
// a small file CRIU wrote and closed just before Drain (so that it still
// sits, unread, in the socket and its pipe) is waited for; Drain takes the
// socket away.
func TestImageCapture(t *testing.T) {
	dir := t.TempDir()
	var got collect
	c, err := CaptureImages(dir, got.receive)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	criu := dialCapture(t, dir)
	pages, pagemap := criu.create("pages-1.img"), criu.create("pagemap-1.img")
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<18) // 4 MiB: more than a pipe holds
	var want []byte
	for i := 0; i < 4; i++ {
		// Interleaved: a receiver that read one pipe to its end before
		// the other would hang CRIU here.
		if _, err := pages.Write(big); err != nil {
			t.Fatal(err)
		}
		entry := []byte("entry" + strconv.Itoa(i))
		if _, err := pagemap.Write(entry); err != nil {
			t.Fatal(err)
		}
		want = append(want, entry...)
	}
	pages.Close()
	pagemap.Close()
	last := criu.create("inventory.img")
	last.WriteString("inventory")
	last.Close()
	if err := c.Drain(); err != nil {
		t.Fatal(err)
	}
	if n := len(got.files["pages-1.img"]); n != 4*len(big) {
		t.Errorf("pages-1.img: %d bytes, want %d", n, 4*len(big))
	}
	if !bytes.Equal(got.files["pagemap-1.img"], want) || string(got.files["inventory.img"]) != "inventory" {
		t.Errorf("got pagemap %q, inventory %q", got.files["pagemap-1.img"], got.files["inventory.img"])
	}
	if _, err := os.Stat(filepath.Join(dir, CaptureSocket)); !os.IsNotExist(err) {
		t.Errorf("the socket is still there after Drain: %v", err)
	}
	criu.c.Close()
}

// TestImageCaptureReceiverFails: a receiver's error closes its pipe, so
// CRIU's next write fails (EPIPE) instead of hanging, and Drain reports
// the error with the image's name.
func TestImageCaptureReceiverFails(t *testing.T) {
	dir := t.TempDir()
	c, err := CaptureImages(dir, func(name string, r io.Reader) error {
		io.CopyN(io.Discard, r, 1<<20)
		return errors.New("disk full")
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	criu := dialCapture(t, dir)
	defer criu.c.Close()
	pages := criu.create("pages-1.img")
	defer pages.Close()
	var writeErr error
	chunk := make([]byte, 1<<20)
	for i := 0; i < 64 && writeErr == nil; i++ {
		_, writeErr = pages.Write(chunk)
	}
	if !errors.Is(writeErr, unix.EPIPE) {
		t.Fatalf("CRIU's write after the receiver failed: %v, want EPIPE", writeErr)
	}
	if err := c.Drain(); err == nil || err.Error() != "image pages-1.img: disk full" {
		t.Fatalf("Drain = %v", err)
	}
}

// TestStreamedDumpHooks runs the real CRIU (skipped without one) on a
// sleeping process, with the images captured: a post-dump hook's error
// fails the dump with that error and CRIU resumes the process; with a hook
// that succeeds, the process is gone and its images were all handed over.
func TestStreamedDumpHooks(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("CRIU needs root")
	}
	if p, err := filepath.Abs("../bin/criu"); err == nil {
		if _, err := os.Stat(p); err == nil {
			t.Setenv("STASIS_CRIU", p)
		}
	}
	if _, _, err := Resolve(""); err != nil {
		t.Skipf("no usable CRIU (run make): %v", err)
	}
	out, err := exec.Command("sh", "-c", "setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $!").Output()
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	t.Cleanup(func() { unix.Kill(pid, unix.SIGKILL) })

	dump := func(postDump func() error) (*collect, error) {
		images, work, err := MakeDirs(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		got := &collect{}
		c, err := CaptureImages(images, got.receive)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ran := false
		err = Dump(Options{Stream: true}, pid, images, work, Hooks{
			PreDump: func() error { ran = true; return nil },
			PostDump: func() error {
				if err := c.Drain(); err != nil {
					return err
				}
				return postDump()
			},
		})
		if !ran {
			t.Error("the pre-dump hook did not run")
		}
		return got, err
	}

	_, err = dump(func() error { return errors.New("the store is full") })
	var ce *Error
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "the store is full") {
		t.Fatalf("dump with a failing post-dump hook: %v", err)
	}
	time.Sleep(100 * time.Millisecond)
	if unix.Kill(pid, 0) != nil {
		t.Fatal("the process is gone after a failed post-dump hook")
	}

	got, err := dump(func() error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"inventory.img", "pstree.img", "pages-1.img", "pagemap-" + strconv.Itoa(pid) + ".img"} {
		if len(got.files[name]) == 0 {
			sizes := map[string]int{}
			for n, data := range got.files {
				sizes[n] = len(data)
			}
			t.Errorf("%s was not handed over (got %v)", name, sizes)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); unix.Kill(pid, 0) == nil; time.Sleep(20 * time.Millisecond) {
		if st, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); strings.Contains(string(st), ") Z ") {
			break // killed; init reaps it
		}
		if time.Now().After(deadline) {
			t.Fatal("the process runs on after a dump without --leave-running")
		}
	}
}

// TestActionScript: the script runs stasis (here: a stand-in at a path
// that needs quoting) at the actions with a hook, passing its exit code
// back, and exits 0 at the others; a noexec work directory gets stasis's
// own path instead.
func TestActionScript(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "it's a dir")
	if err := os.Mkdir(bin, 0o700); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "ran")
	self := filepath.Join(bin, "stasis")
	if err := os.WriteFile(self, []byte("#!/bin/sh\necho \"$CRTOOLS_SCRIPT_ACTION\" >>"+shellQuote(out)+"\nexit 3\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	run := func(script, action string) (ran string, code int) {
		t.Helper()
		os.Remove(out)
		cmd := exec.Command(script)
		cmd.Env = append(os.Environ(), "CRTOOLS_SCRIPT_ACTION="+action)
		err := cmd.Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("run %s: %v", script, err)
		}
		data, _ := os.ReadFile(out)
		return strings.TrimSpace(string(data)), code
	}
	hook := func() error { return nil }
	script := actionScript(t.TempDir(), self, Hooks{PostDump: hook})
	if script == self {
		t.Fatal("no script written into a plain temporary directory")
	}
	for _, action := range []string{"pre-stream", "pre-dump", "network-lock"} {
		if ran, code := run(script, action); ran != "" || code != 0 {
			t.Errorf("at %s: ran %q, exit %d; want nothing run, exit 0", action, ran, code)
		}
	}
	if ran, code := run(script, "post-dump"); ran != "post-dump" || code != 3 {
		t.Errorf("at post-dump: ran %q, exit %d; want post-dump, exit 3", ran, code)
	}
	script = actionScript(t.TempDir(), self, Hooks{PreDump: hook, PostDump: hook})
	if ran, code := run(script, "pre-dump"); ran != "pre-dump" || code != 3 {
		t.Errorf("with a pre-dump hook, at pre-dump: ran %q, exit %d", ran, code)
	}
	script = actionScript(t.TempDir(), self, Hooks{})
	if ran, code := run(script, "post-dump"); ran != "" || code != 0 {
		t.Errorf("without hooks, at post-dump: ran %q, exit %d", ran, code)
	}
	// A relative work directory (CRIU runs the script from there) still
	// gives an absolute path, executable whatever the umask.
	t.Chdir(t.TempDir())
	if err := os.Mkdir("work", 0o700); err != nil {
		t.Fatal(err)
	}
	old := unix.Umask(0o177)
	script = actionScript("work", self, Hooks{PostDump: hook})
	unix.Umask(old)
	if !filepath.IsAbs(script) || script == self {
		t.Errorf("work directory \"work\": script %q, want an absolute path of its own", script)
	} else if ran, code := run(script, "post-dump"); ran != "post-dump" || code != 3 {
		t.Errorf("script written under umask 177, at post-dump: ran %q, exit %d", ran, code)
	}

	if os.Geteuid() != 0 {
		t.Skip("mounting a noexec tmpfs needs root")
	}
	noexec := t.TempDir()
	if err := unix.Mount("tmpfs", noexec, "tmpfs", unix.MS_NOEXEC, "size=1m"); err != nil {
		t.Skipf("mount a noexec tmpfs: %v", err)
	}
	defer unix.Unmount(noexec, unix.MNT_DETACH)
	if got := actionScript(noexec, self, Hooks{PostDump: hook}); got != self {
		t.Errorf("in a noexec directory the script is %s, want %s", got, self)
	}
}
