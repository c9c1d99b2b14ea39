// Package criu drives CRIU (criu swrk, through go-criu) to dump process
// trees into image directories and restore them. It owns the option set
// stasis uses, finding a CRIU binary and checking its version, feature
// probes, the notify callbacks that let other steps (the store commit, the
// CUDA checkpoint) run while the tree is frozen, the error lines quoted
// from CRIU's own log when something fails, and running CRIU inside a
// tree's PID and mount namespaces (Options.NamespacesOf; nsenter.c).
//
// CRIU needs root (or CAP_CHECKPOINT_RESTORE and friends); kernels from 6.13
// on need CRIU 4.1 or later.
package criu

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	gocriu "github.com/checkpoint-restore/go-criu/v7"
	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// MinVersion is the oldest CRIU stasis accepts (major*10000+minor*100+sub).
const MinVersion = 40000

// Log file names, written into the images directory.
const (
	DumpLog    = "dump.log"
	RestoreLog = "restore.log"
)

// ErrNotInstalled is returned when no criu binary can be found.
var ErrNotInstalled = errors.New("criu is not installed")

// ErrTooOld is returned for a CRIU older than MinVersion.
var ErrTooOld = errors.New("criu is too old")

// Find returns the criu binary stasis uses: $STASIS_CRIU, else a criu next
// to the running executable (where `make` builds one), else criu on PATH.
func Find() (string, error) {
	if p := os.Getenv("STASIS_CRIU"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%w: STASIS_CRIU=%s: %v (unset it to use the criu that `make` builds into bin/)", ErrNotInstalled, p, err)
		}
		return p, nil
	}
	if exe, err := os.Executable(); err == nil {
		beside := filepath.Join(filepath.Dir(exe), "criu")
		if st, err := os.Stat(beside); err == nil && st.Mode().IsRegular() {
			return beside, nil
		}
	}
	if p, err := exec.LookPath("criu"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%w: no criu in $STASIS_CRIU, beside stasis, or on PATH; run `make` to build CRIU 4.1.1 into bin/, or install CRIU >= 4.0", ErrNotInstalled)
}

// Version runs `criu --version` and returns the version as
// major*10000 + minor*100 + sublevel (as go-criu's GetCriuVersion does).
func Version(path string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return 0, fmt.Errorf("%w: %s --version: %v", ErrNotInstalled, path, err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "Version:")
		if !ok {
			continue
		}
		if v, ok := parseVersion(rest); ok {
			return v, nil
		}
	}
	return 0, fmt.Errorf("%w: %s --version printed no version", ErrNotInstalled, path)
}

// FormatVersion renders 40101 as "4.1.1".
func FormatVersion(v int) string {
	return fmt.Sprintf("%d.%d.%d", v/10000, v/100%100, v%100)
}

// Resolve finds criu (or uses path when set) and checks its version, asking
// CRIU (ResolveCached without a cache).
func Resolve(path string) (string, int, error) {
	return ResolveCached(path, "")
}

// HasFeature runs `criu check --feature name` (mem_dirty_track, uffd,
// pidfd_store, timens, ...). go-criu's FeatureCheck is not used: v7.2.0
// returns the request rather than CRIU's answer.
func HasFeature(ctx context.Context, path, name string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "check", "--feature", name).CombinedOutput()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return false, nil
		}
		return false, fmt.Errorf("criu check --feature %s: %w", name, err)
	}
	return strings.Contains(string(out), "is supported"), nil
}

