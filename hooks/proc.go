package hooks

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/stasis-ckpt/stasis/checkpoint"
	"golang.org/x/sys/unix"
)

// procStat is what stasis run needs of /proc/PID/stat.
type procStat struct {
	State   byte // R, S, Z, ...
	Session int
}

func readProcStat(pid int) (procStat, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	// "pid (comm) state ppid pgrp session ...": comm may hold anything,
	// so count the fields after its last ')'.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 4 || len(f[0]) != 1 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: too short", pid)
	}
	sid, err := strconv.Atoi(f[3])
	return procStat{State: f[0][0], Session: sid}, err
}

// sessionMembers lists the processes of session sid, zombies aside.
func sessionMembers(sid int) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := readProcStat(pid); err == nil && st.Session == sid && st.State != 'Z' {
			pids = append(pids, pid)
		}
	}
	return pids
}

// signalTree sends sig to the job's tree: its root's process group, the
// processes of its session (the job is a session of its own, and the
// processes it orphaned stay in it) and the root's descendants that left
// the session.
func signalTree(root int, sig syscall.Signal) {
	syscall.Kill(-root, sig)
	pids := sessionMembers(root)
	if tree, err := checkpoint.Tree(root); err == nil {
		for _, p := range tree {
			pids = append(pids, p.PID)
		}
	}
	for _, pid := range pids {
		syscall.Kill(pid, sig)
	}
}

// reapJob reaps the zombies among this process's children that belong to
// the job (waitFor: its root, or the init of the PID namespace it was
// restored into; and processes of the root's session orphaned to stasis
// as the subreaper); children stasis started itself (CRIU, hook scripts,
// the GPU watchdog) are in other sessions and are left to their own Wait.
// It returns waitFor's wait status once it is reaped.
func reapJob(root, waitFor int) (status unix.WaitStatus, reaped bool) {
	kids, _ := checkpoint.Children(os.Getpid())
	for _, pid := range kids {
		st, err := readProcStat(pid)
		if err != nil || st.State != 'Z' || (pid != waitFor && st.Session != root) {
			continue
		}
		var ws unix.WaitStatus
		got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		if err == nil && got == pid && pid == waitFor {
			status, reaped = ws, true
		}
	}
	return status, reaped
}

// ParseSignals reads "USR1,TERM" (names with or without SIG, or numbers)
// as the preemption signals stasis run may own.
func ParseSignals(list string) ([]syscall.Signal, error) {
	var sigs []syscall.Signal
	for _, name := range strings.Split(list, ",") {
		name = strings.ToUpper(strings.TrimSpace(name))
		if name == "" {
			continue
		}
		var sig syscall.Signal
		if n, err := strconv.Atoi(name); err == nil {
			sig = syscall.Signal(n)
		} else {
			sig = unix.SignalNum("SIG" + strings.TrimPrefix(name, "SIG"))
		}
		if !forwardable(sig) {
			return nil, fmt.Errorf("%q is not a signal stasis run can take as a preemption signal (one of %s)", name, signalNames(forwarded))
		}
		sigs = append(sigs, sig)
	}
	if len(sigs) == 0 {
		return nil, errors.New("no preemption signal given")
	}
	return sigs, nil
}

// forwarded are the signals stasis run passes on to the job unless they
// are preemption signals.
var forwarded = []syscall.Signal{syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2,
	syscall.SIGALRM, syscall.SIGTERM, syscall.SIGWINCH, syscall.SIGXCPU}

func forwardable(sig syscall.Signal) bool {
	for _, s := range forwarded {
		if s == sig {
			return true
		}
	}
	return false
}

func signalNames(sigs []syscall.Signal) string {
	names := make([]string, len(sigs))
	for i, s := range sigs {
		names[i] = SignalName(s)
	}
	return strings.Join(names, ", ")
}

// SignalName is "USR1" for SIGUSR1.
func SignalName(sig syscall.Signal) string {
	if name := unix.SignalName(sig); name != "" {
		return strings.TrimPrefix(name, "SIG")
	}
	return strconv.Itoa(int(sig))
}
