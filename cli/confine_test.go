package cli_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stasis-ckpt/stasis/cli"
)

// TestUnsafeStoreIsRefused: a store others may write, or another user's,
// is refused with exit 15 and one line naming the fix, unless the owner
// accepts it by flag or environment variable.
func TestUnsafeStoreIsRefused(t *testing.T) {
	home, tmp := t.TempDir(), t.TempDir()
	id := save(t, home, "mine", 1, writeTree(t, tmp, 1, 1000))
	if err := os.Chmod(home, 0o777); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"ls"}, {"gc"}, {"rm", id}, {"catalog", "rebuild"}} {
		expectCode(t, run(t, home, args...), cli.ExitUnsafe, `may be written by others \(mode 0777\).*run `+"`chmod go-w "+home+"`")
	}
	if r := run(t, home, "--allow-unsafe-store", "ls"); r.code != 0 || !strings.Contains(r.stdout, id[:8]) {
		t.Fatalf("--allow-unsafe-store ls: exit %d: %s%s", r.code, r.stdout, r.stderr)
	}
	if r := shell(t, home, `STASIS_ALLOW_UNSAFE_STORE=1 "$STASIS" ls`); r.code != 0 || !strings.Contains(r.stdout, id[:8]) {
		t.Fatalf("STASIS_ALLOW_UNSAFE_STORE=1 ls: exit %d: %s%s", r.code, r.stdout, r.stderr)
	}
	os.Chmod(home, 0o700)
	if os.Geteuid() == 0 {
		os.Chown(home, 65534, 65534)
		expectCode(t, run(t, home, "ls"), cli.ExitUnsafe, `store `+home+` belongs to uid 65534, not to you \(uid 0\).*chown 0 `+home)
		os.Chown(home, 0, 0)
	}
	// config.toml's hooks run as the store's user: a hook script others
	// may write is refused.
	hook := filepath.Join(tmp, "hook.sh")
	os.WriteFile(hook, []byte("#!/bin/sh\nexit 0\n"), 0o777)
	os.Chmod(hook, 0o777)
	os.WriteFile(filepath.Join(home, "config.toml"), []byte(fmt.Sprintf("[hooks]\npre_checkpoint = %q\n", hook)), 0o600)
	expectCode(t, run(t, home, "run", "--job", "j", "--", "true"), cli.ExitRunFailed, `hook script \(pre_checkpoint in .*config.toml\) `+hook+` may be written by others`)
	os.Chmod(hook, 0o700)
	os.Chmod(filepath.Join(home, "config.toml"), 0o666)
	expectCode(t, run(t, home, "ls"), cli.ExitUnsafe, `config.toml may be written by others`)
}

// TestPlantedLinksDeleteNothing plants links to a folder outside the store
// as trash/ and staging/ and runs gc, rm and prune as the store's user:
// each is refused with exit 15 naming the link, and the folder is intact.
func TestPlantedLinksDeleteNothing(t *testing.T) {
	for _, name := range []string{"trash", "staging"} {
		t.Run(name, func(t *testing.T) {
			home, tmp := t.TempDir(), t.TempDir()
			id := save(t, home, "links", 1, writeTree(t, tmp, 1, 1000))
			victim := filepath.Join(tmp, "victim")
			os.MkdirAll(filepath.Join(victim, "a", "b"), 0o700)
			os.WriteFile(filepath.Join(victim, "a", "b", "precious"), []byte("keep"), 0o600)
			os.WriteFile(filepath.Join(victim, "a.lock"), nil, 0o600)
			os.RemoveAll(filepath.Join(home, name))
			if err := os.Symlink(victim, filepath.Join(home, name)); err != nil {
				t.Fatal(err)
			}
			var results []result
			for _, args := range [][]string{{"gc"}, {"rm", id}, {"prune", "--job", "links", "--keep-last", "0"}, {"--allow-unsafe-store", "gc"}} {
				results = append(results, run(t, home, args...))
			}
			if got, err := os.ReadFile(filepath.Join(victim, "a", "b", "precious")); err != nil || string(got) != "keep" {
				t.Fatalf("the folder the link names lost its files: %q, %v", got, err)
			}
			for _, r := range results {
				expectCode(t, r, cli.ExitUnsafe, filepath.Join(home, name)+` is a symbolic link \(to `+victim+`\).*rm `+filepath.Join(home, name))
			}
			os.Remove(filepath.Join(home, name))
			mustRun(t, home, "verify", id)
		})
	}
}