// Options are the CRIU options stasis exposes, translated into CRIU's RPC
// options in one place (rpcOpts).
type Options struct {
	// Path of the criu binary; "" means Find.
	Path string
	// LeaveRunning keeps the tree running after a successful dump.
	LeaveRunning bool
	// ShellJob allows a tree that is part of a terminal session.
	ShellJob bool
	// TCPEstablished dumps and restores established TCP connections.
	TCPEstablished bool
	// ExtUnixSockets allows unix sockets connected to peers outside the
	// tree.
	ExtUnixSockets bool
	// FileLocks dumps and restores file locks.
	FileLocks bool
	// LinkRemap (dump only) lets CRIU dump an open or mapped file whose
	// path is gone while the file itself is still linked elsewhere (a
	// /dev/shm/sem.* semaphore: glibc maps a temporary file, links it as
	// the semaphore and unlinks the temporary name): CRIU links it under
	// a name of its own (link_remap.N) beside the old one, which the
	// restore removes (CRIU's --link-remap).
	LinkRemap bool
	// GhostLimit (dump only), when not zero, is the size up to which CRIU
	// copies an open or mapped file that is unlinked everywhere (a ghost
	// file) into the images, instead of its default 1 MiB (CRIU's
	// --ghost-limit). The checkpoint's preflight sizes it.
	GhostLimit int64
	// Version is what Resolve found Path to be. When set (with Path), the
	// dump or restore runs Path as it is, without asking its version again.
	Version int
	// LogLevel of CRIU's log (0 to 4). When zero: 4 (debug) for restores,
	// whose log is kept with the images and quoted on failure, and 3
	// (info) for dumps, whose debug lines (a few per page pipe, 17,000
	// for a GiB of memory) cost CRIU about a tenth of its dump time.
	LogLevel int
	// InheritFDs (restore only) give the restored tree files of this
	// process in place of resources that were outside the dumped tree,
	// such as the pipe its output went to (CRIU's --inherit-fd).
	InheritFDs []InheritFD `json:"-"`
	// NamespacesOf, when set, runs CRIU inside the PID and mount
	// namespaces of that process (a PID of this namespace): for a tree in
	// a PID namespace of its own, with that namespace's /proc mounted in
	// its mount namespace, CRIU then sees it as it sees itself, and its
	// images are those of a tree with no namespace. PIDs given to CRIU
	// are then that namespace's.
	NamespacesOf int `json:"-"`
	// Stream has CRIU hand the images of a dump to an ImageCapture, or
	// read those of a restore from an ImageServer, listening in the
	// images directory, instead of using files: `criu dump --stream`,
	// `criu restore --stream`. CRIU offers streaming only on its command
	// line (its RPC service refuses it), so these run `criu dump` and
	// `criu restore` rather than `criu swrk`: a streamed dump runs its
	// hooks through CRIU's action script (RunActionHook), a streamed
	// restore takes none. Neither runs inside other namespaces
	// (NamespacesOf).
	Stream bool `json:"stream,omitempty"`
	// LazyPages (streamed dumps only) has CRIU leave the contents of the
	// tree's private anonymous memory out of its pages images (`criu dump
	// --lazy-pages`, its lazy-page server given a socket whose other end
	// is already closed, so it ends at once): the post-dump hook, run with
	// the tree frozen, copies those pages itself (CopyLazyPages).
	LazyPages bool `json:"lazy_pages,omitempty"`
}

// MaxGhostLimit is the largest GhostLimit: CRIU's service takes the limit
// as 32 bits.
const MaxGhostLimit = 4<<30 - 1<<20

// InheritFD replaces, on restore, the outside resource CRIU's images name
// Key ("pipe:[INODE]", as /proc/PID/fd shows it at dump time) by File.
type InheritFD struct {
	Key  string
	File *os.File
}

// logLevel is LogLevel, or op's level when unset.
func (o Options) logLevel(op string) int {
	switch {
	case o.LogLevel != 0:
		return o.LogLevel
	case op == "dump":
		return 3
	}
	return 4
}

// binary is the criu to run: Path as Resolve found it (Version set), or
// Resolve's answer.
func (o Options) binary() (string, error) {
	if o.Path != "" && o.Version != 0 {
		return o.Path, nil
	}
	path, _, err := Resolve(o.Path)
	return path, err
}

