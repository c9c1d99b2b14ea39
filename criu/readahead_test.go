package criu

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestParseLoaderList(t *testing.T) {
	out := "\tlinux-vdso.so.1 (0x00007ffd4a1f2000)\n" +
		"\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f53b0b28000)\n" +
		"\tlibgone.so.1 => not found\n" +
		"\t/lib64/ld-linux-x86-64.so.2 (0x00007f53b1246000)\n" +
		"\tlibspace.so => /opt/with space/libspace.so (0x00007f53b0000000)\n"
	want := []string{"/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2", "/opt/with space/libspace.so"}
	if got := parseLoaderList([]byte(out)); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	if got := parseLoaderList([]byte("\tstatically linked\n")); got == nil || len(got) != 0 {
		t.Fatalf("a static binary's list: %#v, want an empty list", got)
	}
}

func TestLoaderFiles(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh on PATH to list the libraries of")
	}
	sh, _ = filepath.EvalSymlinks(sh)
	files, err := LoaderFiles(sh)
	if errors.Is(err, ErrNotDynamic) {
		t.Skipf("%s is statically linked here", sh)
	}
	if err != nil {
		t.Fatal(err)
	}
	libc := false
	for _, f := range files {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("listed %s: %v", f, err)
		}
		libc = libc || strings.Contains(filepath.Base(f), "libc.so")
	}
	if !libc {
		t.Fatalf("%s's loader files %q hold no libc", sh, files)
	}

	// A script is not run to list them: it has no loader of its own.
	dir := t.TempDir()
	script, ran := filepath.Join(dir, "criu"), filepath.Join(dir, "ran")
	os.WriteFile(script, []byte("#!/bin/sh\ntouch '"+ran+"'\n"), 0o755)
	if files, err := LoaderFiles(script); !errors.Is(err, ErrNotDynamic) {
		t.Fatalf("a script: %q, %v; want ErrNotDynamic", files, err)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Fatal("LoaderFiles ran the script")
	}
}

// resident counts the pages of the file at path that are in the page
// cache.
func resident(t *testing.T, path string) (in, all int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, (len(m)+PageSize-1)/PageSize)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	for _, v := range vec {
		in += int(v & 1)
	}
	return in, len(vec)
}

func TestReadAhead(t *testing.T) {
	// On a disk's file system, where the page cache can let go of a file.
	dir, err := os.MkdirTemp("/var/tmp", "readahead")
	if err != nil {
		t.Skipf("no /var/tmp: %v", err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "lib.so")
	if err := os.WriteFile(path, make([]byte, 4<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	f, _ := os.Open(path)
	f.Sync()
	unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	f.Close()
	if in, _ := resident(t, path); in != 0 {
		t.Skipf("%s keeps %d pages of a file it was told to drop (a file system in memory?)", dir, in)
	}
	ReadAhead([]string{filepath.Join(dir, "missing.so"), path})
	// The reads are queued, not waited for: they come in soon after.
	deadline := time.Now().Add(10 * time.Second)
	for {
		in, all := resident(t, path)
		if in == all {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d pages in the page cache 10 s after ReadAhead", in, all)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestResolveCachedKeepsLoaderFiles(t *testing.T) {
	cache := filepath.Join(t.TempDir(), "cache")
	// A script has no loader files: the cache keeps an empty list, and
	// is used.
	path, runs := countingCRIU(t, "4.1.1")
	for range 2 {
		if _, _, err := ResolveCached(path, cache); err != nil {
			t.Fatal(err)
		}
	}
	id, _ := identify(path)
	if c, ok := readVersionCache(cache, id); !ok || c.Files == nil || len(c.Files) != 0 || runs() != 1 {
		t.Fatalf("cache of a script: %+v, %v, %d runs", c, ok, runs())
	}
	// A cache from before the files were kept gets them, CRIU not asked
	// again.
	writeVersionCache(cache, cachedVersion{binaryIdentity: id, Version: 40101})
	if _, _, err := ResolveCached(path, cache); err != nil || runs() != 1 {
		t.Fatalf("a cache without files: %v, %d runs", err, runs())
	}
	if c, _ := readVersionCache(cache, id); c.Files == nil {
		t.Fatalf("a cache without files was not given them: %+v", c)
	}
	// ConfirmVersion's correction keeps them.
	writeVersionCache(cache, cachedVersion{id, 40101, []string{"/lib/libx.so"}})
	log := filepath.Join(t.TempDir(), "dump.log")
	os.WriteFile(log, []byte("(00.000100) Version: 4.3.2 (gitid 0)\n"), 0o600)
	ConfirmVersion(path, cache, log, 40101)
	if c, _ := readVersionCache(cache, id); c.Version != 40302 || !reflect.DeepEqual(c.Files, []string{"/lib/libx.so"}) {
		t.Fatalf("after ConfirmVersion: %+v", c)
	}

	// The real CRIU lists its libraries.
	real, err := Find()
	if err != nil {
		t.Skipf("no CRIU to list the libraries of: %v", err)
	}
	if _, _, err := ResolveCached(real, cache); err != nil {
		t.Skipf("CRIU at %s: %v", real, err)
	}
	id, _ = identify(real)
	c, _ := readVersionCache(cache, id)
	if _, err := LoaderFiles(real); errors.Is(err, ErrNotDynamic) {
		t.Skipf("%s is not dynamically linked", real)
	}
	libc := false
	for _, f := range c.Files {
		libc = libc || strings.Contains(filepath.Base(f), "libc.so")
	}
	if !libc {
		t.Fatalf("cached loader files of %s: %q, no libc", real, c.Files)
	}
}

// TestResolveCachedReadsAhead: resolving CRIU through the cache starts a
// read-ahead of the binary and its cached loader files, on a miss and on
// a hit; without a cache, none.
func TestResolveCachedReadsAhead(t *testing.T) {
	calls := make(chan []string, 4)
	readAhead = func(files []string) { calls <- files }
	defer func() { readAhead = ReadAhead }()
	next := func(what string) []string {
		t.Helper()
		select {
		case files := <-calls:
			return files
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no read-ahead", what)
			return nil
		}
	}
	cache := filepath.Join(t.TempDir(), "cache")
	path, _ := countingCRIU(t, "4.1.1")
	if _, _, err := ResolveCached(path, cache); err != nil {
		t.Fatal(err)
	}
	if files := next("a miss"); !reflect.DeepEqual(files, []string{path}) {
		t.Fatalf("a miss read ahead %q, want the script alone", files)
	}
	id, _ := identify(path)
	writeVersionCache(cache, cachedVersion{id, 40101, []string{"/lib/libx.so"}})
	if _, _, err := ResolveCached(path, cache); err != nil {
		t.Fatal(err)
	}
	if files := next("a hit"); !reflect.DeepEqual(files, []string{path, "/lib/libx.so"}) {
		t.Fatalf("a hit read ahead %q", files)
	}
	if _, _, err := ResolveCached(path, ""); err != nil {
		t.Fatal(err)
	}
	select {
	case files := <-calls:
		t.Fatalf("no cache, but read ahead %q", files)
	case <-time.After(100 * time.Millisecond):
	}
}
