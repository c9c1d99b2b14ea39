package hooks

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/stasis-ckpt/stasis/internal/atomicfile"
	"golang.org/x/sys/unix"
)

// RunDir is the directory of the store that holds what `stasis run`
// shares with its job and with `stasis hook prestop`.
const RunDir = "run"

// ErrAlreadyRunning is returned when another `stasis run` of the same job
// uses the same store.
var ErrAlreadyRunning = errors.New("job is already running under stasis run")

// runFiles are one job's files under $STASIS_HOME/run/:
//
//	J.pid             the PID of its `stasis run`, flocked while it runs
//	J.json            what that stasis run is doing (runState)
//	J.preempt         the preemption notice, once there is one
//	J.preempt.ack     created by the job when it has seen the notice
type runFiles struct{ dir, base string }

var plainJobName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$`)

func newRunFiles(home, job string) runFiles {
	base := job
	if !plainJobName.MatchString(job) {
		// Job names may hold '/', spaces and 200 characters: keep what is
		// safe and add a hash that keeps names apart.
		safe := strings.Map(func(r rune) rune {
			if r < 128 && (r == '.' || r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z') {
				return r
			}
			return '_'
		}, job)
		sum := sha256.Sum256([]byte(job))
		base = strings.TrimLeft(safe[:min(len(safe), 64)], ".") + "-" + hex.EncodeToString(sum[:6])
	}
	return runFiles{dir: filepath.Join(home, RunDir), base: base}
}

func (f runFiles) pidFile() string   { return filepath.Join(f.dir, f.base+".pid") }
func (f runFiles) stateFile() string { return filepath.Join(f.dir, f.base+".json") }
func (f runFiles) notice() string    { return filepath.Join(f.dir, f.base+".preempt") }
func (f runFiles) ack() string       { return f.notice() + ".ack" }

// withdrawnNotice is where the notice goes when stasis falls back to a
// process checkpoint: out of the job's sight.
func (f runFiles) withdrawnNotice() string {
	return filepath.Join(f.dir, "."+f.base+".preempt.withdrawn")
}

// runState is J.json: what the job's `stasis run` is doing.
type runState struct {
	PID    int    `json:"pid"` // of stasis run
	Job    string `json:"job"`
	Mode   Mode   `json:"mode"`
	Signal string `json:"signal"` // the preemption signal prestop sends
	JobPID int    `json:"job_pid,omitempty"`
	// State is starting, running, checkpointing, committed, failed (the
	// last checkpoint attempt failed; the job runs on) or stopping.
	State      string    `json:"state"`
	Attempts   int       `json:"attempts"` // checkpoint attempts so far
	Checkpoint string    `json:"checkpoint,omitempty"`
	Error      string    `json:"error,omitempty"`
	Updated    time.Time `json:"updated"`
}

func (f runFiles) writeState(st runState) error {
	st.Updated = time.Now().UTC()
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return atomicfile.Write(f.stateFile(), append(data, '\n'))
}

func (f runFiles) readState() (runState, error) {
	var st runState
	data, err := os.ReadFile(f.stateFile())
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(data, &st)
}

// lockPID takes J.pid for this process: flocked (exclusively) for as long
// as the returned file is open, with this process's PID in it.
func (f runFiles) lockPID(job string) (*os.File, error) {
	if err := os.MkdirAll(f.dir, 0o700); err != nil {
		return nil, err
	}
	for {
		file, err := os.OpenFile(f.pidFile(), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, err
		}
		if err := unix.Flock(int(file.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			holder, _ := os.ReadFile(f.pidFile())
			file.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, fmt.Errorf("%w: job %q is run by PID %s in this store (%s)", ErrAlreadyRunning, job, strings.TrimSpace(string(holder)), f.pidFile())
			}
			return nil, err
		}
		// The holder before us may have removed the file between our open
		// and our lock: then the lock is on a file no one else sees.
		var held, now unix.Stat_t
		if unix.Fstat(int(file.Fd()), &held) == nil && unix.Stat(f.pidFile(), &now) == nil && held.Ino == now.Ino {
			if err := file.Truncate(0); err != nil {
				file.Close()
				return nil, err
			}
			if _, err := file.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0); err != nil {
				file.Close()
				return nil, err
			}
			return file, nil
		}
		file.Close()
	}
}

// runningPID returns the PID of the `stasis run` of the job, if one holds
// J.pid now.
func (f runFiles) runningPID() (int, bool) {
	file, err := os.Open(f.pidFile())
	if err != nil {
		return 0, false
	}
	defer file.Close()
	if err := unix.Flock(int(file.Fd()), unix.LOCK_SH|unix.LOCK_NB); err == nil {
		return 0, false // a leftover: no one holds it
	}
	data, _ := os.ReadFile(f.pidFile())
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	return pid, err == nil && pid > 0
}

// release removes the job's files; the lock goes with the file's close.
func (f runFiles) release(pidFile *os.File) {
	for _, p := range []string{f.notice(), f.ack(), f.withdrawnNotice(), f.stateFile(), f.pidFile()} {
		os.Remove(p)
	}
	pidFile.Close()
}
