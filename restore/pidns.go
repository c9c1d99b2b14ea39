package restore

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/stasis-ckpt/stasis/checkpoint"
	"github.com/stasis-ckpt/stasis/criu"
	"golang.org/x/sys/unix"
)

// PIDNSInitArg, as the first argument of the stasis binary, runs the init
// of a new PID namespace (RunPIDNSInit) instead of the CLI.
const PIDNSInitArg = "__stasis_pidns_init"

type pidnsRequest struct {
	CRIU   criu.Options `json:"criu"`
	Images string       `json:"images"`
	Work   string       `json:"work"`
}

type pidnsReport struct {
	PID   int    `json:"pid"` // the restored root's PID inside the namespace
	Error string `json:"error,omitempty"`
}

// restoreInNewPIDNS restores the tree inside a new PID (and mount)
// namespace, whose init is a copy of this binary that stays as long as
// the tree runs. The tree gets its own PIDs inside the namespace, whatever
// holds them outside. It returns the root's PID as this namespace sees it.
func restoreInNewPIDNS(co criu.Options, images, work string) (hostPID, nsPID int, err error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, 0, err
	}
	req, _ := json.Marshal(pidnsRequest{CRIU: co, Images: images, Work: work})
	r, w, err := os.Pipe()
	if err != nil {
		return 0, 0, err
	}
	cmd := exec.Command(exe, PIDNSInitArg, string(req))
	cmd.ExtraFiles = []*os.File{w} // fd 3: the report
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return 0, 0, fmt.Errorf("start a PID namespace: %w", err)
	}
	w.Close()
	var rep pidnsReport
	decErr := json.NewDecoder(r).Decode(&rep)
	r.Close()
	if decErr != nil || rep.Error != "" || rep.PID == 0 {
		cmd.Process.Kill()
		cmd.Wait()
		if log := filepath.Join(work, criu.RestoreLog); rep.Error != "" && fileExists(log) {
			// CRIU ran and failed: the same error as a restore here,
			// so that the caller keeps the log.
			return 0, 0, &criu.Error{Op: "restore", Err: errors.New(rep.Error), Log: log, Excerpt: criu.ErrorLines(log, 6)}
		}
		if rep.Error != "" {
			return 0, 0, errors.New(rep.Error)
		}
		return 0, 0, fmt.Errorf("the PID namespace's init reported nothing: %v", decErr)
	}
	host, ok := hostPIDOf(cmd.Process.Pid, rep.PID)
	// The init stays; it is reaped by whoever adopts it once stasis exits.
	cmd.Process.Release()
	if !ok {
		return 0, 0, fmt.Errorf("restored PID %d inside the namespace, but cannot find it outside", rep.PID)
	}
	return host, rep.PID, nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// hostPIDOf finds, among the descendants of init (a host PID), the process
// whose PID in the innermost namespace is nsPID.
func hostPIDOf(init, nsPID int) (int, bool) {
	queue := []int{init}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p != init && innermostPID(p) == nsPID {
			return p, true
		}
		kids, _ := checkpoint.Children(p)
		queue = append(queue, kids...)
	}
	return 0, false
}

// innermostPID reads the last NSpid of a process: its PID in its own
// namespace.
func innermostPID(pid int) int {
	status, err := checkpoint.Status(pid)
	if err != nil {
		return 0
	}
	f := strings.Fields(status["NSpid"])
	if len(f) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(f[len(f)-1])
	return n
}

// RunPIDNSInit is the init of the new PID namespace: it gives the namespace
// its own /proc, has CRIU restore the tree (which becomes its child),
// reports the root's PID on fd 3, and then reaps until the tree is gone.
// It returns the process's exit code.
func RunPIDNSInit(args []string) int {
	out := os.NewFile(3, "report")
	report := func(rep pidnsReport) {
		json.NewEncoder(out).Encode(rep)
		out.Close()
	}
	var req pidnsRequest
	if len(args) != 1 || json.Unmarshal([]byte(args[0]), &req) != nil {
		report(pidnsReport{Error: "pidns init: bad request"})
		return 2
	}
	// A /proc of this namespace, in a mount namespace of our own.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		report(pidnsReport{Error: fmt.Sprintf("pidns init: make mounts private: %v", err)})
		return 1
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		report(pidnsReport{Error: fmt.Sprintf("pidns init: mount /proc: %v", err)})
		return 1
	}
	pid, err := criu.Restore(req.CRIU, req.Images, req.Work, criu.Hooks{})
	if err != nil {
		report(pidnsReport{Error: err.Error()})
		return 1
	}
	report(pidnsReport{PID: pid})
	// The namespace lives as long as its init: reap until nothing is left.
	for {
		var ws unix.WaitStatus
		if _, err := unix.Wait4(-1, &ws, 0, nil); errors.Is(err, unix.ECHILD) {
			return 0
		}
	}
}
