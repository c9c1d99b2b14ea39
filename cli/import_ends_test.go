package cli_test

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stasis-ckpt/stasis/cli"
)

// importProcess starts `stasis import -` into home with STASIS_TRACE set,
// its stdin a pipe the test writes, and returns once the process has
// opened its store (its trace says so), so that its signal handlers are
// in place. wait gives its exit code and stderr, or fails the test if it
// has not ended within a minute (a hang, not a slow import).
func importProcess(t *testing.T, home string) (stdin io.WriteCloser, cmd *exec.Cmd, wait func() (int, string)) {
	t.Helper()
	cmd = exec.Command(stasisBin, "import", "-")
	cmd.Env = append(os.Environ(), "STASIS_HOME="+home, "STASIS_TRACE=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var errb bytes.Buffer
	lines := bufio.NewScanner(stderr)
	for lines.Scan() {
		errb.WriteString(lines.Text() + "\n")
		if strings.Contains(lines.Text(), "cli: store open") {
			break
		}
	}
	rest := make(chan struct{})
	go func() { io.Copy(&errb, stderr); close(rest) }()
	return stdin, cmd, func() (int, string) {
		t.Helper()
		done := make(chan error, 1)
		go func() { <-rest; done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(time.Minute):
			cmd.Process.Kill()
			<-done
			t.Fatalf("stasis import was still running a minute later; killed it: %s", errb.String())
		}
		return cmd.ProcessState.ExitCode(), errb.String()
	}
}

// stasisLines drops the trace lines of stderr.
func stasisLines(stderr string) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(stderr), "\n") {
		if !strings.HasPrefix(l, "stasis: trace:") && l != "" {
			out = append(out, l)
		}
	}
	return out
}

// nothingImported checks that home lists nothing and keeps nothing staged.
func nothingImported(t *testing.T, home string) {
	t.Helper()
	if recs := list(t, home); len(recs) != 0 {
		t.Fatalf("lists %+v", recs)
	}
	if staged := entriesIn(t, filepath.Join(home, "staging")); len(staged) != 0 {
		t.Fatalf("left %v in staging", staged)
	}
	if got := entriesIn(t, filepath.Join(home, "checkpoints")); len(got) != 0 {
		t.Fatalf("left %v in checkpoints/", got)
	}
}

// TestImportOfEndlessZerosEnds feeds a real `stasis import -` a valid
// export followed by zeros that never end: the import refuses the stream
// once more zeros follow the end marker than tar's padding could be
// (exit 13), and lists nothing.
func TestImportOfEndlessZerosEnds(t *testing.T) {
	a, b, tmp := t.TempDir(), t.TempDir(), t.TempDir()
	id := save(t, a, "zeros", 1, writeTree(t, tmp, 2, 200_000))
	stream, err := os.ReadFile(exportTo(t, a, id))
	if err != nil {
		t.Fatal(err)
	}
	stdin, _, wait := importProcess(t, b)
	go func() {
		zeros := make([]byte, 64<<10)
		if _, err := stdin.Write(stream); err != nil {
			return
		}
		for {
			if _, err := stdin.Write(zeros); err != nil {
				return // the import ended and closed its end
			}
		}
	}()
	code, stderr := wait()
	stdin.Close()
	lines := stasisLines(stderr)
	if code != cli.ExitBadStream || len(lines) != 1 || !strings.Contains(lines[0], "bytes of zeros follow the end-of-archive marker") {
		t.Fatalf("exit %d, want %d with one line on the zeros: %q", code, cli.ExitBadStream, lines)
	}
	nothingImported(t, b)
}

// TestImportStopsOnSignals signals real `stasis import -` processes whose
// writer went quiet: before the first byte (SIGINT), in the manifest
// (SIGTERM), in a data file (SIGTERM), and after the end marker while the
// pipe stays open (SIGINT). Each exits 130 at once, listing and leaving
// nothing.
func TestImportStopsOnSignals(t *testing.T) {
	a, b, tmp := t.TempDir(), t.TempDir(), t.TempDir()
	id := save(t, a, "quiet", 1, "--compress", "none", writeTree(t, tmp, 2, 3<<20))
	stream, err := os.ReadFile(exportTo(t, a, id))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		sent int
		sig  syscall.Signal
	}{
		{"before the first byte", 0, syscall.SIGINT},
		{"in the manifest", 700, syscall.SIGTERM},
		{"in a data file", len(stream) / 2, syscall.SIGTERM},
		{"after the end marker", len(stream), syscall.SIGINT},
	} {
		t.Run(c.name, func(t *testing.T) {
			stdin, cmd, wait := importProcess(t, b)
			if _, err := stdin.Write(stream[:c.sent]); err != nil {
				t.Fatal(err)
			}
			if c.sent > 1024 {
				// The import has begun staging: it read the manifest.
				waitForStaging(t, b)
			}
			cmd.Process.Signal(c.sig)
			code, stderr := wait()
			stdin.Close()
			if code != cli.ExitInterrupted {
				t.Fatalf("exit %d after %v, want %d: %s", code, c.sig, cli.ExitInterrupted, stderr)
			}
			nothingImported(t, b)
		})
	}
}
