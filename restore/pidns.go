package restore

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

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
	// Inherit are the keys of co.InheritFDs, whose files the init gets as
	// fds 4, 5, ... in this order.
	Inherit    []string      `json:"inherit,omitempty"`
	Supervised bool          `json:"supervised,omitempty"`
	KillAfter  time.Duration `json:"kill_after,omitempty"`
	// PostRestore says the restoring stasis has work to do at CRIU's
	// post-restore point: the init reports it (PostRestore) and waits for
	// its answer on the fd after the inherited ones.
	PostRestore bool `json:"post_restore,omitempty"`
}

// pidnsReport is what the init writes on fd 3: one report with
// PostRestore set when CRIU reaches its post-restore point (if asked for),
// then the outcome.
type pidnsReport struct {
	PID         int    `json:"pid"` // the restored root's PID inside the namespace
	PostRestore bool   `json:"post_restore,omitempty"`
	Error       string `json:"error,omitempty"`
}

// restoreInNewPIDNS restores the tree inside a new PID (and mount)
// namespace, whose init is a copy of this binary (see Options.Supervised
// for how long it stays). The tree gets its own PIDs inside the namespace,
// whatever holds them outside. It returns the root's PID as this namespace
// sees it and as the new one does, and the init's. postRestore, when set,
// runs at CRIU's post-restore point, given the init's PID (as this
// namespace sees it); its error makes CRIU undo the restore.
func restoreInNewPIDNS(co criu.Options, images, work string, supervised bool, killAfter time.Duration, postRestore func(init int) error) (hostPID, nsPID, init int, err error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, 0, 0, err
	}
	request := pidnsRequest{CRIU: co, Images: images, Work: work, Supervised: supervised, KillAfter: killAfter, PostRestore: postRestore != nil}
	r, w, err := os.Pipe()
	if err != nil {
		return 0, 0, 0, err
	}
	answerR, answerW, err := os.Pipe()
	if err != nil {
		r.Close()
		w.Close()
		return 0, 0, 0, err
	}
	defer answerW.Close()
	files := []*os.File{w} // fd 3: the report
	for _, in := range co.InheritFDs {
		request.Inherit = append(request.Inherit, in.Key)
		files = append(files, in.File)
	}
	files = append(files, answerR) // then the answer to PostRestore
	req, _ := json.Marshal(request)
	cmd := exec.Command(exe, PIDNSInitArg, string(req))
	cmd.ExtraFiles = files
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS}
	if supervised {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		answerR.Close()
		return 0, 0, 0, fmt.Errorf("start a PID namespace: %w", err)
	}
	w.Close()
	answerR.Close()
	var rep pidnsReport
	reports := json.NewDecoder(r)
	decErr := reports.Decode(&rep)
	var postErr error
	if decErr == nil && rep.PostRestore && postRestore != nil {
		postErr = postRestore(cmd.Process.Pid)
		answer := pidnsReport{}
		if postErr != nil {
			answer.Error = postErr.Error()
		}
		json.NewEncoder(answerW).Encode(answer)
		rep = pidnsReport{}
		decErr = reports.Decode(&rep)
	}
	r.Close()
	host, found := 0, false
	if decErr == nil && rep.Error == "" && rep.PID != 0 {
		if host, found = hostPIDOf(cmd.Process.Pid, rep.PID); found {
			// The init stays; stasis run waits for it (Supervised),
			// otherwise whoever adopts it once stasis exits reaps it.
			init = cmd.Process.Pid
			cmd.Process.Release()
			return host, rep.PID, init, nil
		}
	}
	// Killing the init ends whatever runs in its namespace.
	cmd.Process.Kill()
	cmd.Wait()
	switch log := filepath.Join(work, criu.RestoreLog); {
	case postErr != nil:
		// CRIU undid the restore because of it.
		return 0, 0, 0, &criu.Error{Op: "restore", Err: postErr, Log: log, Excerpt: criu.ErrorLines(log, 6)}
	case rep.Error != "" && fileExists(log):
		// CRIU ran and failed: the same error as a restore here, so
		// that the caller keeps the log.
		return 0, 0, 0, &criu.Error{Op: "restore", Err: errors.New(rep.Error), Log: log, Excerpt: criu.ErrorLines(log, 6)}
	case rep.Error != "":
		return 0, 0, 0, errors.New(rep.Error)
	case rep.PID != 0:
		return 0, 0, 0, fmt.Errorf("restored PID %d inside the namespace, but cannot find it outside", rep.PID)
	}
	return 0, 0, 0, fmt.Errorf("the PID namespace's init reported nothing: %v", decErr)
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
		if p != init && checkpoint.NSPID(p) == nsPID {
			return p, true
		}
		kids, _ := checkpoint.Children(p)
		queue = append(queue, kids...)
	}
	return 0, false
}

