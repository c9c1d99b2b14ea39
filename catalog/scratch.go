package catalog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// RAMScratchBase is where RAM-backed scratch directories go.
const RAMScratchBase = "/dev/shm"

const (
	scratchDir    = "scratch"
	scratchPrefix = "stasis-"
	scratchLock   = ".lock"
)

// Scratch is a temporary directory for work that is not part of a
// checkpoint (CRIU's images before they are packed, a restore's unpacked
// images). Its owner holds an exclusive lock on the .lock file inside it, so
// gc can tell an abandoned scratch directory (its owner was killed) from
// one in use.
type Scratch struct {
	Dir  string
	lock *os.File
}

// NewScratch makes a scratch directory in RAM (/dev/shm) when it is a tmpfs
// with at least ramBytes free, and in the store's scratch/ otherwise.
func (s *Store) NewScratch(purpose string, ramBytes int64) (*Scratch, error) {
	base := s.path(scratchDir)
	if ramBytes >= 0 && ramFree(RAMScratchBase) >= ramBytes {
		base = RAMScratchBase
	}
	if err := os.MkdirAll(base, 0o700); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(base, scratchPrefix+purpose+"-")
	if err != nil {
		return nil, fmt.Errorf("create scratch directory: %w", err)
	}
	lock, err := lockFile(filepath.Join(dir, scratchLock), true)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &Scratch{Dir: dir, lock: lock}, nil
}

// InRAM reports whether the directory is on a tmpfs.
func (sc *Scratch) InRAM() bool { return strings.HasPrefix(sc.Dir, RAMScratchBase+"/") }

// Remove deletes the directory and releases its lock.
func (sc *Scratch) Remove() error {
	err := os.RemoveAll(sc.Dir)
	sc.lock.Close()
	return err
}

// ramFree is the free space of a tmpfs at dir, or -1 when dir is not a
// tmpfs. tmpfs space is memory, so it is also bounded by what the machine
// has available.
func ramFree(dir string) int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		return -1
	}
	free := int64(st.Bavail) * st.Bsize
	if avail := memAvailable(); avail >= 0 {
		free = min(free, avail)
	}
	return free
}

// memAvailable is the kernel's estimate of memory available without
// swapping (MemAvailable in /proc/meminfo), or -1.
func memAvailable() int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			var kb int64
			if _, err := fmt.Sscanf(strings.TrimSpace(rest), "%d kB", &kb); err == nil {
				return kb << 10
			}
		}
	}
	return -1
}

// gcScratch removes abandoned scratch directories under base.
func gcScratch(base string) ([]string, int64, error) {
	entries, err := os.ReadDir(base)
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	var removed []string
	var bytes int64
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), scratchPrefix) {
			continue
		}
		dir := filepath.Join(base, e.Name())
		lockPath := filepath.Join(dir, scratchLock)
		if _, err := os.Stat(lockPath); err != nil {
			continue // not one of ours, or not yet locked
		}
		lock, err := lockFile(lockPath, false)
		if err != nil || lock == nil {
			continue
		}
		bytes += diskUsage(dir)
		err = os.RemoveAll(dir)
		lock.Close()
		if err != nil {
			return removed, bytes, err
		}
		removed = append(removed, dir)
	}
	return removed, bytes, nil
}

// logsDir holds the logs of failed CRIU runs.
const (
	logsDir  = "logs"
	keepLogs = 20
)

// LogPath is where a log named name goes in the store's logs/ (which it
// creates), with the time in front of its name.
func (s *Store) LogPath(name string) string {
	dir := s.path(logsDir)
	os.MkdirAll(dir, 0o700)
	return filepath.Join(dir, time.Now().UTC().Format("20060102T150405.000000000Z")+"-"+filepath.Base(name))
}

// KeepLog copies a log of a failed operation into the store's logs/ as
// name, keeps the newest keepLogs there, and returns the copy's path.
func (s *Store) KeepLog(src, name string) (string, error) {
	data, err := os.ReadFile(src)
	if err != nil {
		return "", err
	}
	dst := s.LogPath(name)
	dir := filepath.Dir(dst)
	if err := os.WriteFile(dst, data, 0o600); err != nil {
		return "", err
	}
	entries, err := os.ReadDir(dir)
	if err == nil && len(entries) > keepLogs {
		for _, e := range entries[:len(entries)-keepLogs] { // names sort by time
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
	return dst, nil
}
