package criu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

func TestErrorLines(t *testing.T) {
	got := ErrorLines("testdata/dump.log", 6)
	want := []string{
		"unix: Can't dump half of stream unix connection.",
		"Dump files (pid: 1234) failed with -1",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ErrorLines = %q, want %q", got, want)
	}
	if got := ErrorLines("testdata/dump.log", 1); len(got) != 1 {
		t.Fatalf("max 1: %q", got)
	}
	if got := ErrorLines("testdata/missing.log", 6); got != nil {
		t.Fatalf("missing log: %q", got)
	}
	e := &Error{Op: "dump", Err: errors.New("operation failed"), Excerpt: want, Log: "/x/dump.log"}
	if msg := e.Error(); msg != "criu dump failed; criu says: unix: Can't dump half of stream unix connection. | Dump files (pid: 1234) failed with -1 (log: /x/dump.log)" {
		t.Fatalf("Error() = %q", msg)
	}
}

// fakeCRIU writes a shell script that prints a version line.
func fakeCRIU(t *testing.T, version string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "criu")
	if err := os.WriteFile(p, []byte("#!/bin/sh\necho 'Version: "+version+"'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestVersionAndResolve(t *testing.T) {
	v, err := Version(fakeCRIU(t, "4.1.1"))
	if err != nil || v != 40101 || FormatVersion(v) != "4.1.1" {
		t.Fatalf("Version = %d, %v", v, err)
	}
	if _, _, err := Resolve(fakeCRIU(t, "3.17.1")); !errors.Is(err, ErrTooOld) {
		t.Fatalf("3.17.1: %v", err)
	}
	if _, _, err := Resolve(fakeCRIU(t, "4.0")); err != nil {
		t.Fatalf("4.0: %v", err)
	}
	if _, err := Version(fakeCRIU(t, "garbage")); !errors.Is(err, ErrNotInstalled) {
		t.Fatalf("garbage: %v", err)
	}
	t.Setenv("STASIS_CRIU", filepath.Join(t.TempDir(), "nothing"))
	if _, err := Find(); !errors.Is(err, ErrNotInstalled) {
		t.Fatalf("Find with a bad STASIS_CRIU: %v", err)
	}
}

// TestHasFeature asks the real CRIU (skipped without one) about a feature
// every CRIU knows, and about one that does not exist.
func TestHasFeature(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("criu check needs root")
	}
	if p, err := filepath.Abs("../bin/criu"); err == nil {
		if _, err := os.Stat(p); err == nil {
			t.Setenv("STASIS_CRIU", p)
		}
	}
	path, _, err := Resolve("")
	if err != nil {
		t.Skipf("no usable CRIU (run make): %v", err)
	}
	ok, err := HasFeature(context.Background(), path, "no_such_feature")
	if err != nil || ok {
		t.Fatalf("no_such_feature: %v, %v", ok, err)
	}
	// Whether the kernel has it varies; the answer must come without error.
	if _, err := HasFeature(context.Background(), path, "mem_dirty_track"); err != nil {
		t.Fatalf("mem_dirty_track: %v", err)
	}
}

