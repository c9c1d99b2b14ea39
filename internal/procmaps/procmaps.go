// Package procmaps reads the lines of /proc/PID/maps.
package procmaps

import (
	"fmt"
	"strconv"
	"strings"
)

// Mapping is one line of /proc/PID/maps: "start-end perms offset dev
// inode [path]".
type Mapping struct {
	Start, End uint64
	Perms      string // "rw-p": read, write, execute, p(rivate) or s(hared)
	Inode      string // "0" for memory that no file backs
	// Path is the mapped file's path (it may hold spaces), a label in
	// brackets ([heap], [stack], [vdso], [anon:NAME]), or empty.
	Path string
}

// Parse reads one line.
func Parse(line string) (Mapping, error) {
	f := strings.SplitN(line, " ", 6)
	if len(f) < 5 {
		return Mapping{}, fmt.Errorf("maps line %q", line)
	}
	from, to, ok := strings.Cut(f[0], "-")
	start, err1 := strconv.ParseUint(from, 16, 64)
	end, err2 := strconv.ParseUint(to, 16, 64)
	if !ok || err1 != nil || err2 != nil || len(f[1]) != 4 {
		return Mapping{}, fmt.Errorf("maps line %q", line)
	}
	m := Mapping{Start: start, End: end, Perms: f[1], Inode: f[4]}
	if len(f) == 6 {
		m.Path = strings.TrimLeft(f[5], " ")
	}
	return m, nil
}

// Private says whether the mapping is private (copy on write).
func (m Mapping) Private() bool { return m.Perms[3] == 'p' }

// SharedWritable says whether the mapping is shared and writable (rw-s).
func (m Mapping) SharedWritable() bool { return m.Perms[1] == 'w' && m.Perms[3] == 's' }

// Anonymous says whether no file backs the mapping: inode 0 and no path
// (a label in brackets, such as [heap], is not one).
func (m Mapping) Anonymous() bool {
	return m.Inode == "0" && (m.Path == "" || strings.HasPrefix(m.Path, "["))
}
