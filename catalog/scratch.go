package catalog

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// HugeRAMBase is the tmpfs that stasis, run as root, mounts for its RAM
// scratch directories, with transparent huge pages (huge=always): a
// file's memory is then taken 2 MiB at a time, not 4 KiB, and CRIU
// dumps into it about a third faster than into /dev/shm (docs/benchmarks.md).
// It stays mounted, as /dev/shm does, for the next run.
const HugeRAMBase = "/run/stasis/ram"

// SharedRAMBase is where RAM scratch directories go when stasis cannot
// mount HugeRAMBase (not root), or when $STASIS_RAM_SCRATCH says so.
const SharedRAMBase = "/dev/shm"

// RAMScratchEnv, when set, names the tmpfs for RAM scratch directories
// instead of HugeRAMBase.
const RAMScratchEnv = "STASIS_RAM_SCRATCH"

// RAMScratchBase is where RAM-backed scratch directories go: $STASIS_RAM_SCRATCH
// if set, else HugeRAMBase, mounted on first use if it is not yet, else
// SharedRAMBase.
func RAMScratchBase() string { return ramScratchBase() }

var ramScratchBase = sync.OnceValue(func() string {
	dir, huge, mounted := RAMScratchPlan()
	if huge && !mounted {
		if err := mountHugeRAM(dir); err != nil {
			return SharedRAMBase
		}
	}
	return dir
})

// mountHugeRAM makes dir a tmpfs with huge=always, unless it is one
// already; a lock beside it keeps two processes from mounting it twice
// (the second mount would hide the first one's files).
func mountHugeRAM(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	lock, err := lockFile(dir+".lock", true)
	if err != nil {
		return err
	}
	defer lock.Close()
	if isMountPoint(dir) {
		return nil
	}
	size := memTotal()
	if size <= 0 {
		return errors.New("no MemTotal in /proc/meminfo")
	}
	opts := fmt.Sprintf("mode=0700,huge=always,size=%d", size)
	// Not noexec: CRIU runs its action script from a dump's work
	// directory, here (criu's actionScript; on a noexec mount it falls
	// back to stasis's binary, several milliseconds slower to start).
	return unix.Mount("stasis-ram", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts)
}

// RAMScratchPlan says, without mounting anything, where RAM scratch
// directories go: $STASIS_RAM_SCRATCH if set; else, run as root,
// HugeRAMBase (huge), which mounted says is mounted already (else
// RAMScratchBase mounts it on first use, and falls back to SharedRAMBase
// if that fails); else SharedRAMBase.
func RAMScratchPlan() (dir string, huge, mounted bool) {
	if dir := os.Getenv(RAMScratchEnv); dir != "" {
		return dir, false, false
	}
	if os.Geteuid() != 0 {
		return SharedRAMBase, false, false
	}
	return HugeRAMBase, true, isMountPoint(HugeRAMBase)
}

// isMountPoint says whether dir is a tmpfs on a device of its own (a
// mount, not a directory of its parent's file system).
func isMountPoint(dir string) bool {
	var st, parent unix.Stat_t
	var fs unix.Statfs_t
	if unix.Stat(dir, &st) != nil || unix.Stat(filepath.Dir(dir), &parent) != nil || unix.Statfs(dir, &fs) != nil {
		return false
	}
	return fs.Type == unix.TMPFS_MAGIC && st.Dev != parent.Dev
}

const (
	scratchDir    = "scratch"
	scratchPrefix = "stasis-"
	scratchLock   = ".lock"
	// scratchStore, in a scratch directory, names the store it belongs
	// to (Store.identity): the RAM scratch places are shared by every
	// store of the machine, and gc removes only its own store's.
	scratchStore = ".store"
)

// identity names the store among the stores of this machine: the device
// and inode of its root, which no other directory has while it exists,
// and its path, for people.
func (s *Store) identity() (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(s.Root, &st); err != nil {
		return "", err
	}
	return fmt.Sprintf("dev %d ino %d %s", st.Dev, st.Ino, s.Root), nil
}

// Scratch is a temporary directory for work that is not part of a
// checkpoint (CRIU's images before they are packed, a restore's unpacked
// images). Its owner holds an exclusive lock on the .lock file inside it, so
// gc can tell an abandoned scratch directory (its owner was killed) from
// one in use.
type Scratch struct {
	Dir  string
	lock *os.File
}

