package criu

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// CRIU is started anew for every dump and restore, and after a while
// without one, or on a fresh node, its executable and shared libraries
// (some 10 MB) are not in the page cache: they come in from the disk page
// fault by page fault as CRIU runs. stasis's own I/O fills the disk's
// queue at the same time (the early copy's writes, a restore's reads), and
// every one of those faults waits behind it: CRIU reached post-dump up to
// 200 ms later so (docs/benchmarks.md). ReadAhead asks for all of those
// files at once, before stasis's own I/O starts.

// ErrNotDynamic is LoaderFiles's error for a file that is not an ELF
// executable started by glibc's dynamic loader: a script, a static binary,
// one for another loader (musl's runs the program instead of listing).
var ErrNotDynamic = errors.New("not an ELF executable of glibc's dynamic loader")

// LoaderFiles lists the files the dynamic loader maps to start the
// executable at path: the shared libraries it needs, as the loader finds
// them, and the loader itself. It asks glibc's loader
// (LD_TRACE_LOADED_OBJECTS, as ldd does), which lists them and exits
// without running the program; any other file (ErrNotDynamic) is not run
// at all.
func LoaderFiles(path string) ([]string, error) {
	if interp, err := interpreter(path); err != nil || !strings.HasPrefix(filepath.Base(interp), "ld-linux") {
		return nil, fmt.Errorf("%s: %w", path, ErrNotDynamic)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path)
	cmd.Env = append(os.Environ(), "LD_TRACE_LOADED_OBJECTS=1")
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s under LD_TRACE_LOADED_OBJECTS: %w", path, err)
	}
	return parseLoaderList(out), nil
}

// interpreter is the program interpreter (PT_INTERP) the ELF file at path
// names: its dynamic loader.
func interpreter(path string) (string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			raw, err := io.ReadAll(p.Open())
			return strings.TrimRight(string(raw), "\x00"), err
		}
	}
	return "", errors.New("no program interpreter")
}

// parseLoaderList reads the loader's list, lines such as
//
//	libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x7f...)
//	/lib64/ld-linux-x86-64.so.2 (0x7f...)
//	linux-vdso.so.1 (0x7ffd...)
//
// and returns the paths: the vDSO is no file.
func parseLoaderList(out []byte) []string {
	files := []string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if _, found, ok := strings.Cut(line, "=> "); ok {
			line = found
		}
		if path, _, _ := strings.Cut(line, " ("); strings.HasPrefix(path, "/") {
			files = append(files, path)
		}
	}
	return files
}

// readAhead is ReadAhead; a test records the calls instead.
var readAhead = ReadAhead

// ReadAhead asks the kernel to read the files into the page cache
// (posix_fadvise WILLNEED) and returns once the reads are queued, before
// they are done. A file that cannot be opened is left out: this only
// makes what follows faster.
func ReadAhead(files []string) {
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			continue
		}
		unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_WILLNEED)
		f.Close()
	}
}