// holdAt starts stasis with args, held at crash point point (STASIS_HOLD_AT
// with a FIFO), and returns once the process is there, with a function
// that kills it (SIGKILL) and waits for it. A process that ends without
// getting there fails the test.
func holdAt(t *testing.T, home, point string, args ...string) (kill func()) {
	t.Helper()
	cmd := exec.Command(stasisBin, args...)
	cmd.Env = append(os.Environ(), "STASIS_HOME="+home)
	return startHeld(t, cmd, point).kill
}

// heldRun is stasis held at a crash point (STASIS_HOLD_AT with a FIFO).
type heldRun struct {
	cmd       *exec.Cmd
	fifo      *os.File // open for writing: closed, the process goes on
	ended     chan error
	out, errb bytes.Buffer
}

// startHeld starts cmd (its environment set but for STASIS_HOLD_AT) held
// at crash point point, and returns once the process is there; one that
// ends without getting there fails the test.
func startHeld(t *testing.T, cmd *exec.Cmd, point string) *heldRun {
	t.Helper()
	fifo := filepath.Join(t.TempDir(), "hold")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	h := &heldRun{cmd: cmd, ended: make(chan error, 1)}
	cmd.Env = append(cmd.Env, "STASIS_HOLD_AT="+point+":"+fifo)
	cmd.Stdout, cmd.Stderr = &h.out, &h.errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { h.ended <- cmd.Wait() }()
	// Opening the FIFO for writing returns once the process opened it
	// for reading: it is at the point.
	opened := make(chan *os.File, 1)
	go func() {
		f, _ := os.OpenFile(fifo, os.O_WRONLY, 0)
		opened <- f
	}()
	select {
	case h.fifo = <-opened:
		t.Cleanup(func() { h.fifo.Close() })
	case err := <-h.ended:
		if r, _ := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0); r != nil {
			<-opened
			r.Close()
		}
		t.Fatalf("stasis %v ended (%v) without reaching %s: %s", cmd.Args[1:], err, point, h.errb.String())
	}
	return h
}

// kill kills the held process (SIGKILL) and waits for it.
func (h *heldRun) kill() {
	h.cmd.Process.Kill()
	<-h.ended
}

// release lets the held process go on and returns its result.
func (h *heldRun) release() result {
	h.fifo.Close()
	err := <-h.ended
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	}
	return result{code: code, stdout: h.out.String(), stderr: h.errb.String()}
}

// TestKilledOutputsLeaveNothing kills (SIGKILL) a `load --to DIR` with
// everything unpacked beside DIR, and an `export -o FILE` half written:
// the export leaves no file at all; the load's hidden directory is
// removed by the next `stasis gc`, and a load into DIR then works.
func TestKilledOutputsLeaveNothing(t *testing.T) {
	home, tmp := t.TempDir(), t.TempDir()
	tree := writeTree(t, tmp, 3, 1<<20)
	id := save(t, home, "out", 1, tree)
	outDir := t.TempDir()

	holdAt(t, home, "export-manifest-written", "export", id, "-o", filepath.Join(outDir, "ckpt.tar"))()
	if left := entriesIn(t, outDir); len(left) != 0 {
		t.Fatalf("a killed export left %v", left)
	}

	target := filepath.Join(outDir, "restored")
	holdAt(t, home, "load-unpacked", "load", id, "--to", target)()
	left := entriesIn(t, outDir)
	if len(left) != 1 || !strings.HasPrefix(left[0], ".restored.stasis-load-") {
		t.Fatalf("after a killed load %s holds %v, want its hidden directory", outDir, left)
	}
	r := mustRun(t, home, "gc", "--json")
	if !strings.Contains(r.stdout, left[0]) {
		t.Errorf("gc's report does not name %s: %s", left[0], r.stdout)
	}
	if left := entriesIn(t, outDir); len(left) != 0 {
		t.Fatalf("gc left %v beside the load's target", left)
	}
	if left := entriesIn(t, filepath.Join(home, "loads")); len(left) != 0 {
		t.Fatalf("gc left registrations %v", left)
	}
	mustRun(t, home, "load", id, "--to", target)
	sameTree(t, tree, filepath.Join(target, "tree"))
	if left := entriesIn(t, filepath.Join(home, "loads")); len(left) != 0 {
		t.Fatalf("a load left registrations %v", left)
	}
}
