package gdswriter

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// directFile is a data file opened with O_DIRECT where possible. If the file
// system refuses O_DIRECT at open or at the first I/O (EINVAL), the flag is
// dropped and plain I/O is used from then on; Direct reports which.
type directFile struct {
	f *os.File

	mu     sync.RWMutex
	direct bool

	allocMu   sync.Mutex
	allocated int64 // bytes of the file with blocks allocated ahead (reserve)
	noAlloc   bool  // the file system refused to allocate ahead
	tried     bool  // reserve called fallocate at least once
}

// openDirect opens path with flag (os.O_RDONLY, or os.O_WRONLY|os.O_CREATE|
// os.O_EXCL) and O_DIRECT unless noDirect is set or the file system refuses.
func openDirect(path string, flag int, noDirect bool) (*directFile, error) {
	if !noDirect {
		f, err := os.OpenFile(path, flag|unix.O_DIRECT, 0o600)
		if err == nil {
			return &directFile{f: f, direct: true}, nil
		}
		if !errors.Is(err, unix.EINVAL) {
			return nil, err
		}
	}
	f, err := os.OpenFile(path, flag, 0o600)
	if err != nil {
		return nil, err
	}
	return &directFile{f: f}, nil
}

// Direct reports whether I/O on the file bypasses the page cache.
func (d *directFile) Direct() bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.direct
}

// dropDirect clears O_DIRECT on the open file after the file system refused
// a direct transfer.
func (d *directFile) dropDirect() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.direct {
		return nil
	}
	fd := int(d.f.Fd())
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return err
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, flags&^unix.O_DIRECT); err != nil {
		return err
	}
	d.direct = false
	return nil
}

// writeAt writes all of p at off. p and off must be aligned when the file is
// direct.
func (d *directFile) writeAt(p []byte, off int64) error {
	_, err := d.f.WriteAt(p, off)
	if err != nil && errors.Is(err, unix.EINVAL) && d.Direct() {
		if derr := d.dropDirect(); derr != nil {
			return fmt.Errorf("%w (and could not turn off O_DIRECT: %v)", err, derr)
		}
		_, err = d.f.WriteAt(p, off)
	}
	return err
}

// readAt fills p from off.
func (d *directFile) readAt(p []byte, off int64) error {
	_, err := d.f.ReadAt(p, off)
	if err != nil && errors.Is(err, unix.EINVAL) && d.Direct() {
		if derr := d.dropDirect(); derr != nil {
			return fmt.Errorf("%w (and could not turn off O_DIRECT: %v)", err, derr)
		}
		_, err = d.f.ReadAt(p, off)
	}
	return err
}

// How far ahead of the data a direct file's blocks are allocated: as far
// as is allocated already, from minAllocAhead up to maxAllocAhead.
const (
	minAllocAhead = 16 << 20
	maxAllocAhead = 256 << 20
)

// reserve makes sure the blocks of a direct file up to end are allocated
// (fallocate), ahead of the writes. Direct writes into allocated blocks
// below the file's size are overwrites, which ext4 and XFS run in
// parallel; direct writes past the end extend the file, and are
// serialized. Where the file system cannot allocate ahead (or the disk has
// no room for a whole step), the writes go on as extending ones.
func (d *directFile) reserve(end int64) {
	if !d.Direct() {
		return
	}
	d.allocMu.Lock()
	defer d.allocMu.Unlock()
	if d.noAlloc || end <= d.allocated {
		return
	}
	next := max(end, d.allocated+min(max(d.allocated, minAllocAhead), maxAllocAhead))
	d.tried = true
	if err := unix.Fallocate(int(d.f.Fd()), 0, d.allocated, next-d.allocated); err != nil {
		d.noAlloc = true
		return
	}
	d.allocated = next
}

// trim cuts what reserve allocated beyond size, the data's end, including
// what a failed fallocate allocated before it ran out of room (ext4 keeps
// that, and the file's size grows with it).
func (d *directFile) trim(size int64) error {
	d.allocMu.Lock()
	defer d.allocMu.Unlock()
	if !d.tried {
		return nil
	}
	st, err := d.f.Stat()
	if err != nil {
		return err
	}
	if st.Size() > size {
		if err := d.f.Truncate(size); err != nil {
			return err
		}
	}
	d.allocated = size
	return nil
}

func (d *directFile) sync() error  { return d.f.Sync() }
func (d *directFile) close() error { return d.f.Close() }
