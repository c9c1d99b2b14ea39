// Package atomicfile replaces a file whole: readers see its old content or
// its new, never a part.
package atomicfile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Write writes data to path through a new file beside it (mode 0600) and
// a rename over path. On error the new file is removed and path is as it
// was. It does not fsync: what it writes is state a crash may lose.
func Write(path string, data []byte) error {
	return WriteFrom(path, false, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// WriteFrom has write fill a new file in path's directory (mode 0600),
// fsyncs it (and the directory) when durable, and puts it in place of
// path. On error path is as it was and no new file is left.
//
// Where the file system offers O_TMPFILE (ext4, xfs, btrfs, tmpfs) the new
// file has no name until it is complete: it is linked in by linkat, as
// path when nothing is there, else as .NAME.partial-* renamed over path
// at once, so a process killed while writing (kill -9) leaves nothing
// behind. Elsewhere (NFS, FUSE, overlay on old kernels) it is written as
// .NAME.partial-* from the start, which a kill leaves.
func WriteFrom(path string, durable bool, write func(io.Writer) error) error {
	dir := filepath.Dir(path)
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EISDIR) || errors.Is(err, unix.EINVAL) {
		return writeNamed(path, durable, write)
	}
	if err != nil {
		return &os.PathError{Op: "create a file in", Path: dir, Err: err}
	}
	tmp := os.NewFile(uintptr(fd), path)
	defer tmp.Close()
	err = write(tmp)
	if err == nil && durable {
		err = tmp.Sync()
	}
	if err == nil {
		err = linkIn(tmp, path)
	}
	if err == nil && durable {
		err = SyncDir(dir)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	return err
}

// linkIn gives the unnamed file f the name path: directly when path does
// not exist, else through a temporary name and a rename over path.
func linkIn(f *os.File, path string) error {
	err := link(f, path)
	if !errors.Is(err, unix.EEXIST) {
		return err
	}
	for i := 0; ; i++ {
		tmp := filepath.Join(filepath.Dir(path), fmt.Sprintf(".%s.partial-%d-%d", filepath.Base(path), os.Getpid(), i))
		err := link(f, tmp)
		if errors.Is(err, unix.EEXIST) && i < 100 {
			continue
		}
		if err != nil {
			return err
		}
		if err := os.Rename(tmp, path); err != nil {
			os.Remove(tmp)
			return err
		}
		return nil
	}
}

// link names the open file f path (linkat through /proc/self/fd, which
// needs no privilege; AT_EMPTY_PATH where /proc is not mounted).
func link(f *os.File, path string) error {
	proc := fmt.Sprintf("/proc/self/fd/%d", f.Fd())
	err := unix.Linkat(unix.AT_FDCWD, proc, unix.AT_FDCWD, path, unix.AT_SYMLINK_FOLLOW)
	if errors.Is(err, unix.ENOENT) {
		if _, serr := os.Stat(proc); serr != nil {
			err = unix.Linkat(int(f.Fd()), "", unix.AT_FDCWD, path, unix.AT_EMPTY_PATH)
		}
	}
	if err != nil {
		return &os.LinkError{Op: "link", Old: "(new file)", New: path, Err: err}
	}
	return nil
}

// writeNamed is WriteFrom where O_TMPFILE is not offered: the new file is
// .NAME.partial-* beside path from the start.
func writeNamed(path string, durable bool, write func(io.Writer) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".partial-*")
	if err != nil {
		return err
	}
	err = write(tmp)
	if err == nil && durable {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	if err == nil && durable {
		err = SyncDir(filepath.Dir(path))
	}
	return err
}

// SyncDir makes a directory's entries (new files, renames) durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}
