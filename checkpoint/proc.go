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
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
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

// PIDHolder describes the process that holds pid, or "" when pid is free.
func PIDHolder(pid int) string {
	status, err := Status(pid)
	if err != nil {
		return ""
	}
	name, state := status["Name"], status["State"]
	if name == "" {
		name = "?"
	}
	if strings.HasPrefix(state, "Z") {
		return fmt.Sprintf("%s, a zombie its parent has not reaped yet", name)
	}
	return fmt.Sprintf("%s (%s)", name, state)
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