// TestEnteredNamespaces: the launcher's check that it runs in the
// namespaces named in its environment.
func TestEnteredNamespaces(t *testing.T) {
	spec, err := namespaces(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if err := entered(spec); err != nil {
		t.Fatalf("this process is not in its own namespaces: %v", err)
	}
	for _, bad := range []string{spec + "1", "1:2", "1:2:3"} {
		if err := entered(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestPIDTaken(t *testing.T) {
	taken := &Error{Op: "restore", Excerpt: []string{"Can't fork for 16516: File exists", "Restoring FAILED."}}
	if line, ok := PIDTaken(fmt.Errorf("resume: %w", taken)); !ok || line != "Can't fork for 16516: File exists" {
		t.Errorf("PIDTaken = %q, %v", line, ok)
	}
	for _, err := range []error{
		&Error{Op: "restore", Excerpt: []string{"Can't fork for 16516: Operation not permitted"}},
		&Error{Op: "dump", Excerpt: []string{"Can't fork for 16516: File exists"}},
		errors.New("Can't fork for 16516: File exists"),
	} {
		if _, ok := PIDTaken(err); ok {
			t.Errorf("PIDTaken(%v) = true", err)
		}
	}
}

// TestResolvedPathRunsAsIs: with Version set, a dump runs Path without
// asking it for its version again; without, it asks.
func TestResolvedPathRunsAsIs(t *testing.T) {
	dir := t.TempDir()
	asked := filepath.Join(dir, "asked")
	fake := filepath.Join(dir, "criu")
	script := "#!/bin/sh\nif [ \"$1\" = --version ]; then echo x >>" + asked + "; echo 'Version: 4.1.1'; exit 0; fi\nexit 7\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, version := range []int{40101, 0} {
		os.Remove(asked)
		images, work, err := MakeDirs(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		err = Dump(Options{Path: fake, Version: version, Stream: true}, os.Getpid(), images, work, Hooks{})
		if err == nil {
			t.Fatalf("Version %d: a dump by a criu that exits 7 succeeded", version)
		}
		_, statErr := os.Stat(asked)
		if ran := statErr == nil; ran != (version == 0) {
			t.Errorf("Version %d: criu --version ran: %v", version, ran)
		}
	}
}

func TestLogLevel(t *testing.T) {
	for _, c := range []struct {
		set  int
		op   string
		want int
	}{{0, "dump", 3}, {0, "restore", 4}, {2, "dump", 2}, {4, "dump", 4}, {1, "restore", 1}} {
		if got := (Options{LogLevel: c.set}).logLevel(c.op); got != c.want {
			t.Errorf("LogLevel %d, %s: level %d, want %d", c.set, c.op, got, c.want)
		}
	}
}

// TestDumpOnlyOptions: link remap and the ghost-file limit go to dumps
// (command line and RPC), never to restores, and the limit is clamped.
func TestDumpOnlyOptions(t *testing.T) {
	o := Options{LinkRemap: true, GhostLimit: 3 << 20}
	if got := strings.Join(o.dumpOnlyFlags(), " "); got != "--link-remap --ghost-limit 3145728" {
		t.Errorf("dump flags %q", got)
	}
	if got := o.commandLineFlags(); len(got) != 0 {
		t.Errorf("flags both dump and restore repeat: %q", got)
	}
	dir, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	dump, restore := o.rpcOpts("dump", dir, dir, nil, DumpLog), o.rpcOpts("restore", dir, dir, nil, RestoreLog)
	if !dump.GetLinkRemap() || dump.GetGhostLimit() != 3<<20 || restore.LinkRemap != nil || restore.GhostLimit != nil {
		t.Errorf("RPC: dump link_remap %v ghost_limit %d; restore %v %v", dump.GetLinkRemap(), dump.GetGhostLimit(), restore.LinkRemap, restore.GhostLimit)
	}
	big := Options{GhostLimit: 8 << 30}
	if got := big.dumpOnlyFlags(); got[1] != strconv.Itoa(MaxGhostLimit) || big.rpcOpts("dump", dir, dir, nil, DumpLog).GetGhostLimit() != MaxGhostLimit {
		t.Errorf("a limit of 8 GiB: %q", got)
	}
}

// countingCRIU writes a fake criu that prints version and counts its runs
// in a file beside it; runs reads the count.
func countingCRIU(t *testing.T, version string) (path string, runs func() int) {
	t.Helper()
	dir := t.TempDir()
	path, count := filepath.Join(dir, "criu"), filepath.Join(dir, "runs")
	script := "#!/bin/sh\necho run >>'" + count + "'\necho 'Version: " + version + "'\n"
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path, func() int {
		raw, _ := os.ReadFile(count)
		return strings.Count(string(raw), "run")
	}
}

func TestResolveCached(t *testing.T) {
	cache := filepath.Join(t.TempDir(), "cache")
	path, runs := countingCRIU(t, "4.1.1")
	for i := range 3 {
		p, v, err := ResolveCached(path, cache)
		if err != nil || p != path || v != 40101 {
			t.Fatalf("round %d: %s %d %v", i, p, v, err)
		}
	}
	if n := runs(); n != 1 {
		t.Fatalf("criu ran %d times for three resolutions, want 1", n)
	}
	// Without a cache directory, CRIU is asked every time.
	if _, _, err := ResolveCached(path, ""); err != nil || runs() != 2 {
		t.Fatalf("no cache: %v, %d runs", err, runs())
	}
	// Another binary in the same place (a new inode, other times) is
	// asked again.
	os.Remove(path)
	if err := os.WriteFile(path, []byte("#!/bin/sh\necho 'Version: 4.2'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, v, err := ResolveCached(path, cache); err != nil || v != 40200 {
		t.Fatalf("replaced binary: %d, %v", v, err)
	}

	// A version CRIU logs that is not the cached one corrects the cache
	// (a wrapper script whose criu changed behind it).
	path, runs = countingCRIU(t, "4.1.1")
	if _, _, err := ResolveCached(path, cache); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(t.TempDir(), "dump.log")
	os.WriteFile(log, []byte("(00.000000) CRIU run id = x\n(00.000100) Version: 4.3.2 (gitid 0)\n"), 0o600)
	if v := ConfirmVersion(path, cache, log, 40101); v != 40302 {
		t.Fatalf("ConfirmVersion = %d, want 40302", v)
	}
	if _, v, err := ResolveCached(path, cache); err != nil || v != 40302 || runs() != 1 {
		t.Fatalf("after the correction: %d, %v, %d runs", v, err, runs())
	}
	// A log without the version changes nothing.
	os.WriteFile(log, []byte("(00.000000) CRIU run id = x\n"), 0o600)
	if v := ConfirmVersion(path, cache, log, 40302); v != 40302 {
		t.Fatalf("ConfirmVersion without a version line = %d", v)
	}
	if _, err := LogVersion(log); !errors.Is(err, errNoLogVersion) {
		t.Fatalf("LogVersion without a version line: %v", err)
	}

	// A cached version too old to use is asked again: CRIU was upgraded
	// behind a wrapper, or the refusal must name what CRIU says now.
	os.WriteFile(log, []byte("(00.000100) Version: 3.17.1\n"), 0o600)
	if v := ConfirmVersion(path, cache, log, 40302); v != 31701 {
		t.Fatalf("ConfirmVersion = %d, want 31701", v)
	}
	if _, v, err := ResolveCached(path, cache); err != nil || v != 40101 || runs() != 2 {
		t.Fatalf("a cached 3.17.1 behind a 4.1.1: %d, %v, %d runs", v, err, runs())
	}
	old, _ := countingCRIU(t, "3.17.1")
	for range 2 {
		if _, _, err := ResolveCached(old, cache); !errors.Is(err, ErrTooOld) {
			t.Fatalf("3.17.1: %v", err)
		}
	}
}
