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
}

// Mount is a mount the tree uses: the one under its working directory,
// root, open files or mapped files, as /proc/PID/mountinfo shows it.
type Mount struct {
	MountPoint string `json:"mount_point"`
	FSType     string `json:"fs_type"`
	Source     string `json:"source"`
}

// usedFiles reads /proc for what the tree's processes use: the regular
// files they run or map (sorted, each once), and the mounts that hold
// those files, their working directories and roots, and their open files.
// Processes that ended meanwhile are skipped.
func usedFiles(tree []Process) ([]string, []Mount) {
	files := map[string]bool{}
	mounts := map[string]Mount{}
	for _, p := range tree {
		dir := filepath.Join("/proc", strconv.Itoa(p.PID))
		mapped := mappedPaths(p.PID)
		if exe, err := os.Readlink(filepath.Join(dir, "exe")); err == nil && usablePath(exe) {
			mapped = append(mapped, exe)
		}
		used := slices.Clone(mapped)
		for _, link := range []string{"cwd", "root"} {
			if target, err := os.Readlink(filepath.Join(dir, link)); err == nil && usablePath(target) {
				used = append(used, target)
			}
		}
		if fds, err := os.ReadDir(filepath.Join(dir, "fd")); err == nil {
			for _, fd := range fds {
				if target, err := os.Readlink(filepath.Join(dir, "fd", fd.Name())); err == nil && usablePath(target) {
					used = append(used, target)
				}
			}
		}
		for _, path := range mapped {
			if st, err := os.Stat(path); err == nil && st.Mode().IsRegular() {
				files[path] = true
			}
		}
		table := readMountinfo(filepath.Join(dir, "mountinfo"))
		for _, path := range used {
			if m, ok := mountOf(table, path); ok {
				mounts[m.MountPoint] = m
			}
		}
	}
	paths := make([]string, 0, len(files))
	for path := range files {
		paths = append(paths, path)
	}
	slices.Sort(paths)
	out := make([]Mount, 0, len(mounts))
	for _, m := range mounts {
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Mount) int { return strings.Compare(a.MountPoint, b.MountPoint) })
	return paths, out
}

// usablePath keeps paths of files that exist: absolute, not deleted, not
// a memfd.
func usablePath(p string) bool {
	return strings.HasPrefix(p, "/") && !strings.HasSuffix(p, " (deleted)") && !strings.HasPrefix(p, "/memfd:")
}

// mappedPaths lists the files mapped into pid, from /proc/PID/maps.
func mappedPaths(pid int) []string {
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "maps"))
	if err != nil {
		return nil
	}
	defer f.Close()
	var paths []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// address perms offset dev inode path (the path may hold spaces)
		fields := strings.SplitN(sc.Text(), " ", 6)
		if len(fields) < 6 || fields[4] == "0" {
			continue
		}
		if path := strings.TrimLeft(fields[5], " "); usablePath(path) {
			paths = append(paths, path)
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
	tmp, err := os.CreateTemp(h.dir, ".new-*")
	if err != nil {
		return
	}
	_, err = tmp.WriteString(sum)
	if cerr := tmp.Close(); err == nil && cerr == nil {
		err = os.Rename(tmp.Name(), filepath.Join(h.dir, key))
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
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