// RunPIDNSInit is the init of the new PID namespace: it gives the namespace
// its own /proc, has CRIU restore the tree (which becomes its child),
// reports the root's PID on fd 3, and then reaps: until the tree is gone,
// or, supervised, until the root has ended (see Options.Supervised). It
// returns the process's exit code.
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
	for i, key := range req.Inherit {
		req.CRIU.InheritFDs = append(req.CRIU.InheritFDs, criu.InheritFD{Key: key, File: os.NewFile(uintptr(4+i), key)})
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
	var hooks criu.Hooks
	if req.PostRestore {
		answers := json.NewDecoder(os.NewFile(uintptr(4+len(req.Inherit)), "answer"))
		hooks.PostRestore = func(pid int) error {
			if err := json.NewEncoder(out).Encode(pidnsReport{PID: pid, PostRestore: true}); err != nil {
				return err
			}
			var answer pidnsReport
			if err := answers.Decode(&answer); err != nil {
				return fmt.Errorf("no answer from the restoring stasis: %w", err)
			}
			if answer.Error != "" {
				return errors.New(answer.Error)
			}
			return nil
		}
	}
	pid, err := criu.Restore(req.CRIU, req.Images, req.Work, hooks)
	for _, in := range req.CRIU.InheritFDs {
		in.File.Close() // the tree has its own copies now
	}
	if err != nil {
		report(pidnsReport{Error: err.Error()})
		return 1
	}
	report(pidnsReport{PID: pid})
	// The namespace lives as long as its init.
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.ECHILD) {
			waitForVisitors()
			return 0
		}
		if err == nil && got == pid && req.Supervised {
			status := endNamespace(checkpoint.ShellStatus(ws), req.KillAfter)
			waitForVisitors()
			return status
		}
	}
}

// visitors returns the processes of this namespace that came in from
// outside (setns: their parent is not in the namespace, so their PPid
// reads 0), such as the CRIU that checkpoints the tree from in here, with
// their descendants. The init neither stops them nor ends (which would
// kill them) while they run: CRIU ends the tree before it has finished.
func visitors() map[int]bool {
	entries, _ := os.ReadDir("/proc")
	parent := map[int]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == 1 {
			continue
		}
		if st, err := checkpoint.Status(pid); err == nil {
			parent[pid], _ = strconv.Atoi(st["PPid"])
		}
	}
	out := map[int]bool{}
	var isVisitor func(pid, depth int) bool
	isVisitor = func(pid, depth int) bool {
		ppid, ok := parent[pid]
		switch {
		case !ok || depth > len(parent):
			return false
		case ppid == 0:
			return true
		}
		return isVisitor(ppid, depth+1)
	}
	for pid := range parent {
		if isVisitor(pid, 0) {
			out[pid] = true
		}
	}
	return out
}

// waitForVisitors waits (up to two minutes) for the visitors to leave.
func waitForVisitors() {
	for deadline := time.Now().Add(2 * time.Minute); len(visitors()) > 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
	}
}

// endNamespace stops what runs in the init's namespace besides the init
// and its visitors (SIGTERM, then, once the init returns status, SIGKILL
// from the kernel), giving it up to killAfter to end.
func endNamespace(status int, killAfter time.Duration) int {
	spare := visitors()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil && pid != 1 && !spare[pid] {
			unix.Kill(pid, unix.SIGTERM)
		}
	}
	for deadline := time.Now().Add(killAfter); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		for {
			var ws unix.WaitStatus
			got, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if errors.Is(err, unix.ECHILD) {
				return status
			}
			if got <= 0 {
				break
			}
		}
	}
	return status
}
