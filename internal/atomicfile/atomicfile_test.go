package atomicfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	for _, content := range []string{"first", "second, longer"} {
		if err := Write(path, []byte(content)); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != content {
			t.Fatalf("read back %q, %v; want %q", got, err, content)
		}
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mode: %v, %v", st, err)
	}
	// A rename that fails (a directory in the way) leaves nothing behind.
	blocked := filepath.Join(dir, "blocked")
	if err := os.MkdirAll(filepath.Join(blocked, "inside"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := Write(blocked, []byte("x")); err == nil {
		t.Fatal("Write over a non-empty directory succeeded")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Fatalf("files left in %s: %v", dir, entries)
	}
}

func TestWriteFrom(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "export.tar")
	if err := WriteFrom(path, true, func(w io.Writer) error {
		_, err := io.WriteString(w, "whole")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(path); err != nil || string(got) != "whole" {
		t.Fatalf("read back %q, %v", got, err)
	}
	// A write that fails halfway leaves the old file as it was, and no
	// other file.
	failed := errors.New("stream broke")
	err := WriteFrom(path, true, func(w io.Writer) error {
		io.WriteString(w, "ha")
		return failed
	})
	if !errors.Is(err, failed) {
		t.Fatalf("WriteFrom returned %v, want the write's error", err)
	}
	if got, _ := os.ReadFile(path); string(got) != "whole" {
		t.Fatalf("after a failed write: %q", got)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("files left in %s: %v", dir, entries)
	}
}

// TestWriteFromLeavesNoNameWhileWriting checks that, on a file system
// with O_TMPFILE (the test's temporary directory), the file being
// written has no name in the directory until it is complete: a process
// killed meanwhile leaves nothing behind. Over an existing file too.
func TestWriteFromLeavesNoNameWhileWriting(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "export.tar")
	for _, want := range []string{"first", "second"} {
		err := WriteFrom(path, true, func(w io.Writer) error {
			io.WriteString(w, want)
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				if e.Name() != "export.tar" {
					t.Errorf("while writing, %s holds %s", dir, e.Name())
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(path); err != nil || string(got) != want {
			t.Fatalf("read back %q, %v; want %q", got, err, want)
		}
		if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("mode: %v, %v", st, err)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("files left in %s: %v", dir, entries)
	}
}
