package checkpoint

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/stasis-ckpt/stasis/internal/atomicfile"
	"github.com/stasis-ckpt/stasis/internal/procmaps"
	"golang.org/x/sys/unix"
)

// MappedFile is a file the process tree runs or has mapped (its
// executables, shared libraries, and any other file it maps). CRIU maps
// these files again on restore, by path: a restore needs the same bytes
// there.
type MappedFile struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
	// SHA256 is the file's hash in hex; empty when stasis could not read
	// the file (then a restore compares the size only).
	SHA256 string `json:"sha256,omitempty"`
	// SharedWritable is set when a process maps the file shared and
	// writable (a NumPy memmap, SQLite's -shm): the job itself changes
	// it as it runs, so a restore only warns when it differs.
	SharedWritable bool `json:"shared_writable,omitempty"`
}

// MarkSharedWritable sets SharedWritable on the files named in shared.
func MarkSharedWritable(files []MappedFile, shared map[string]bool) {
	for i := range files {
		files[i].SharedWritable = shared[files[i].Path]
	}
}

// PseudoFS says whether fsType is a kernel's view of itself (proc, sysfs,
// devtmpfs, devpts, cgroups, ...) rather than a file system that holds a
// job's files. A restore does not compare such mounts: the same paths are
// there on any Linux machine, and a container's /dev is a tmpfs where a
// host's is devtmpfs. tmpfs is a real mount (/dev/shm holds files).
func PseudoFS(fsType string) bool {
	switch fsType {
	case "proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "mqueue", "debugfs", "tracefs",
		"securityfs", "pstore", "bpf", "configfs", "fusectl", "binfmt_misc", "nsfs", "efivarfs", "autofs", "rpc_pipefs":
		return true
	}
	return false
}

// Mount is a mount the tree uses: the one under its working directory,
// root, open files or mapped files, as /proc/PID/mountinfo shows it.
type Mount struct {
	MountPoint string `json:"mount_point"`
	FSType     string `json:"fs_type"`
	Source     string `json:"source"`
}

// usedFiles reads /proc for what the tree's processes use: the regular
// files they run or map (sorted, each once), those of them mapped shared
// and writable, and the mounts that hold those files, their working
// directories and roots, and their open files. Only regular files and
// directories count for mounts (not devices such as /dev/null, pipes,
// sockets or anonymous inodes), and pseudo file systems (PseudoFS) are
// left out. Processes that ended meanwhile are skipped.
func usedFiles(tree []Process) (paths []string, shared map[string]bool, mounts []Mount) {
	files := map[string]bool{}
	shared = map[string]bool{}
	byPoint := map[string]Mount{}
	for _, p := range tree {
		dir := filepath.Join("/proc", strconv.Itoa(p.PID))
		// used maps a path to what to stat for its type (the fd's link
		// for an open file: the file it has open, wherever it is now).
		used := map[string]string{}
		var mapped []string
		for _, m := range mappedPaths(p.PID) {
			mapped = append(mapped, m.path)
			used[m.path] = m.path
			if m.sharedWritable {
				shared[m.path] = true
			}
		}
		for _, link := range []string{"exe", "cwd", "root"} {
			if target, err := os.Readlink(filepath.Join(dir, link)); err == nil && usablePath(target) {
				used[target] = filepath.Join(dir, link)
				if link == "exe" {
					mapped = append(mapped, target)
				}
			}
		}
		if fds, err := os.ReadDir(filepath.Join(dir, "fd")); err == nil {
			for _, fd := range fds {
				link := filepath.Join(dir, "fd", fd.Name())
				if target, err := os.Readlink(link); err == nil && usablePath(target) {
					used[target] = link
				}
			}
		}
		for _, path := range mapped {
			if st, err := os.Stat(path); err == nil && st.Mode().IsRegular() {
				files[path] = true
			}
		}
		table := readMountinfo(filepath.Join(dir, "mountinfo"))
		for path, statPath := range used {
			if st, err := os.Stat(statPath); err != nil || !st.Mode().IsRegular() && !st.IsDir() {
				continue
			}
			if m, ok := mountOf(table, path); ok && !PseudoFS(m.FSType) {
				byPoint[m.MountPoint] = m
			}
		}
	}
	paths = make([]string, 0, len(files))
	for path := range files {
		paths = append(paths, path)
	}
	slices.Sort(paths)
	for path := range shared {
		if !files[path] {
			delete(shared, path)
		}
	}
	mounts = make([]Mount, 0, len(byPoint))
	for _, m := range byPoint {
		mounts = append(mounts, m)
	}
	slices.SortFunc(mounts, func(a, b Mount) int { return strings.Compare(a.MountPoint, b.MountPoint) })
	return paths, shared, mounts
}

// usablePath keeps paths of files that exist: absolute, not deleted, not
// a memfd.
func usablePath(p string) bool {
	return strings.HasPrefix(p, "/") && !strings.HasSuffix(p, " (deleted)") && !strings.HasPrefix(p, "/memfd:")
}

type mapping struct {
	path           string
	sharedWritable bool // perms rw-s
}

