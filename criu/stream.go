package criu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"
)

// ServeSocket is the socket `criu restore --stream` connects to in its
// images directory to ask for image files.
const ServeSocket = "streamer-serve.sock"

// ImageSender writes the whole of one image file to w, the pipe CRIU reads
// it from.
type ImageSender func(w io.Writer) error

// ImageServer answers the requests of `criu restore --stream` for image
// files (CRIU's image streamer protocol): CRIU connects to ServeSocket in
// the images directory and, for each file it opens, sends the file's name
// (a length-prefixed img_streamer_request_entry), reads whether it exists
// (img_streamer_reply_entry) and, when it does, passes the write end of a
// pipe (SCM_RIGHTS) that it then reads the file from. Each file is written
// by a goroutine of its own, so CRIU may read several at once; a file may
// be asked for more than once, and several CRIU runs may connect one after
// the other (a restore retried in a new PID namespace).
//
// A sender's error (corrupted data, say) closes that pipe early: CRIU
// reads a short image, fails, and undoes its restore. Err reports it.
type ImageServer struct {
	listener *net.UnixListener
	lookup   func(name string) (ImageSender, bool)
	wg       sync.WaitGroup
	mu       sync.Mutex
	errs     []error
	served   map[string]int64
	blocked  time.Duration
}

// listenUnix listens on a unix socket at path, removed again when the
// listener is closed; an error is prefixed with what.
func listenUnix(path, what string) (*net.UnixListener, error) {
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	l.SetUnlinkOnClose(true)
	return l, nil
}

// ServeImages listens on ServeSocket in imagesDir and answers every CRIU
// that connects until Close. lookup says whether an image exists and how
// to send it; it is called from one goroutine per connection.
func ServeImages(imagesDir string, lookup func(name string) (ImageSender, bool)) (*ImageServer, error) {
	l, err := listenUnix(filepath.Join(imagesDir, ServeSocket), "image server")
	if err != nil {
		return nil, err
	}
	s := &ImageServer{listener: l, lookup: lookup, served: map[string]int64{}}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

func (s *ImageServer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.listener.AcceptUnix()
		if err != nil {
			return // closed
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer c.Close()
			if err := s.converse(c); err != nil {
				s.fail(err)
			}
		}()
	}
}

func (s *ImageServer) fail(err error) {
	s.mu.Lock()
	s.errs = append(s.errs, err)
	s.mu.Unlock()
}

// converse answers one CRIU's requests until it hangs up.
func (s *ImageServer) converse(c *net.UnixConn) error {
	for {
		name, err := readRequest(c)
		if errors.Is(err, io.EOF) {
			return nil // CRIU has opened everything it needs
		}
		if err != nil {
			return fmt.Errorf("image server: %w", err)
		}
		send, ok := s.lookup(name)
		if err := writeReply(c, ok); err != nil {
			return fmt.Errorf("image server: reply for %s: %w", name, err)
		}
		if !ok {
			continue
		}
		pipe, err := receivePipe(c)
		if err != nil {
			return fmt.Errorf("image server: pipe for %s: %w", name, err)
		}
		// A larger pipe means fewer switches between CRIU and the
		// sender; the default (64 KiB) holds 16 pages. Best effort.
		unix.FcntlInt(pipe.Fd(), unix.F_SETPIPE_SZ, pipeSize)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer pipe.Close()
			cw := &countingWriter{w: pipe}
			err := send(cw)
			s.mu.Lock()
			s.served[name] += cw.n
			s.blocked += cw.blocked
			s.mu.Unlock()
			if err != nil {
				s.fail(fmt.Errorf("image %s: %w", name, err))
			}
		}()
	}
}

// pipeSize is what the image pipes are enlarged to.
const pipeSize = 1 << 20

// countingWriter counts the bytes written to a pipe and the time spent
// writing them, most of it waiting for CRIU to read.
type countingWriter struct {
	w       io.Writer
	n       int64
	blocked time.Duration
}

func (c *countingWriter) Write(b []byte) (int, error) {
	start := time.Now()
	n, err := c.w.Write(b)
	c.blocked += time.Since(start)
	c.n += int64(n)
	return n, err
}

// Close stops accepting connections, waits for every file being sent (a
// sender whose reader is gone fails at once with EPIPE) and removes the
// socket.
func (s *ImageServer) Close() {
	s.listener.Close()
	s.wg.Wait()
}

// Err is the first error a sender or a conversation with CRIU met, or nil.
// Errors of senders whose reader had gone (EPIPE: CRIU failed first) come
// after the others.
func (s *ImageServer) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var broken error
	for _, err := range s.errs {
		if errors.Is(err, unix.EPIPE) {
			if broken == nil {
				broken = err
			}
			continue
		}
		return err
	}
	return broken
}

// Served reports how many bytes of each image were sent (summed over
// requests).
func (s *ImageServer) Served() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int64, len(s.served))
	for k, v := range s.served {
		out[k] = v
	}
	return out
}

// WriteTime is the time the senders spent writing into CRIU's pipes,
// summed over them: when it is most of the restore, CRIU, not the store,
// set the pace.
func (s *ImageServer) WriteTime() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.blocked
}

// maxRequest bounds a request: a file name.
const maxRequest = 4096

