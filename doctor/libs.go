package doctor

import (
	"context"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/stasis-ckpt/stasis/cuda"
)

// libFinder locates shared libraries the way the checks need: Options.LibDirs
// first, then (unless disabled) $LD_LIBRARY_PATH, the ldconfig cache and the
// usual driver directories.
type libFinder struct {
	dirs     []string            // LibDirs and $LD_LIBRARY_PATH, in order
	ldconfig map[string][]string // library name -> paths from `ldconfig -p`
	system   []string            // fixed driver directories
	cuda     []string            // CUDA toolkit directories (for libcufile)
}

// libSearch is the outcome of looking for one library.
type libSearch struct {
	path     string   // as found
	resolved string   // after following symlinks
	skipped  []string // candidates built for another architecture
}

func newLibFinder(ctx context.Context, o Options) *libFinder {
	f := &libFinder{dirs: append([]string(nil), o.LibDirs...)}
	if o.NoDefaultLibDirs {
		return f
	}
	for _, dir := range filepath.SplitList(os.Getenv("LD_LIBRARY_PATH")) {
		if dir != "" {
			f.dirs = append(f.dirs, dir)
		}
	}
	f.ldconfig = ldconfigCache(ctx)
	f.system = []string{"/usr/local/nvidia/lib64"}
	if triple := multiarchTriple(); triple != "" {
		f.system = append(f.system, "/usr/lib/"+triple)
	}
	f.system = append(f.system, "/usr/lib64", "/usr/lib/wsl/lib")
	f.cuda = cuda.ToolkitLibDirs()
	return f
}

// find returns the first candidate for name that exists and is not built for
// another architecture. withCUDA adds the CUDA toolkit directories.
func (f *libFinder) find(name string, withCUDA bool) libSearch {
	var candidates []string
	for _, dir := range f.dirs {
		candidates = append(candidates, filepath.Join(dir, name))
	}
	candidates = append(candidates, f.ldconfig[name]...)
	for _, dir := range f.system {
		candidates = append(candidates, filepath.Join(dir, name))
	}
	if withCUDA {
		for _, dir := range f.cuda {
			candidates = append(candidates, filepath.Join(dir, name))
		}
	}

	var s libSearch
	for _, path := range candidates {
		info, err := os.Stat(path) // follows symlinks
		if err != nil || !info.Mode().IsRegular() {
			continue
		}
		if !builtForThisMachine(path) {
			s.skipped = append(s.skipped, path)
			continue
		}
		s.path = path
		s.resolved = path
		if resolved, err := filepath.EvalSymlinks(path); err == nil {
			s.resolved = resolved
		}
		return s
	}
	return s
}

// describe renders a found library as "path" or "path -> target".
func (s libSearch) describe() string {
	if s.resolved != s.path {
		return s.path + " -> " + s.resolved
	}
	return s.path
}

// builtForThisMachine is false only for an ELF file of another architecture;
// files that are not ELF are left for the caller to report.
func builtForThisMachine(path string) bool {
	want, known := elfMachines[runtime.GOARCH]
	if !known {
		return true
	}
	f, err := elf.Open(path)
	if err != nil {
		return true
	}
	defer f.Close()
	return f.Machine == want
}

var elfMachines = map[string]elf.Machine{
	"amd64":   elf.EM_X86_64,
	"arm64":   elf.EM_AARCH64,
	"386":     elf.EM_386,
	"ppc64le": elf.EM_PPC64,
	"s390x":   elf.EM_S390,
	"riscv64": elf.EM_RISCV,
}

func multiarchTriple() string {
	switch runtime.GOARCH {
	case "amd64":
		return "x86_64-linux-gnu"
	case "arm64":
		return "aarch64-linux-gnu"
	}
	return ""
}

// ldconfigCache parses `ldconfig -p` lines such as
// "libcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1".
func ldconfigCache(ctx context.Context) map[string][]string {
	path, err := exec.LookPath("ldconfig")
	if err != nil {
		for _, p := range []string{"/sbin/ldconfig", "/usr/sbin/ldconfig"} {
			if _, err := os.Stat(p); err == nil {
				path = p
				break
			}
		}
	}
	if path == "" {
		return nil
	}
	out, err := runCommand(ctx, 5*time.Second, path, "-p")
	if err != nil {
		return nil
	}
	cache := map[string][]string{}
	for _, line := range strings.Split(out, "\n") {
		left, target, ok := strings.Cut(line, " => ")
		fields := strings.Fields(left)
		if !ok || len(fields) == 0 {
			continue
		}
		cache[fields[0]] = append(cache[fields[0]], strings.TrimSpace(target))
	}
	return cache
}
