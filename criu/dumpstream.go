package criu

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// hookEnv names, in the environment of a command-line CRIU, the socket its
// action script (this binary: RunActionHook) reaches stasis's hooks
// through.
const hookEnv = "STASIS_CRIU_HOOK"

// hookSocket is the hook server's socket, in the work directory.
const hookSocket = "hooks.sock"

// dumpStreamed runs `criu dump --stream`: CRIU hands every image file to
// the ImageCapture listening in imagesDir instead of writing it. CRIU's
// service (swrk) refuses streaming, so this is the command line, and the
// hooks run through an action script (actionScript) that, at the actions
// with a hook, runs this binary, which asks the hook server of this
// process what to answer (RunActionHook). If this process dies, that
// fails, and so do CRIU's writes into the image pipes: CRIU resumes the
// tree.
func dumpStreamed(o Options, pid int, imagesDir, workDir string, hooks Hooks) error {
	path, err := o.binary()
	if err != nil {
		return err
	}
	if o.NamespacesOf != 0 {
		return errors.New("criu dump: a streamed dump cannot run inside another process's namespaces")
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("criu dump: a streamed dump runs stasis's own binary as CRIU's action script: %w", err)
	}
	hs, err := serveHooks(filepath.Join(workDir, hookSocket), hooks)
	if err != nil {
		return err
	}
	defer hs.Close()
	script := actionScript(workDir, self, hooks)
	args := []string{"dump", "--stream", "--tree", strconv.Itoa(pid), "--images-dir", imagesDir, "--work-dir", workDir,
		"--log-file", DumpLog, fmt.Sprintf("-v%d", o.logLevel("dump")), "--action-script", script}
	if o.LeaveRunning {
		args = append(args, "--leave-running")
	}
	var extra []*os.File
	if o.LazyPages {
		sock, err := closedSocket()
		if err != nil {
			return fmt.Errorf("criu dump: %w", err)
		}
		defer sock.Close()
		extra = append(extra, sock)
		args = append(args, "--lazy-pages", "--ps-socket", "3")
		// CRIU holds every lazy page in its page pipes until it ends: two
		// descriptors per pipe of 1 MiB (3.2 MiB with CAP_SYS_RESOURCE;
		// LazyPagesFit).
		raiseOpenFileLimit()
	}
	args = append(args, o.commandLineFlags()...)
	args = append(args, o.dumpOnlyFlags()...)
	runErr := runCommandLine(path, args, extra, []string{hookEnv + "=" + hs.path}, workDir)
	logPath := filepath.Join(workDir, DumpLog)
	// A hook's own error is the cause; CRIU's error lines would only say
	// that its action script failed.
	if err := hs.Err(); err != nil {
		return &Error{Op: "dump", Err: err, Log: logPath}
	}
	if runErr != nil {
		return &Error{Op: "dump", Err: runErr, Log: logPath, Excerpt: ErrorLines(logPath, 6)}
	}
	return nil
}

// dumpOnlyFlags are the options of a dump that its restore does not
// repeat, as criu's command line spells them.
func (o Options) dumpOnlyFlags() []string {
	var flags []string
	if o.LinkRemap {
		flags = append(flags, "--link-remap")
	}
	if o.GhostLimit > 0 {
		flags = append(flags, "--ghost-limit", strconv.FormatInt(min(o.GhostLimit, MaxGhostLimit), 10))
	}
	return flags
}

// closedSocket is one end of a stream socket pair whose other end is
// closed: CRIU's lazy-page server (page_server_serve), given it with
// --ps-socket, reads its end at once and returns without serving.
func closedSocket() (*os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	unix.Close(fds[1])
	return os.NewFile(uintptr(fds[0]), "lazy-pages socket"), nil
}