// readRequest reads one img_streamer_request_entry, framed as CRIU frames
// every protobuf message: a 32-bit little-endian length, then the message.
func readRequest(r io.Reader) (string, error) {
	var size [4]byte
	if _, err := io.ReadFull(r, size[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return "", fmt.Errorf("truncated request")
		}
		return "", err
	}
	n := binary.LittleEndian.Uint32(size[:])
	if n > maxRequest {
		return "", fmt.Errorf("request of %d bytes", n)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(r, msg); err != nil {
		return "", fmt.Errorf("truncated request: %w", err)
	}
	name, found := "", false
	for len(msg) > 0 {
		num, typ, tn := protowire.ConsumeTag(msg)
		if tn < 0 {
			return "", fmt.Errorf("bad request: %w", protowire.ParseError(tn))
		}
		msg = msg[tn:]
		if num == 1 && typ == protowire.BytesType {
			v, vn := protowire.ConsumeBytes(msg)
			if vn < 0 {
				return "", fmt.Errorf("bad request: %w", protowire.ParseError(vn))
			}
			name, found, msg = string(v), true, msg[vn:]
			continue
		}
		vn := protowire.ConsumeFieldValue(num, typ, msg)
		if vn < 0 {
			return "", fmt.Errorf("bad request: %w", protowire.ParseError(vn))
		}
		msg = msg[vn:]
	}
	if !found {
		return "", fmt.Errorf("request without a file name")
	}
	return name, nil
}

// writeReply sends an img_streamer_reply_entry saying whether the file
// exists.
func writeReply(w io.Writer, exists bool) error {
	msg := protowire.AppendTag(nil, 1, protowire.VarintType)
	msg = protowire.AppendVarint(msg, protowire.EncodeBool(exists))
	out := binary.LittleEndian.AppendUint32(nil, uint32(len(msg)))
	_, err := w.Write(append(out, msg...))
	return err
}

// receivePipe receives the pipe CRIU passes with one byte of data.
func receivePipe(c *net.UnixConn) (*os.File, error) {
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return nil, err
	}
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil || len(fds) == 0 {
			continue
		}
		for _, extra := range fds[1:] {
			unix.Close(extra)
		}
		unix.CloseOnExec(fds[0])
		return os.NewFile(uintptr(fds[0]), "criu-image-pipe"), nil
	}
	return nil, errors.New("no file descriptor in the message")
}

// restoreStreamed runs `criu restore --stream`, detached, the root a
// sibling of CRIU (so a child of this process, as with swrk), and returns
// the root's PID from CRIU's pid file. An ImageServer must be listening in
// imagesDir.
func restoreStreamed(o Options, imagesDir, workDir string) (int, error) {
	path, err := o.binary()
	if err != nil {
		return 0, err
	}
	if o.NamespacesOf != 0 {
		return 0, errors.New("criu restore: a streamed restore cannot run inside another process's namespaces")
	}
	pidFile := filepath.Join(workDir, "restore.pid")
	args := []string{"restore", "--stream", "--images-dir", imagesDir, "--work-dir", workDir,
		"--log-file", RestoreLog, fmt.Sprintf("-v%d", o.logLevel("restore")),
		"--restore-detached", "--restore-sibling", "--pidfile", pidFile}
	args = append(args, o.commandLineFlags()...)
	var extra []*os.File
	for i, in := range o.InheritFDs {
		extra = append(extra, in.File)
		args = append(args, "--inherit-fd", fmt.Sprintf("fd[%d]:%s", 3+i, in.Key))
	}
	logPath := filepath.Join(workDir, RestoreLog)
	if err := runCommandLine(path, args, extra, nil, workDir); err != nil {
		return 0, &Error{Op: "restore", Err: err, Log: logPath, Excerpt: ErrorLines(logPath, 6)}
	}
	data, err := os.ReadFile(pidFile)
	if err != nil {
		return 0, &Error{Op: "restore", Err: fmt.Errorf("CRIU reported success but wrote no pid file: %w", err), Log: logPath}
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, &Error{Op: "restore", Err: fmt.Errorf("CRIU reported success but its pid file holds %q", data), Log: logPath}
	}
	return pid, nil
}

// commandLineFlags are the options both dump and restore repeat, as
// criu's command line spells them.
func (o Options) commandLineFlags() []string {
	var flags []string
	for _, flag := range []struct {
		on   bool
		name string
	}{{o.ShellJob, "--shell-job"}, {o.TCPEstablished, "--tcp-established"}, {o.ExtUnixSockets, "--ext-unix-sk"}, {o.FileLocks, "--file-locks"}} {
		if flag.on {
			flags = append(flags, flag.name)
		}
	}
	return flags
}

// runCommandLine runs criu with args, extra files as fds 3 and on, and env
// added to this process's environment, and waits for it.
func runCommandLine(path string, args []string, extra []*os.File, env []string, workDir string) error {
	cmd := exec.Command(path, args...)
	cmd.ExtraFiles = extra
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	// In a process group of its own, as Launch puts swrk: a Ctrl-C sent
	// to stasis's group must not kill CRIU halfway.
	cmd.SysProcAttr = &unix.SysProcAttr{Setpgid: true}
	// Its own output goes to a file, not a pipe: a pipe would keep
	// Run waiting for as long as any process holds it.
	out, err := os.Create(filepath.Join(workDir, "criu.out"))
	if err != nil {
		return err
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		if msg, _ := os.ReadFile(out.Name()); len(strings.TrimSpace(string(msg))) > 0 {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(msg)))
		}
		return err
	}
	return nil
}
