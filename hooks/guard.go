package hooks

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"
)

// GuardArg, as the first argument of the stasis binary, runs the guard of
// a job's tree (RunGuard) instead of the CLI.
const GuardArg = "__stasis_run_guard"

// guardDone is what stasis run writes to its guard when it ends normally.
const guardDone = "done\n"

// guard is stasis run's end of the process that ends the job's tree if
// stasis run dies: PR_SET_PDEATHSIG kills the job's root, the guard the
// rest of its session.
type guard struct {
	pipe *os.File
	cmd  *exec.Cmd
}

// startGuard starts a copy of this binary, in a session of its own, that
// waits for this process to end.
func startGuard(session int) (*guard, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, GuardArg, strconv.Itoa(session))
	cmd.ExtraFiles = []*os.File{r} // fd 3
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("start the job's guard: %w", err)
	}
	r.Close()
	return &guard{pipe: w, cmd: cmd}, nil
}

// release ends the guard, leaving the job's session alone.
func (g *guard) release() {
	g.pipe.WriteString(guardDone)
	g.pipe.Close()
	g.cmd.Wait()
}

// RunGuard is the guard process: args are the job's session. It waits for
// stasis run on fd 3; if the pipe ends without "done", stasis run died,
// and the guard kills every process left in the session. It returns the
// process's exit code.
func RunGuard(args []string) int {
	if len(args) != 1 {
		return 2
	}
	session, err := strconv.Atoi(args[0])
	if err != nil || session <= 1 {
		return 2
	}
	msg, _ := io.ReadAll(os.NewFile(3, "stasis-run"))
	if string(msg) == guardDone {
		return 0
	}
	// Processes may still be forking: go on until the session is empty.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		left := sessionMembers(session)
		if len(left) == 0 {
			return 0
		}
		for _, pid := range left {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return 1
}