// raiseOpenFileLimit sets this process's soft limit on open files to its
// hard limit, for CRIU to inherit: CRIU raises its own only where it may
// go past the hard limit (CAP_SYS_RESOURCE). Go raises the soft limit of
// a program by itself but gives its children the limit it started with,
// unless the program sets the limit itself, as here.
func raiseOpenFileLimit() {
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil {
		lim.Cur = lim.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
}

// actionScriptName is the action script a streamed dump writes into its
// work directory.
const actionScriptName = "action.sh"

// actionScript returns the action script for a dump with hooks: a shell
// script in workDir that runs self (RunActionHook) only at the actions
// hooks has a function for, and exits 0 at the others, which CRIU runs as
// well (pre-stream, pre-dump, network-lock, ...): a shell starts in a
// fraction of the time this binary takes. Where workDir cannot hold an
// executable (a file system mounted noexec), or there is no /bin/sh, it is
// self, for every action.
func actionScript(workDir, self string, hooks Hooks) string {
	var actions []string
	if hooks.PreDump != nil {
		actions = append(actions, "pre-dump")
	}
	if hooks.PostDump != nil {
		actions = append(actions, "post-dump")
	}
	var st unix.Statfs_t
	if err := unix.Statfs(workDir, &st); err != nil || st.Flags&unix.ST_NOEXEC != 0 || unix.Access("/bin/sh", unix.X_OK) != nil {
		return self
	}
	text := "#!/bin/sh\n# stasis: CRIU's action script for one dump; stasis answers the actions it hooks.\n"
	if len(actions) > 0 {
		text += fmt.Sprintf("case \"$CRTOOLS_SCRIPT_ACTION\" in\n%s) exec %s ;;\nesac\n", strings.Join(actions, "|"), shellQuote(self))
	}
	// CRIU runs the script from its work directory: the path must not be
	// relative; and the umask must not have taken its execute bit.
	path, err := filepath.Abs(filepath.Join(workDir, actionScriptName))
	if err != nil {
		return self
	}
	if err := os.WriteFile(path, []byte(text), 0o700); err != nil || os.Chmod(path, 0o700) != nil || unix.Access(path, unix.X_OK) != nil {
		return self
	}
	return path
}

// shellQuote quotes s for sh, as one word.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// hookServer answers the action script of a command-line CRIU: one
// connection per action, the action's name on a line, and "ok" or
// "error: ..." on a line back.
type hookServer struct {
	path     string
	listener *net.UnixListener
	hooks    Hooks
	wg       sync.WaitGroup
	mu       sync.Mutex
	err      error
}

func serveHooks(path string, hooks Hooks) (*hookServer, error) {
	l, err := listenUnix(path, "criu hooks")
	if err != nil {
		return nil, err
	}
	s := &hookServer{path: path, listener: l, hooks: hooks}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return // closed
			}
			s.answer(c)
		}
	}()
	return s, nil
}

// answer runs the hook of one action (one at a time: CRIU waits for each).
func (s *hookServer) answer(c net.Conn) {
	defer c.Close()
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return // the script died; CRIU sees it fail
	}
	var hook func() error
	switch strings.TrimSpace(line) {
	case "pre-dump":
		hook = s.hooks.PreDump
	case "post-dump":
		hook = s.hooks.PostDump
	}
	if hook != nil {
		err = hook()
	}
	if err != nil {
		s.mu.Lock()
		if s.err == nil {
			s.err = err
		}
		s.mu.Unlock()
		fmt.Fprintf(c, "error: %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
		return
	}
	io.WriteString(c, "ok\n")
}

// Err is the first error a hook returned.
func (s *hookServer) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *hookServer) Close() {
	s.listener.Close()
	s.wg.Wait()
}

// RunActionHook is what this binary does when a command-line CRIU runs it
// as its action script (no arguments; CRTOOLS_SCRIPT_ACTION and the hook
// socket in the environment): it passes the action to the stasis process
// that started CRIU and exits with 0 if that process's hook succeeded, 1
// otherwise (which makes CRIU abort, or resume the tree after post-dump).
// ok is false when this process was not started as an action script.
func RunActionHook(args []string) (ok bool, code int) {
	socket, action := os.Getenv(hookEnv), os.Getenv("CRTOOLS_SCRIPT_ACTION")
	if socket == "" || action == "" || len(args) > 0 {
		return false, 0
	}
	c, err := net.Dial("unix", socket)
	if err != nil {
		fmt.Fprintf(os.Stderr, "stasis: CRIU's %s action: %v\n", action, err)
		return true, 1
	}
	defer c.Close()
	if _, err := io.WriteString(c, action+"\n"); err != nil {
		fmt.Fprintf(os.Stderr, "stasis: CRIU's %s action: %v\n", action, err)
		return true, 1
	}
	reply, err := io.ReadAll(c)
	if err != nil || strings.TrimSpace(string(reply)) != "ok" {
		msg := strings.TrimSpace(string(reply))
		if msg == "" {
			msg = "stasis went away"
		}
		fmt.Fprintf(os.Stderr, "stasis: CRIU's %s action: %s\n", action, msg)
		return true, 1
	}
	return true, 0
}
