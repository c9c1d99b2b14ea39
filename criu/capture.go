package criu

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// CaptureSocket is the socket `criu dump --stream` connects to in its
// images directory to hand over the image files it writes.
const CaptureSocket = "streamer-capture.sock"

// ImageReceiver reads the whole of one image file, name, from r (the pipe
// CRIU writes it into) to its end. An error closes the pipe early: CRIU's
// next write to it fails and the dump fails with it.
type ImageReceiver func(name string, r io.Reader) error

// ImageCapture takes the image files of `criu dump --stream` (CRIU's image
// streamer protocol, capture side): CRIU connects to CaptureSocket in the
// images directory and, for each file it creates, sends the file's name (a
// length-prefixed img_streamer_request_entry) and passes the read end of a
// pipe (SCM_RIGHTS) that it then writes the file into. CRIU splices its
// memory pages into that pipe without copying them, so the one copy of the
// process's memory is the receiver's read. Each file is read by a goroutine
// of its own: CRIU writes several files at once (a memory image and its
// pagemap, for one).
type ImageCapture struct {
	listener *net.UnixListener
	receive  ImageReceiver

	talks sync.WaitGroup // the accept loop and one conversation per CRIU
	files sync.WaitGroup // one receiver per image file

	mu     sync.Mutex
	conns  []*net.UnixConn
	busy   int // conversations handling a request
	errs   []error
	closed bool
}

// CaptureImages listens on CaptureSocket in imagesDir and hands every
// image file of the CRIU that connects to receive, each from a goroutine
// of its own, until Close.
func CaptureImages(imagesDir string, receive ImageReceiver) (*ImageCapture, error) {
	l, err := listenUnix(filepath.Join(imagesDir, CaptureSocket), "image capture")
	if err != nil {
		return nil, err
	}
	c := &ImageCapture{listener: l, receive: receive}
	c.talks.Add(1)
	go c.accept()
	return c, nil
}

func (c *ImageCapture) accept() {
	defer c.talks.Done()
	for {
		conn, err := c.listener.AcceptUnix()
		if err != nil {
			return // closed
		}
		c.mu.Lock()
		c.conns = append(c.conns, conn)
		c.mu.Unlock()
		c.talks.Add(1)
		go func() {
			defer c.talks.Done()
			if err := c.converse(conn); err != nil {
				c.fail(err)
			}
		}()
	}
}

func (c *ImageCapture) fail(err error) {
	c.mu.Lock()
	c.errs = append(c.errs, err)
	c.mu.Unlock()
}

// converse takes one CRIU's files until it hangs up. A request is counted
// as busy from the moment its first byte can be read until its receiver
// runs, so that Drain never misses one CRIU has sent.
func (c *ImageCapture) converse(conn *net.UnixConn) error {
	raw, err := conn.SyscallConn()
	if err != nil {
		return fmt.Errorf("image capture: %w", err)
	}
	for {
		if err := waitReadable(raw); err != nil {
			return fmt.Errorf("image capture: %w", err)
		}
		c.mu.Lock()
		c.busy++
		c.mu.Unlock()
		err := c.takeFile(conn)
		c.mu.Lock()
		c.busy--
		c.mu.Unlock()
		if errors.Is(err, io.EOF) {
			return nil // CRIU has created every file
		}
		if err != nil {
			return err
		}
	}
}

// takeFile reads one request and its pipe and starts the file's receiver.
func (c *ImageCapture) takeFile(conn *net.UnixConn) error {
	name, err := readRequest(conn)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return err
		}
		return fmt.Errorf("image capture: %w", err)
	}
	pipe, err := receivePipe(conn)
	if err != nil {
		return fmt.Errorf("image capture: pipe for %s: %w", name, err)
	}
	enlargePipe(pipe)
	c.files.Add(1)
	go func() {
		defer c.files.Done()
		defer pipe.Close()
		if err := c.receive(name, pipe); err != nil {
			c.fail(fmt.Errorf("image %s: %w", name, err))
		}
	}()
	return nil
}

// waitReadable returns once the connection has a byte to read, or has
// reached its end.
func waitReadable(raw interface {
	Read(func(fd uintptr) bool) error
}) error {
	var peek [1]byte
	var recvErr error
	err := raw.Read(func(fd uintptr) bool {
		_, _, recvErr = unix.Recvfrom(int(fd), peek[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		return recvErr != unix.EAGAIN
	})
	if err != nil {
		return err
	}
	if recvErr != nil {
		return recvErr
	}
	return nil
}

// Drain stops taking new connections and waits until every image file
// CRIU has created so far is read to its end (at CRIU's post-dump point,
// that is all of them); it returns the first error met, as Err does. The
// socket is gone from the images directory when it returns.
func (c *ImageCapture) Drain() error {
	c.mu.Lock()
	c.stopListening()
	c.mu.Unlock()
	for c.pending() {
		time.Sleep(time.Millisecond)
	}
	c.files.Wait()
	return c.Err()
}

// stopListening closes the listener (and removes the socket) once; c.mu
// is held.
func (c *ImageCapture) stopListening() {
	if !c.closed {
		c.closed = true
		c.listener.Close()
	}
}

// pending reports whether a request is being handled or waits, unread, in
// a connection.
func (c *ImageCapture) pending() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.busy > 0 {
		return true
	}
	for _, conn := range c.conns {
		raw, err := conn.SyscallConn()
		if err != nil {
			continue
		}
		queued := 0
		raw.Control(func(fd uintptr) {
			queued, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ)
		})
		if queued > 0 {
			return true
		}
	}
	return false
}

// Close stops taking connections and files and waits for the receivers of
// the files taken (a receiver whose writer is gone reads to the pipe's end
// at once).
func (c *ImageCapture) Close() {
	c.mu.Lock()
	c.stopListening()
	for _, conn := range c.conns {
		conn.CloseRead()
	}
	c.mu.Unlock()
	c.talks.Wait()
	c.files.Wait()
	c.mu.Lock()
	for _, conn := range c.conns {
		conn.Close()
	}
	c.conns = nil
	c.mu.Unlock()
}

// Err is the first error a receiver or a conversation with CRIU met, or
// nil.
func (c *ImageCapture) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.errs) > 0 {
		return c.errs[0]
	}
	return nil
}

// enlargePipe makes an image pipe hold more than the default 64 KiB (16
// pages), so that CRIU and the other side switch less often: 16 MiB where
// the kernel allows it (beyond /proc/sys/fs/pipe-max-size it takes
// CAP_SYS_RESOURCE), else 1 MiB, the usual maximum. Best effort.
func enlargePipe(pipe *os.File) {
	for _, size := range []int{16 << 20, 1 << 20} {
		if _, err := unix.FcntlInt(pipe.Fd(), unix.F_SETPIPE_SZ, size); err == nil {
			return
		}
	}
}