// rpcOpts translates o. config, when set, is a CRIU configuration file
// that CRIU inherits (NamespacesOf).
func (o Options) rpcOpts(op string, imagesDir, workDir, config *os.File, logFile string) *rpc.CriuOpts {
	level := o.logLevel(op)
	opts := &rpc.CriuOpts{
		ImagesDirFd:    proto.Int32(int32(imagesDir.Fd())),
		WorkDirFd:      proto.Int32(int32(workDir.Fd())),
		LogFile:        proto.String(logFile),
		LogLevel:       proto.Int32(int32(level)),
		LeaveRunning:   proto.Bool(o.LeaveRunning),
		ShellJob:       proto.Bool(o.ShellJob),
		TcpEstablished: proto.Bool(o.TCPEstablished),
		ExtUnixSk:      proto.Bool(o.ExtUnixSockets),
		FileLocks:      proto.Bool(o.FileLocks),
	}
	if op == "dump" {
		opts.LinkRemap = proto.Bool(o.LinkRemap)
		if o.GhostLimit > 0 {
			opts.GhostLimit = proto.Uint32(uint32(min(o.GhostLimit, MaxGhostLimit)))
		}
	}
	for _, in := range o.InheritFDs {
		opts.InheritFd = append(opts.InheritFd, &rpc.InheritFd{Key: proto.String(in.Key), Fd: proto.Int32(int32(in.File.Fd()))})
	}
	if config != nil {
		// CRIU in another PID namespace cannot reach this process's
		// files as /proc/PID/fd/N (it does not see PID): it gets the
		// directories as its own inherited files, the work directory
		// through a configuration file, RPC having no path for it.
		opts.ImagesDirFd = proto.Int32(-1)
		opts.ImagesDir = proto.String(fmt.Sprintf("/proc/self/fd/%d", imagesDir.Fd()))
		opts.WorkDirFd = nil
		opts.ConfigFile = proto.String(fmt.Sprintf("/proc/self/fd/%d", config.Fd()))
	}
	return opts
}

// Hooks run at CRIU's notify points. Each may be nil. An error from
// PostDump makes CRIU resume the tree instead of killing it (and the dump
// fails); an error from PreDump aborts the dump before anything is frozen
// for long.
type Hooks struct {
	PreDump     func() error
	PostDump    func() error
	PreRestore  func() error
	PostRestore func(pid int) error
}

type notifier struct {
	gocriu.NoNotify
	h Hooks
}

func (n notifier) PreDump() error {
	if n.h.PreDump != nil {
		return n.h.PreDump()
	}
	return nil
}

func (n notifier) PostDump() error {
	if n.h.PostDump != nil {
		return n.h.PostDump()
	}
	return nil
}

func (n notifier) PreRestore() error {
	if n.h.PreRestore != nil {
		return n.h.PreRestore()
	}
	return nil
}

func (n notifier) PostRestore(pid int32) error {
	if n.h.PostRestore != nil {
		return n.h.PostRestore(int(pid))
	}
	return nil
}

// Error is a failed CRIU operation, with the error lines of CRIU's log.
type Error struct {
	Op      string   // "dump" or "restore"
	Err     error    // what go-criu or a hook reported
	Log     string   // the log file
	Excerpt []string // CRIU's error lines from it
}

func (e *Error) Error() string {
	if len(e.Excerpt) > 0 {
		return fmt.Sprintf("criu %s failed; criu says: %s (log: %s)", e.Op, strings.Join(e.Excerpt, " | "), e.Log)
	}
	return fmt.Sprintf("criu %s failed: %v", e.Op, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// MakeDirs creates the two directories a CRIU run needs inside root:
// images/ for the image files and work/ for its log.
func MakeDirs(root string) (images, work string, err error) {
	images, work = filepath.Join(root, "images"), filepath.Join(root, "work")
	for _, d := range []string{images, work} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return "", "", err
		}
	}
	return images, work, nil
}

// Dump dumps the tree rooted at pid (as o.NamespacesOf's PID namespace
// sees it, when set) into imagesDir (or, with o.Stream, the ImageCapture
// listening there), calling hooks at CRIU's notify points. CRIU's log goes
// to workDir/dump.log: it is still being written while PostDump runs, when
// the images are complete. Both directories must exist.
func Dump(o Options, pid int, imagesDir, workDir string, hooks Hooks) error {
	if o.Stream {
		return dumpStreamed(o, pid, imagesDir, workDir, hooks)
	}
	if o.LazyPages {
		return errors.New("criu dump: lazy pages need a streamed dump")
	}
	return run("dump", o, imagesDir, workDir, DumpLog, hooks, func(c *gocriu.Criu, opts *rpc.CriuOpts, n gocriu.Notify) error {
		opts.Pid = proto.Int32(int32(pid))
		return c.Dump(opts, n)
	})
}

