package zdtm_test

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The tests daemonize, CRIU kills the dumped tree, and a restored tree is
// left behind by CRIU: all of them end up children of init, which on these
// machines takes a second or two to reap them, while a restore fails as long
// as any of the tree's PIDs is held, even by a zombie. So this test process
// is a child subreaper: orphans of its descendants become its children, and
// the reaper waits for them at once. It leaves alone the commands it runs
// itself (make, criu, stasis), whose statuses exec.Cmd waits for.

type reaper struct {
	mu  sync.Mutex
	own map[int]bool // PIDs of commands run through run
}

var procs = &reaper{own: map[int]bool{}}

// becomeSubreaper makes this process a child subreaper and starts reaping.
func becomeSubreaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("PR_SET_CHILD_SUBREAPER: %w", err)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	go func() {
		tick := time.NewTicker(100 * time.Millisecond)
		for {
			select {
			case <-sigs:
			case <-tick.C:
			}
			procs.reap()
		}
	}()
	return nil
}

// run runs cmd to its end; its PID is never reaped by the reaper.
func (r *reaper) run(cmd *exec.Cmd) error {
	r.mu.Lock()
	err := cmd.Start()
	if err == nil {
		r.own[cmd.Process.Pid] = true
	}
	r.mu.Unlock()
	if err != nil {
		return err
	}
	err = cmd.Wait()
	r.mu.Lock()
	delete(r.own, cmd.Process.Pid)
	r.mu.Unlock()
	return err
}

// children lists this process's children (of all its threads).
func children() []int {
	var pids []int
	tasks, _ := filepath.Glob("/proc/self/task/*/children")
	for _, f := range tasks {
		data, _ := os.ReadFile(f)
		for _, s := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(s); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// reap waits for every child that is a zombie and not one of run's.
func (r *reaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, pid := range children() {
		if r.own[pid] {
			continue
		}
		if st, ok := stat(pid); ok && st.state == 'Z' {
			var ws unix.WaitStatus
			unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		}
	}
}

type procStat struct {
	state               byte
	ppid, pgrp, session int
}

// stat reads /proc/PID/stat.
func stat(pid int) (procStat, bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, false
	}
	// pid (comm) state ppid pgrp session ...; comm may hold anything.
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 4 {
		return procStat{}, false
	}
	var st procStat
	st.state = f[0][0]
	st.ppid, _ = strconv.Atoi(f[1])
	st.pgrp, _ = strconv.Atoi(f[2])
	st.session, _ = strconv.Atoi(f[3])
	return st, true
}

// alive reports whether pid runs (exists and is not a zombie).
func alive(pid int) bool {
	st, ok := stat(pid)
	return ok && st.state != 'Z'
}

// gone waits up to d for pid to end (a zombie counts as ended: the reaper
// or init takes it), then up to d more for its PID to be free.
func gone(pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for alive(pid) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	deadline = time.Now().Add(d)
	for {
		if _, ok := stat(pid); !ok {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// killLeftovers kills what a test left: every process of session sid (the
// test's own: it calls setsid) and every descendant of this process that
// is not one of run's commands, and waits for their PIDs to be free.
func (r *reaper) killLeftovers(sid int) {
	for round := 0; round < 50; round++ {
		r.mu.Lock()
		all := map[int]procStat{}
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			if pid, err := strconv.Atoi(e.Name()); err == nil {
				if st, ok := stat(pid); ok {
					all[pid] = st
				}
			}
		}
		self := os.Getpid()
		mine := func(pid int) bool { // descends from self, not through run's
			for i := 0; i < 64 && pid > 1; i++ {
				st, ok := all[pid]
				if !ok || r.own[pid] {
					return false
				}
				if st.ppid == self {
					return true
				}
				pid = st.ppid
			}
			return false
		}
		var left []int
		for pid, st := range all {
			if pid != self && (sid > 1 && st.session == sid || mine(pid)) {
				left = append(left, pid)
				if st.state != 'Z' {
					unix.Kill(pid, unix.SIGKILL)
				}
			}
		}
		r.mu.Unlock()
		if len(left) == 0 {
			return
		}
		r.reap()
		time.Sleep(20 * time.Millisecond)
	}
}
