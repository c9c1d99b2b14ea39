package checkpoint

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
)

// sentinelDone is what a sentinel's starter writes when it ends its work.
const sentinelDone = "done\n"

// Sentinel is a copy of this binary, in a session of its own (a signal to
// stasis's process group spares it), that outlives this process and learns
// through a pipe, on its fd 3, whether this process finished its work
// (Release(true)) or died (or gave up: Release(false)) first. The GPU
// watchdog and stasis run's guard are sentinels.
type Sentinel struct {
	pipe *os.File
	cmd  *exec.Cmd
}

// StartSentinel starts this binary with args (the first selects what it
// runs, as WatchdogArg does); name is what errors call it.
func StartSentinel(name string, args ...string) (*Sentinel, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, args...)
	cmd.ExtraFiles = []*os.File{r} // fd 3
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	r.Close()
	return &Sentinel{pipe: w, cmd: cmd}, nil
}

// Release ends the sentinel's watch: with ok, it has nothing to do and
// Release waits for it to exit; without, the pipe just closes, as if this
// process had died, and the sentinel does its work (Release does not wait
// for it then). A nil Sentinel is a no-op.
func (s *Sentinel) Release(ok bool) {
	if s == nil {
		return
	}
	if ok {
		s.pipe.WriteString(sentinelDone)
	}
	s.pipe.Close()
	if ok {
		s.cmd.Wait()
	}
}

// Tell sends the sentinel a line of progress (without a newline; not
// "done"), which WatchSentinel returns to it. A nil Sentinel is a no-op.
func (s *Sentinel) Tell(line string) {
	if s != nil {
		s.pipe.WriteString(line + "\n")
	}
}

// SentinelReleased is what a sentinel process calls first: it waits for its
// starter and reports whether it ended with Release(true).
func SentinelReleased() bool {
	released, _ := WatchSentinel()
	return released
}

// WatchSentinel waits for the starter like SentinelReleased, and also
// returns the lines of progress it told (Tell) before it ended.
func WatchSentinel() (released bool, told []string) {
	r := bufio.NewReader(os.NewFile(3, "starter"))
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return false, told
		}
		if line == sentinelDone {
			return true, told
		}
		told = append(told, strings.TrimSuffix(line, "\n"))
	}
}