// mappedPaths lists the files mapped into pid, from /proc/PID/maps.
func mappedPaths(pid int) []mapping {
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "maps"))
	if err != nil {
		return nil
	}
	defer f.Close()
	var paths []mapping
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m, err := procmaps.Parse(sc.Text())
		if err != nil || m.Inode == "0" {
			continue
		}
		if usablePath(m.Path) {
			paths = append(paths, mapping{path: m.Path, sharedWritable: m.SharedWritable()})
		}
	}
	return paths
}

// readMountinfo parses a mountinfo file into its mounts, in its order
// (a later mount on the same point is on top).
func readMountinfo(path string) []Mount {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var table []Mount
	for _, line := range strings.Split(string(data), "\n") {
		// id parent major:minor root mount-point options [optional...] - fstype source super-options
		before, after, ok := strings.Cut(line, " - ")
		fields, tail := strings.Fields(before), strings.Fields(after)
		if !ok || len(fields) < 5 || len(tail) < 2 {
			continue
		}
		table = append(table, Mount{MountPoint: unescapeMountinfo(fields[4]), FSType: tail[0], Source: unescapeMountinfo(tail[1])})
	}
	return table
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// mountOf finds the mount that holds path: the longest mount point that
// is path or a parent of it, the later one of equals.
func mountOf(table []Mount, path string) (Mount, bool) {
	var best Mount
	found := false
	for _, m := range table {
		under := path == m.MountPoint || m.MountPoint == "/" || strings.HasPrefix(path, m.MountPoint+"/")
		if under && (!found || len(m.MountPoint) >= len(best.MountPoint)) {
			best, found = m, true
		}
	}
	return best, found
}

// MountsHere lists the mounts stasis itself sees (/proc/self/mountinfo).
func MountsHere() []Mount { return readMountinfo("/proc/self/mountinfo") }

// MountAt returns the mount on top at exactly mountPoint.
func MountAt(table []Mount, mountPoint string) (Mount, bool) {
	var top Mount
	found := false
	for _, m := range table {
		if m.MountPoint == mountPoint {
			top, found = m, true
		}
	}
	return top, found
}

// Hasher computes files' SHA-256 and remembers each under a directory,
// keyed by the file's path, device, inode, size, modification and change
// times: a library is read once per version, and every later checkpoint
// or restore pays a stat and a small read for it.
type Hasher struct {
	dir string
}

// NewHasher keeps its hashes in dir (created mode 0700 when needed).
func NewHasher(dir string) *Hasher { return &Hasher{dir: dir} }

// File describes one file: its size and hash. A file that does not exist,
// or is not a regular file, wraps fs.ErrNotExist.
func (h *Hasher) File(path string) (MappedFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return MappedFile{}, err
	}
	defer f.Close()
	var before unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &before); err != nil {
		return MappedFile{}, err
	}
	if before.Mode&unix.S_IFMT != unix.S_IFREG {
		return MappedFile{}, fmt.Errorf("%s: not a regular file: %w", path, fs.ErrNotExist)
	}
	out := MappedFile{Path: path, Size: before.Size}
	key := cacheKey(path, &before)
	if sum, ok := h.cached(key); ok {
		out.SHA256 = sum
		return out, nil
	}
	sum := sha256.New()
	if _, err := io.CopyBuffer(sum, f, make([]byte, 1<<20)); err != nil {
		return MappedFile{}, fmt.Errorf("hash %s: %w", path, err)
	}
	out.SHA256 = hex.EncodeToString(sum.Sum(nil))
	var after unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &after); err == nil && cacheKey(path, &after) == key {
		h.remember(key, out.SHA256) // not when the file changed while being read
	}
	return out, nil
}

func cacheKey(path string, st *unix.Stat_t) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d\x00%d\x00%d\x00%d.%d\x00%d.%d", path, st.Dev, st.Ino, st.Size,
		st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec))
	return hex.EncodeToString(sum[:])
}

func (h *Hasher) cached(key string) (string, bool) {
	if h.dir == "" {
		return "", false
	}
	data, err := os.ReadFile(filepath.Join(h.dir, key))
	if err != nil || len(data) != 2*sha256.Size {
		return "", false
	}
	if _, err := hex.DecodeString(string(data)); err != nil {
		return "", false
	}
	return string(data), true
}

// remember stores a hash; a cache that cannot be written only costs time.
func (h *Hasher) remember(key, sum string) {
	if h.dir == "" || os.MkdirAll(h.dir, 0o700) != nil {
		return
	}
	atomicfile.Write(filepath.Join(h.dir, key), []byte(sum))
}

// Describe describes files with several workers, in the order given. A
// file that is gone is left out; one that cannot be read is described by
// its size alone.
func (h *Hasher) Describe(paths []string) []MappedFile {
	out := make([]MappedFile, len(paths))
	found := make([]bool, len(paths))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), 8, max(len(paths), 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				d, err := h.File(paths[i])
				switch {
				case err == nil:
					out[i], found[i] = d, true
				case !errors.Is(err, fs.ErrNotExist):
					if st, serr := os.Stat(paths[i]); serr == nil && st.Mode().IsRegular() {
						out[i], found[i] = MappedFile{Path: paths[i], Size: st.Size()}, true
					}
				}
			}
		}()
	}
	for i := range paths {
		next <- i
	}
	close(next)
	wg.Wait()
	var kept []MappedFile
	for i, d := range out {
		if found[i] {
			kept = append(kept, d)
		}
	}
	return kept
}