// Restore restores the tree imaged in imagesDir, detached: the restored root
// becomes a child of this process (restore-sibling), so it keeps running
// after stasis exits. It returns the root's PID. CRIU's log goes to
// workDir/restore.log.
func Restore(o Options, imagesDir, workDir string, hooks Hooks) (int, error) {
	if o.Stream {
		if hooks.PreDump != nil || hooks.PostDump != nil || hooks.PreRestore != nil || hooks.PostRestore != nil {
			return 0, errors.New("criu restore: a streamed restore takes no hooks")
		}
		return restoreStreamed(o, imagesDir, workDir)
	}
	pid := 0
	inner := hooks.PostRestore
	hooks.PostRestore = func(p int) error {
		pid = p
		if inner != nil {
			return inner(p)
		}
		return nil
	}
	err := run("restore", o, imagesDir, workDir, RestoreLog, hooks, func(c *gocriu.Criu, opts *rpc.CriuOpts, n gocriu.Notify) error {
		opts.RstSibling = proto.Bool(true)
		return c.Restore(opts, n)
	})
	if err == nil && pid == 0 {
		err = &Error{Op: "restore", Err: errors.New("CRIU reported success but no restored PID")}
	}
	return pid, err
}

// launcherEnv names, in the environment of `criu swrk`'s launcher, the
// criu binary it must exec (see Launch).
const launcherEnv = "STASIS_CRIU_SWRK"

// Launch is what this binary does when go-criu starts it in place of criu
// (args: "swrk", fd): it moves into a process group of its own, so that a
// Ctrl-C in a terminal, sent to stasis's whole process group, does not
// reach CRIU (killed mid-dump, CRIU would leave its parasite code inside
// the job), then becomes the real criu, the swrk socket still open. It
// returns only on failure. ok is false when this process was not started
// as a launcher.
func Launch(args []string) (ok bool, err error) {
	criuPath := os.Getenv(launcherEnv)
	if criuPath == "" || len(args) == 0 || args[0] != "swrk" {
		return false, nil
	}
	if spec := os.Getenv(nsenterEnv); spec != "" {
		// nsenter.c entered them before main.
		if err := entered(spec); err != nil {
			return true, fmt.Errorf("criu launcher: %w", err)
		}
		os.Unsetenv(nsenterEnv)
	}
	if err := unix.Setpgid(0, 0); err != nil {
		return true, fmt.Errorf("criu launcher: setpgid: %w", err)
	}
	os.Unsetenv(launcherEnv)
	return true, unix.Exec(criuPath, append([]string{criuPath}, args...), os.Environ())
}

// ClearLauncherEnv unsets the launcher's variables (STASIS_CRIU_SWRK,
// STASIS_CRIU_NSENTER: every STASIS_CRIU_*), which only stasis sets, for
// the launcher it starts: inherited, or set by a user, they would make the
// next CRIU stasis starts run elsewhere. A process that is not acting as
// the launcher calls it at its start.
func ClearLauncherEnv() {
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "STASIS_CRIU_") {
			os.Unsetenv(name)
		}
	}
}

