package checkpoint

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Unix sockets connected outside the tree. CRIU dumps both ends of a
// connection whose ends the tree holds. For a socket of the tree whose
// peer is outside it (its "external" peer), CRIU 4.1 (criu/sk-unix.c)
// dumps the tree's end only with ext_unix_sk, and only when the peer is a
// datagram socket bound to a name: the restore creates the socket again
// and connects it to that name. A stream or seqpacket peer outside, or a
// nameless one, CRIU refuses whatever the options ("Can't dump half of
// stream unix connection").
//
// So ext_unix_sk is safe, and the preflight sets it, when every socket of
// the tree with a peer outside is connected to a named datagram socket
// (the system log at /dev/log, journald's socket): datagrams are whole,
// so nothing the tree sent is half-way, and the restored tree reconnects
// by the name; a restore where nothing is bound to that name fails
// (CRIU's connect), and the job is not started. Where a peer outside is a
// stream socket (a connection to a server outside the tree), the
// preflight refuses and names both processes: checkpoint the tree that
// holds both ends. Sockets whose peer no process holds (in flight in a
// message) are left to CRIU, and so are trees in another network
// namespace than stasis's, whose sockets sock_diag here does not see.

// unixSocket is what sock_diag says of a unix socket.
type unixSocket struct {
	ino, peer uint32
	typ       uint8 // SOCK_STREAM, SOCK_DGRAM, SOCK_SEQPACKET
	name      string
}

// Netlink's sock_diag for unix sockets (linux/unix_diag.h).
const (
	udiagShowName = 0x1
	udiagShowPeer = 0x4
	unixDiagName  = 0
	unixDiagPeer  = 2
)

// unixSockets lists the unix sockets of this network namespace, by inode.
func unixSockets() (map[uint32]unixSocket, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return nil, fmt.Errorf("sock_diag: %w", err)
	}
	defer unix.Close(fd)
	// nlmsghdr, then unix_diag_req: family, protocol, pad, states,
	// ino, show, cookie[2].
	req := make([]byte, 16+24)
	ne := binary.NativeEndian
	ne.PutUint32(req[0:], uint32(len(req)))
	ne.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	ne.PutUint32(req[8:], 1)
	req[16] = unix.AF_UNIX
	ne.PutUint32(req[20:], 0xffffffff) // every state
	ne.PutUint32(req[28:], udiagShowName|udiagShowPeer)
	ne.PutUint32(req[32:], 0xffffffff)
	ne.PutUint32(req[36:], 0xffffffff)
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("sock_diag: %w", err)
	}
	socks := map[uint32]unixSocket{}
	buf := make([]byte, 1<<16)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return nil, fmt.Errorf("sock_diag: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return nil, fmt.Errorf("sock_diag: %w", err)
		}
		for _, m := range msgs {
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return socks, nil
			case unix.NLMSG_ERROR:
				return nil, fmt.Errorf("sock_diag: the kernel answered with an error")
			}
			if s, ok := parseUnixDiag(m.Data); ok {
				socks[s.ino] = s
			}
		}
	}
}

// parseUnixDiag reads a unix_diag_msg (family, type, state, pad, ino,
// cookie[2]) and its attributes.
func parseUnixDiag(b []byte) (unixSocket, bool) {
	if len(b) < 16 {
		return unixSocket{}, false
	}
	ne := binary.NativeEndian
	s := unixSocket{typ: b[1], ino: ne.Uint32(b[4:])}
	for a := b[16:]; len(a) >= 4; {
		l := int(ne.Uint16(a[0:]))
		if l < 4 || l > len(a) {
			break
		}
		payload := a[4:l]
		switch ne.Uint16(a[2:]) {
		case unixDiagName:
			s.name = string(payload)
			if strings.HasPrefix(s.name, "\x00") {
				s.name = "@" + strings.TrimRight(s.name[1:], "\x00")
			} else {
				s.name = strings.TrimRight(s.name, "\x00")
			}
		case unixDiagPeer:
			if len(payload) >= 4 {
				s.peer = ne.Uint32(payload)
			}
		}
		a = a[min((l+3)&^3, len(a)):]
	}
	return s, true
}

// socketInodes returns the inodes of the sockets pid holds, each with the
// descriptor that holds it.
func socketInodes(pid int) map[uint32]string {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "fd")
	fds, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	out := map[uint32]string{}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join(dir, fd.Name()))
		if err != nil {
			continue
		}
		if rest, ok := strings.CutPrefix(link, "socket:["); ok {
			if ino, err := strconv.ParseUint(strings.TrimSuffix(rest, "]"), 10, 32); err == nil {
				out[uint32(ino)] = fd.Name()
			}
		}
	}
	return out
}

// socketHolder finds a process outside the tree that holds the socket
// ino: its PID and name; 0 when none does.
func socketHolder(ino uint32, tree map[int]bool) (int, string) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || tree[pid] {
			continue
		}
		if _, ok := socketInodes(pid)[ino]; ok {
			st, _ := Status(pid)
			return pid, st["Name"]
		}
	}
	return 0, ""
}

// sockType names a socket type.
func sockType(t uint8) string {
	switch t {
	case unix.SOCK_STREAM:
		return "stream"
	case unix.SOCK_DGRAM:
		return "datagram"
	case unix.SOCK_SEQPACKET:
		return "seqpacket"
	}
	return fmt.Sprintf("type %d", t)
}

// checkUnixSockets sets ext_unix_sk where the tree's sockets connected
// outside it are all connected to named datagram sockets, and refuses a
// tree holding one end of a connection whose other end is held outside.
func checkUnixSockets(p *preflight) error {
	if len(p.tree) == 0 {
		return nil
	}
	self, err1 := os.Readlink("/proc/self/ns/net")
	theirs, err2 := os.Readlink(filepath.Join("/proc", strconv.Itoa(p.tree[0].PID), "ns", "net"))
	if err1 != nil || err2 != nil || self != theirs {
		return nil
	}
	inTree := map[int]bool{}
	held := map[uint32]int{} // socket inode -> a PID of the tree holding it
	for _, proc := range p.tree {
		inTree[proc.PID] = true
		for ino := range socketInodes(proc.PID) {
			held[ino] = proc.PID
		}
	}
	if len(held) == 0 {
		return nil
	}
	socks, err := unixSockets()
	if err != nil {
		return nil // no sock_diag here: CRIU decides
	}
	var why string
	for ino, pid := range held {
		s, ok := socks[ino]
		if !ok || s.peer == 0 {
			continue
		}
		if _, inside := held[s.peer]; inside {
			continue
		}
		peer, known := socks[s.peer]
		if known && peer.typ == unix.SOCK_DGRAM && peer.name != "" {
			if why == "" {
				why = fmt.Sprintf("%s has a datagram socket connected to %s, outside the tree", p.name(pid), peer.name)
			}
			continue
		}
		outside, comm := socketHolder(s.peer, inTree)
		if outside == 0 {
			continue // held by no process (in flight): CRIU decides
		}
		kind := sockType(s.typ)
		if known {
			kind = sockType(peer.typ)
		}
		return fmt.Errorf("%w: %s holds a unix %s socket (socket:[%d]) whose other end PID %d (%s) holds, outside the tree; CRIU cannot dump one end of such a connection: checkpoint a tree that holds both ends, or close the connection first",
			ErrRefused, p.name(pid), kind, ino, outside, comm)
	}
	if why != "" && !p.opts.ExtUnixSockets {
		p.opts.ExtUnixSockets = true
		p.choose("ext_unix_sk", "", why)
	}
	return nil
}
