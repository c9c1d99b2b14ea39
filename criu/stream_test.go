package criu

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"
)

// criuSide plays CRIU's part of the image streamer protocol over a real
// unix socket, as img-streamer.c does it: request, reply, pipe.
type criuSide struct {
	t *testing.T
	c *net.UnixConn
}

func dialServer(t *testing.T, dir string) *criuSide {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: filepath.Join(dir, ServeSocket), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	return &criuSide{t: t, c: c}
}

func frame(msg []byte) []byte {
	return append(binary.LittleEndian.AppendUint32(nil, uint32(len(msg))), msg...)
}

func request(name string) []byte {
	msg := protowire.AppendTag(nil, 1, protowire.BytesType)
	return frame(protowire.AppendString(msg, name))
}

// open asks for name and returns its bytes, or ok false when the server
// says it does not exist.
func (s *criuSide) open(name string) (data []byte, ok bool) {
	s.t.Helper()
	if _, err := s.c.Write(request(name)); err != nil {
		s.t.Fatal(err)
	}
	var size [4]byte
	if _, err := io.ReadFull(s.c, size[:]); err != nil {
		s.t.Fatal(err)
	}
	reply := make([]byte, binary.LittleEndian.Uint32(size[:]))
	if _, err := io.ReadFull(s.c, reply); err != nil {
		s.t.Fatal(err)
	}
	if !bytes.Equal(reply, []byte{0x08, 0x01}) {
		if !bytes.Equal(reply, []byte{0x08, 0x00}) {
			s.t.Fatalf("reply %x", reply)
		}
		return nil, false
	}
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		s.t.Fatal(err)
	}
	r := os.NewFile(uintptr(fds[0]), "r")
	defer r.Close()
	if _, _, err := s.c.WriteMsgUnix([]byte{0}, unix.UnixRights(fds[1]), nil); err != nil {
		s.t.Fatal(err)
	}
	unix.Close(fds[1])
	data, err := io.ReadAll(r)
	if err != nil {
		s.t.Fatal(err)
	}
	return data, true
}

func TestImageServer(t *testing.T) {
	dir := t.TempDir()
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<18) // 4 MiB: more than a pipe holds
	s, err := ServeImages(dir, func(name string) (ImageSender, bool) {
		switch name {
		case "pages-1.img":
			return func(w io.Writer) error { _, err := w.Write(big); return err }, true
		case "core-1.img":
			return func(w io.Writer) error { _, err := io.WriteString(w, "core"); return err }, true
		case "pages-2.img":
			return func(w io.Writer) error {
				io.WriteString(w, "half")
				return errors.New("chunk 3 is bad")
			}, true
		}
		return nil, false
	})
	if err != nil {
		t.Fatal(err)
	}
	c := dialServer(t, dir)
	if data, ok := c.open("core-1.img"); !ok || string(data) != "core" {
		t.Fatalf("core-1.img: %q %v", data, ok)
	}
	if data, ok := c.open("pages-1.img"); !ok || !bytes.Equal(data, big) {
		t.Fatalf("pages-1.img: %d bytes, %v", len(data), ok)
	}
	if _, ok := c.open("tmpfs-dev-1.tar.gz.img"); ok {
		t.Fatal("a missing image was said to exist")
	}
	// Asked again, an image is sent again.
	if data, ok := c.open("core-1.img"); !ok || string(data) != "core" {
		t.Fatalf("core-1.img again: %q %v", data, ok)
	}
	// A failing sender: the reader gets what was sent, then EOF.
	if data, ok := c.open("pages-2.img"); !ok || string(data) != "half" {
		t.Fatalf("pages-2.img: %q %v", data, ok)
	}
	c.c.Close()
	// A second CRIU (a restore retried) is answered too.
	c2 := dialServer(t, dir)
	if data, ok := c2.open("core-1.img"); !ok || string(data) != "core" {
		t.Fatalf("second connection: %q %v", data, ok)
	}
	c2.c.Close()
	s.Close()
	if err := s.Err(); err == nil || !strings.Contains(err.Error(), "image pages-2.img: chunk 3 is bad") {
		t.Fatalf("Err = %v", err)
	}
	if got := s.Served(); got["pages-1.img"] != int64(len(big)) || got["core-1.img"] != 12 { // asked for three times
		t.Fatalf("Served = %v", got)
	}
	if _, err := os.Stat(filepath.Join(dir, ServeSocket)); !os.IsNotExist(err) {
		t.Fatalf("socket left behind: %v", err)
	}
}

// TestImageServerBadRequests sends what CRIU never would: each ends that
// conversation with an error and leaves the server answering others.
func TestImageServerBadRequests(t *testing.T) {
	for _, c := range []struct {
		name, want string
		raw        []byte
	}{
		{"oversized", "request of 5000 bytes", binary.LittleEndian.AppendUint32(nil, 5000)},
		{"truncated length", "truncated request", []byte{1, 0}},
		{"truncated body", "truncated request", frame([]byte{0x0a, 0x05, 'a'})[:5]},
		{"no name", "request without a file name", frame(protowire.AppendVarint(protowire.AppendTag(nil, 2, protowire.VarintType), 7))},
		{"garbage", "bad request", frame([]byte{0xff, 0xff, 0xff})},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			s, err := ServeImages(dir, func(string) (ImageSender, bool) {
				return func(w io.Writer) error { _, err := io.WriteString(w, "x"); return err }, true
			})
			if err != nil {
				t.Fatal(err)
			}
			bad := dialServer(t, dir)
			bad.c.Write(c.raw)
			bad.c.CloseWrite()
			io.ReadAll(bad.c) // the server hangs up
			bad.c.Close()
			good := dialServer(t, dir)
			if data, ok := good.open("x"); !ok || string(data) != "x" {
				t.Fatalf("after a bad request: %q %v", data, ok)
			}
			good.c.Close()
			s.Close()
			if err := s.Err(); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Err = %v, want %q", err, c.want)
			}
		})
	}
}

// TestImageServerReaderGone: CRIU failing (its end of a pipe closed) makes
// the sender fail with EPIPE at once, reported after other errors.
func TestImageServerReaderGone(t *testing.T) {
	dir := t.TempDir()
	sent := make(chan error, 1)
	s, err := ServeImages(dir, func(string) (ImageSender, bool) {
		return func(w io.Writer) error {
			var err error
			for err == nil {
				_, err = w.Write(make([]byte, 1<<20))
			}
			sent <- err
			return err
		}, true
	})
	if err != nil {
		t.Fatal(err)
	}
	c := dialServer(t, dir)
	c.c.Write(request("pages-1.img"))
	var reply [6]byte
	io.ReadFull(c.c, reply[:])
	var fds [2]int
	unix.Pipe2(fds[:], unix.O_CLOEXEC)
	c.c.WriteMsgUnix([]byte{0}, unix.UnixRights(fds[1]), nil)
	unix.Close(fds[1])
	unix.Close(fds[0]) // CRIU is gone
	if err := <-sent; !errors.Is(err, unix.EPIPE) {
		t.Fatalf("sender's error: %v", err)
	}
	c.c.Close()
	s.Close()
	if err := s.Err(); !errors.Is(err, unix.EPIPE) {
		t.Fatalf("Err = %v", err)
	}
}