func run(op string, o Options, imagesDir, workDir, logName string, hooks Hooks, do func(*gocriu.Criu, *rpc.CriuOpts, gocriu.Notify) error) error {
	path, err := o.binary()
	if err != nil {
		return err
	}
	// go-criu starts the binary it is given with the swrk arguments; give
	// it this binary, which (Launch) starts criu in its own process group.
	self, selfErr := os.Executable()
	if selfErr == nil {
		os.Setenv(launcherEnv, path)
		defer os.Unsetenv(launcherEnv)
		path = self
	}
	images, err := os.Open(imagesDir)
	if err != nil {
		return err
	}
	defer images.Close()
	work, err := os.Open(workDir)
	if err != nil {
		return err
	}
	defer work.Close()
	// CRIU (go-criu starts it with no extra files) gets the inherited
	// files by their numbers in this process: they stay open across its
	// exec for as long as it starts.
	inherited := []*os.File{}
	for _, in := range o.InheritFDs {
		inherited = append(inherited, in.File)
	}
	var config *os.File
	if o.NamespacesOf != 0 {
		if selfErr != nil {
			return fmt.Errorf("criu %s inside the namespaces of PID %d needs stasis's own binary as its launcher: %w", op, o.NamespacesOf, selfErr)
		}
		spec, err := namespaces(o.NamespacesOf)
		if err != nil {
			return err
		}
		if config, err = workDirConfig(work); err != nil {
			return err
		}
		defer config.Close()
		os.Setenv(nsenterEnv, spec)
		defer os.Unsetenv(nsenterEnv)
		inherited = append(inherited, images, work, config)
	}
	for _, f := range inherited {
		if _, err := unix.FcntlInt(f.Fd(), unix.F_SETFD, 0); err != nil {
			return fmt.Errorf("pass %s to criu: %w", f.Name(), err)
		}
		defer unix.FcntlInt(f.Fd(), unix.F_SETFD, unix.FD_CLOEXEC)
	}
	c := gocriu.MakeCriu()
	c.SetCriuPath(path)
	logPath := filepath.Join(workDir, logName)
	if err := do(c, o.rpcOpts(op, images, work, config, logName), notifier{h: hooks}); err != nil {
		return &Error{Op: op, Err: err, Log: logPath, Excerpt: ErrorLines(logPath, 6)}
	}
	return nil
}

// workDirConfig is a CRIU configuration file, in memory, that names work
// (as CRIU, which inherits it, sees it) as the work directory.
func workDirConfig(work *os.File) (*os.File, error) {
	fd, err := unix.MemfdCreate("criu.conf", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("criu configuration: %w", err)
	}
	f := os.NewFile(uintptr(fd), "criu.conf")
	if _, err := fmt.Fprintf(f, "work-dir /proc/self/fd/%d\n", work.Fd()); err != nil {
		f.Close()
		return nil, fmt.Errorf("criu configuration: %w", err)
	}
	return f, nil
}

// PIDTaken reports whether err is a CRIU restore that failed because a
// PID it was restoring was taken ("Can't fork for N: File exists"), and
// returns that line.
func PIDTaken(err error) (string, bool) {
	var ce *Error
	if !errors.As(err, &ce) || ce.Op != "restore" {
		return "", false
	}
	for _, line := range ce.Excerpt {
		if strings.HasPrefix(line, "Can't fork for ") && strings.HasSuffix(line, ": File exists") {
			return line, true
		}
	}
	return "", false
}

// harmless reports CRIU error lines that do not explain a failure: CRIU
// logs them as errors and goes on.
func harmless(msg string) bool {
	return strings.Contains(msg, "Can't setup RLIMIT_NOFILE")
}

// KeepLog moves the log an Error refers to somewhere that outlives the
// operation's scratch directory: keep copies it and returns the new path.
func KeepLog(err error, keep func(src, name string) (string, error)) {
	var ce *Error
	if errors.As(err, &ce) && ce.Log != "" {
		if kept, kerr := keep(ce.Log, ce.Op+".log"); kerr == nil {
			ce.Log = kept
		}
	}
}

// ErrorLines returns up to max error lines of a CRIU log, without CRIU's
// "(00.001234) Error (criu/x.c:12):" prefixes: what runc's logCriuErrors
// shows its users.
func ErrorLines(logPath string, max int) []string {
	f, err := os.Open(logPath)
	if err != nil {
		return nil
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		i := strings.Index(line, "Error (")
		if i < 0 {
			continue
		}
		msg := line[i:]
		if j := strings.Index(msg, "): "); j >= 0 {
			msg = msg[j+3:]
		}
		msg = strings.TrimSpace(msg)
		if msg == "" || strings.HasPrefix(msg, "Dumping FAILED") || strings.HasPrefix(msg, "Restoring FAILED") || harmless(msg) {
			continue
		}
		lines = append(lines, msg)
		if len(lines) == max {
			break
		}
	}
	return lines
}
