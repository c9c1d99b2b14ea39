package criu

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/stasis-ckpt/stasis/internal/atomicfile"
)

// versionCacheFile is the file, in the cache directory a caller names,
// that keeps CRIU's answer to --version.
const versionCacheFile = "version.json"

// binaryIdentity tells one criu file from another: the file the path names
// (through symbolic links) as stat sees it. Replacing or rebuilding the
// binary changes its inode or its times.
type binaryIdentity struct {
	Path    string `json:"path"`
	Dev     uint64 `json:"dev"`
	Inode   uint64 `json:"inode"`
	Size    int64  `json:"size"`
	MtimeNS int64  `json:"mtime_ns"`
	CtimeNS int64  `json:"ctime_ns"`
}

type cachedVersion struct {
	binaryIdentity
	Version int `json:"version"`
	// Files are what the loader maps to start the binary (LoaderFiles),
	// for ReadAhead; an empty list when it has none, nil when not known
	// yet (a cache from before they were kept).
	Files []string `json:"files"`
}

func identify(path string) (binaryIdentity, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return binaryIdentity{}, err
	}
	var st syscall.Stat_t
	if err := syscall.Stat(abs, &st); err != nil {
		return binaryIdentity{}, err
	}
	return binaryIdentity{
		Path: abs, Dev: st.Dev, Inode: st.Ino, Size: st.Size,
		MtimeNS: st.Mtim.Nano(), CtimeNS: st.Ctim.Nano(),
	}, nil
}

// ResolveCached is Resolve, with CRIU's answer to --version (a start of
// CRIU: tens of milliseconds from a cold page cache, on the way of every
// checkpoint) kept in cacheDir for as long as the binary is the same file,
// unchanged. cacheDir "" means no cache. A binary that is a wrapper
// (a script running another criu) is known by the wrapper alone: callers
// check the version CRIU logs and correct the cache (ConfirmVersion).
//
// With a cache, it also starts reading ahead (ReadAhead, on a goroutine
// of its own: opening the files may wait for the disk) the binary and the
// files its loader maps, listed in the cache: the CRIU that the caller is
// about to start then finds them in the page cache.
func ResolveCached(path, cacheDir string) (string, int, error) {
	if path == "" {
		var err error
		if path, err = Find(); err != nil {
			return "", 0, err
		}
	}
	var id binaryIdentity
	cached := false
	if cacheDir != "" {
		var err error
		id, err = identify(path)
		cached = err == nil
		// A version too old to use is asked again: the refusal names it.
		if c, ok := readVersionCache(cacheDir, id); cached && ok && c.Version >= MinVersion {
			if c.Files == nil {
				c.Files = loaderFilesOrNone(path)
				writeVersionCache(cacheDir, c)
			}
			go readAhead(append([]string{path}, c.Files...))
			return path, c.Version, nil
		}
	}
	v, err := Version(path)
	if err != nil {
		return "", 0, err
	}
	if err := CheckVersion(path, v); err != nil {
		return "", 0, err
	}
	if cached {
		files := loaderFilesOrNone(path)
		go readAhead(append([]string{path}, files...))
		writeVersionCache(cacheDir, cachedVersion{id, v, files})
	}
	return path, v, nil
}

// loaderFilesOrNone is LoaderFiles, with an empty list where it has none
// (kept: the binary is not run for it again).
func loaderFilesOrNone(path string) []string {
	files, err := LoaderFiles(path)
	if err != nil {
		return []string{}
	}
	return files
}

// ConfirmVersion reads the version the criu at path wrote into its log
// (LogVersion) and returns it; where it is not the version the caller
// went by (assumed, from ResolveCached), it corrects cacheDir's cache. It
// returns assumed when the log has no version.
func ConfirmVersion(path, cacheDir, logPath string, assumed int) int {
	logged, err := LogVersion(logPath)
	if err != nil || logged == assumed {
		return assumed
	}
	if id, err := identify(path); err == nil && cacheDir != "" {
		c, _ := readVersionCache(cacheDir, id) // its files, if any, stay
		writeVersionCache(cacheDir, cachedVersion{id, logged, c.Files})
	}
	return logged
}

// readVersionCache returns the cache entry of the binary id, if the cache
// has one.
func readVersionCache(dir string, id binaryIdentity) (cachedVersion, bool) {
	raw, err := os.ReadFile(filepath.Join(dir, versionCacheFile))
	if err != nil {
		return cachedVersion{}, false
	}
	var c cachedVersion
	if json.Unmarshal(raw, &c) != nil || c.binaryIdentity != id || c.Version <= 0 {
		return cachedVersion{}, false
	}
	return c, true
}

// writeVersionCache replaces the cache file whole (a new file renamed over
// it); a cache that cannot be written is no error: the next run asks CRIU.
func writeVersionCache(dir string, c cachedVersion) {
	raw, err := json.Marshal(c)
	if err != nil || os.MkdirAll(dir, 0o700) != nil {
		return
	}
	atomicfile.Write(filepath.Join(dir, versionCacheFile), raw)
}

// CheckVersion is the error for a CRIU at path older than MinVersion.
func CheckVersion(path string, v int) error {
	if v < MinVersion {
		return fmt.Errorf("%w: %s is CRIU %s; kernels from 6.13 on need CRIU >= 4.1 (run `make` to build 4.1.1 into bin/, or set STASIS_CRIU)", ErrTooOld, path, FormatVersion(v))
	}
	return nil
}

// errNoLogVersion is LogVersion's error for a log without CRIU's version.
var errNoLogVersion = errors.New("no \"Version:\" line at the start of CRIU's log")

// LogVersion is the version CRIU wrote at the start of its log (at log
// level 3 and up: "Version: 4.1.1 (gitid ...)" among the first lines).
func LogVersion(logPath string) (int, error) {
	f, err := os.Open(logPath)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for i := 0; i < 10 && sc.Scan(); i++ {
		_, rest, ok := strings.Cut(sc.Text(), "Version:")
		if !ok {
			continue
		}
		if v, ok := parseVersion(rest); ok {
			return v, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%s: %w", logPath, errNoLogVersion)
}

// parseVersion reads "4.1.1 ..." or "4.1" as major*10000+minor*100+sub.
func parseVersion(s string) (int, bool) {
	var major, minor, sub int
	n, _ := fmt.Sscanf(strings.TrimSpace(s), "%d.%d.%d", &major, &minor, &sub)
	if n < 2 {
		return 0, false
	}
	return major*10000 + minor*100 + sub, true
}
