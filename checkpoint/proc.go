package checkpoint

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrNoProcess is returned for a PID that names no running process.
var ErrNoProcess = errors.New("no such process")

// Process describes one process of a tree as /proc shows it.
type Process struct {
	PID     int      `json:"pid"`
	Comm    string   `json:"comm"`
	Exe     string   `json:"exe,omitempty"`
	Cmdline []string `json:"cmdline,omitempty"`
	// Threads lists the IDs of the process's threads (its PID among them):
	// CRIU restores them all with the same IDs, so they must all be free.
	Threads []int `json:"threads"`
	// RSSBytes is the resident memory, the first guess at the image size.
	RSSBytes int64 `json:"rss_bytes"`
}

// Tree returns the process pid and all its descendants, pid first, from
// /proc/PID/task/TID/children.
func Tree(pid int) ([]Process, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("%w: PID %d", ErrNoProcess, pid)
	}
	if err := unix.Kill(pid, 0); errors.Is(err, unix.ESRCH) {
		return nil, fmt.Errorf("%w: PID %d", ErrNoProcess, pid)
	}
	var tree []Process
	queue := []int{pid}
	seen := map[int]bool{}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if seen[p] {
			continue
		}
		seen[p] = true
		info, err := readProcess(p)
		if err != nil {
			if p == pid {
				return nil, err
			}
			continue // a child that exited meanwhile
		}
		tree = append(tree, info)
		kids, _ := Children(p)
		queue = append(queue, kids...)
	}
	return tree, nil
}

// Status reads /proc/PID/status: each field's value, trimmed, by name.
func Status(pid int) (map[string]string, error) {
	return readStatus(filepath.Join("/proc", strconv.Itoa(pid), "status"))
}

func readStatus(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	fields := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	return fields, nil
}

func readProcess(pid int) (Process, error) {
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	status, err := Status(pid)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return Process{}, fmt.Errorf("%w: PID %d", ErrNoProcess, pid)
		}
		return Process{}, err
	}
	if strings.HasPrefix(status["State"], "Z") {
		return Process{}, fmt.Errorf("%w: PID %d is a zombie", ErrNoProcess, pid)
	}
	p := Process{PID: pid, Comm: status["Name"]}
	kb, _ := strconv.ParseInt(strings.TrimSuffix(status["VmRSS"], " kB"), 10, 64)
	p.RSSBytes = kb << 10
	p.Exe, _ = os.Readlink(filepath.Join(dir, "exe"))
	if tasks, err := os.ReadDir(filepath.Join(dir, "task")); err == nil {
		for _, t := range tasks {
			if tid, err := strconv.Atoi(t.Name()); err == nil {
				p.Threads = append(p.Threads, tid)
			}
		}
	}
	if cmd, err := os.ReadFile(filepath.Join(dir, "cmdline")); err == nil && len(cmd) > 0 {
		for _, arg := range bytes.Split(bytes.TrimSuffix(cmd, []byte{0}), []byte{0}) {
			p.Cmdline = append(p.Cmdline, string(arg))
		}
	}
	return p, nil
}

// Children lists the PIDs of pid's children (those of all its threads).
func Children(pid int) ([]int, error) {
	tasks, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
	if err != nil {
		return nil, err
	}
	var kids []int
	for _, t := range tasks {
		data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "task", t.Name(), "children"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(data)) {
			if k, err := strconv.Atoi(f); err == nil {
				kids = append(kids, k)
			}
		}
	}
	return kids, nil
}

// NSPID is the PID of a process (or the ID of a thread: pid/task/TID) in
// its own PID namespace, the last of its NSpid; 0 when it is gone.
func NSPID(pid int) int {
	return lastNSpid(filepath.Join("/proc", strconv.Itoa(pid), "status"))
}

func lastNSpid(statusPath string) int {
	status, err := readStatus(statusPath)
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

// ownPIDNS reports whether pid runs in a PID namespace nested in this
// process's, and is not its init.
func ownPIDNS(pid int) (bool, error) {
	self, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return false, err
	}
	ns, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "ns", "pid"))
	if err != nil {
		return false, fmt.Errorf("%w: PID %d: %v", ErrNoProcess, pid, err)
	}
	return ns != self && NSPID(pid) > 1, nil
}

// ownProcMounted reports whether the /proc that pid sees, in its mount
// namespace, is its own PID namespace's: CRIU run from inside needs it.
func ownProcMounted(pid int) bool {
	ns, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "ns", "pid"))
	if err != nil {
		return false
	}
	initNS, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "root", "proc", "1", "ns", "pid"))
	return err == nil && initNS == ns
}

// insideView is the tree with the PIDs and thread IDs its own PID
// namespace gives it: those its CRIU images hold when CRIU dumps it from
// inside. Processes that ended meanwhile are left out.
func insideView(tree []Process) []Process {
	var inside []Process
	for _, p := range tree {
		q := p
		if q.PID = NSPID(p.PID); q.PID == 0 {
			continue
		}
		q.Threads = nil
		for _, tid := range p.Threads {
			if id := lastNSpid(filepath.Join("/proc", strconv.Itoa(p.PID), "task", strconv.Itoa(tid), "status")); id != 0 {
				q.Threads = append(q.Threads, id)
			}
		}
		inside = append(inside, q)
	}
	return inside
}

// PIDHolder describes the process that holds pid, or "" when pid is free,
// and says whether it is a zombie.
func PIDHolder(pid int) (string, bool) {
	status, err := Status(pid)
	if err != nil {
		return "", false
	}
	name, state := status["Name"], status["State"]
	if name == "" {
		name = "?"
	}
	if strings.HasPrefix(state, "Z") {
		return fmt.Sprintf("%s, a zombie its parent has not reaped yet", name), true
	}
	return fmt.Sprintf("%s (%s)", name, state), false
}

// ShellStatus is a wait status as a shell reports it: the exit status, or
// 128 + the signal's number.
func ShellStatus(ws unix.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// running reports whether pid exists and is not a zombie.
func running(pid int) bool {
	_, err := readProcess(pid)
	return err == nil
}

// treeRSS adds up the resident memory of the tree's processes now.
func treeRSS(tree []Process) int64 {
	var rss int64
	for _, p := range tree {
		if now, err := readProcess(p.PID); err == nil {
			rss += now.RSSBytes
		}
	}
	return rss
}