// NewScratch makes a scratch directory in RAM (RAMScratchBase) when it is
// a tmpfs with at least ramBytes free, and in the store's scratch/
// otherwise.
func (s *Store) NewScratch(purpose string, ramBytes int64) (*Scratch, error) {
	base := s.path(scratchDir)
	if ramBytes >= 0 && ramFree(RAMScratchBase()) >= ramBytes {
		base = RAMScratchBase()
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
	// The store's name last: gc takes a directory for its store's only
	// once it is locked and named.
	id, err := s.identity()
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, scratchStore), []byte(id+"\n"), 0o600)
	}
	if err != nil {
		os.RemoveAll(dir)
		lock.Close()
		return nil, err
	}
	return &Scratch{Dir: dir, lock: lock}, nil
}

// InRAM reports whether the directory is on a tmpfs.
func (sc *Scratch) InRAM() bool { return strings.HasPrefix(sc.Dir, RAMScratchBase()+"/") }

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
	if avail := MemAvailable(); avail >= 0 {
		free = min(free, avail)
	}
	return free
}

// MemAvailable is the kernel's estimate of memory available without
// swapping (MemAvailable in /proc/meminfo), or -1.
func MemAvailable() int64 { return meminfo("MemAvailable") }

// memTotal is the machine's memory (MemTotal), or -1.
func memTotal() int64 { return meminfo("MemTotal") }

// meminfo reads a value of /proc/meminfo in bytes, or -1.
func meminfo(key string) int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, key+":"); ok {
			var kb int64
			if _, err := fmt.Sscanf(strings.TrimSpace(rest), "%d kB", &kb); err == nil {
				return kb << 10
			}
		}
	}
	return -1
}

// ramBases are the places RAM scratch directories may be, for gc: it
// does not mount HugeRAMBase to look into it.
func ramBases() []string {
	bases := []string{SharedRAMBase}
	if dir := os.Getenv(RAMScratchEnv); dir != "" {
		bases = append(bases, dir)
	}
	if isMountPoint(HugeRAMBase) {
		bases = append(bases, HugeRAMBase)
	}
	return bases
}

// gcScratch removes the abandoned scratch directories of this store:
// those in its scratch/, and those in the shared RAM places (ramBases)
// that are this user's and name this store (scratchStore). Other stores'
// scratch directories there are left alone, locked or not.
func (s *Store) gcScratch() ([]string, int64, error) {
	id, err := s.identity()
	if err != nil {
		return nil, 0, err
	}
	removed, bytes, err := s.gcScratchIn(s.path(scratchDir), id, true)
	if err != nil {
		return removed, bytes, err
	}
	for _, base := range ramBases() {
		r, n, err := s.gcScratchIn(base, id, false)
		removed, bytes = append(removed, r...), bytes+n
		if err != nil {
			return removed, bytes, err
		}
	}
	return removed, bytes, nil
}

// gcScratchIn removes abandoned scratch directories under base that
// belong to the store named id; in the store's own scratch/ (own), all
// of them. base is opened as an os.Root (the store's scratch/ without
// following a link at its name), so nothing is removed outside it.
func (s *Store) gcScratchIn(base, id string, own bool) ([]string, int64, error) {
	var root *os.Root
	var err error
	if own {
		root, err = s.openStructure(scratchDir)
	} else {
		root, err = os.OpenRoot(base)
	}
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	defer root.Close()
	entries, err := fs.ReadDir(root.FS(), ".")
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
		if info, err := e.Info(); err != nil || !ownedByMe(info) {
			continue
		}
		if !own {
			named, err := root.ReadFile(e.Name() + "/" + scratchStore)
			if err != nil || strings.TrimSuffix(string(named), "\n") != id {
				continue // another store's, or not yet named
			}
		}
		if _, err := root.Lstat(e.Name() + "/" + scratchLock); err != nil {
			continue // not one of ours, or not yet locked
		}
		lock, err := lockFile(filepath.Join(dir, scratchLock), false)
		if err != nil || lock == nil {
			continue
		}
		bytes += diskUsage(dir)
		err = root.RemoveAll(e.Name())
		lock.Close()
		if err != nil {
			return removed, bytes, err
		}
		removed = append(removed, dir)
	}
	return removed, bytes, nil
}

// ownedByMe says whether info is of a file this user owns.
func ownedByMe(info fs.FileInfo) bool {
	st, ok := info.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == os.Geteuid()
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
	// Written through logs/ opened as an os.Root: nothing outside it.
	logs, err := s.openStructure(logsDir)
	if err != nil {
		return "", err
	}
	err = logs.WriteFile(filepath.Base(dst), data, 0o600)
	logs.Close()
	if err != nil {
		return "", err
	}
	// Removed through logs/ opened as an os.Root: no link followed.
	entries, err := readStructureDir(s, logsDir)
	if err == nil && len(entries) > keepLogs {
		for _, e := range entries[:len(entries)-keepLogs] { // names sort by time
			s.removeIn(logsDir, e.Name())
		}
	}
	return dst, nil
}
