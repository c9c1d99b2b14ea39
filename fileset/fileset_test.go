package fileset_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/fileset"
	"github.com/stasis-ckpt/stasis/gdswriter"
	"golang.org/x/sys/unix"
)

const chunk = 64 << 10

func mustStore(t *testing.T) *catalog.Store {
	t.Helper()
	s, err := catalog.Open(filepath.Join(t.TempDir(), "store"), catalog.Options{LockTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func opts(job string) fileset.SaveOptions {
	return fileset.SaveOptions{
		Job: job, Step: 3, Tags: map[string]string{"who": "test"},
		Writer: gdswriter.WriterOptions{ChunkSize: chunk, Workers: 2, Method: gdswriter.MethodAuto},
	}
}

func randBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		if i%3 == 0 {
			b[i] = 'x' // compressible in part
		} else {
			b[i] = byte(r.Uint32())
		}
	}
	return b
}

func write(t *testing.T, path string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // past the umask
		t.Fatal(err)
	}
}

// buildTree makes src/proj (a tree with every kind of entry Save stores)
// and src/top.dat, with distinct modification times, and returns both.
func buildTree(t *testing.T) (proj, top string) {
	t.Helper()
	src := t.TempDir()
	proj = filepath.Join(src, "proj")
	write(t, filepath.Join(proj, "a.txt"), []byte("hello, checkpoint\n"), 0o644)
	write(t, filepath.Join(proj, "empty"), nil, 0o644)
	write(t, filepath.Join(proj, "secret"), []byte("key"), 0o600)
	write(t, filepath.Join(proj, "sub", "deep", "f.bin"), randBytes(3*chunk+500, 1), 0o640)
	write(t, filepath.Join(proj, "sub", "g.bin"), randBytes(chunk+1, 2), 0o644)
	write(t, filepath.Join(proj, "sub", "exact.bin"), randBytes(chunk, 3), 0o755)
	write(t, filepath.Join(proj, "ro", "r.txt"), []byte("read only"), 0o444)
	if err := os.Mkdir(filepath.Join(proj, "emptydir"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a.txt", filepath.Join(proj, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/nonexistent/target", filepath.Join(proj, "sub", "dangling")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(proj, "ro"), 0o555); err != nil {
		t.Fatal(err)
	}
	top = filepath.Join(src, "top.dat")
	write(t, top, randBytes(100_000, 4), 0o600)
	// Times last, deepest first, each one different.
	base := time.Date(2023, 4, 5, 6, 7, 8, 0, time.UTC)
	var paths []string
	filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err == nil && p != src && d.Type()&fs.ModeSymlink == 0 {
			paths = append(paths, p)
		}
		return nil
	})
	slices.Reverse(paths)
	for i, p := range paths {
		mt := base.Add(time.Duration(i)*time.Hour + time.Duration(i*1234567)*time.Nanosecond)
		if err := os.Chtimes(p, mt, mt); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { os.Chmod(filepath.Join(proj, "ro"), 0o755) })
	return proj, top
}

// sameTree requires that got holds exactly what want holds: types, modes,
// modification times, contents and link targets.
func sameTree(t *testing.T, want, got string) {
	t.Helper()
	seen := 0
	err := filepath.WalkDir(want, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		seen++
		rel, _ := filepath.Rel(want, p)
		q := filepath.Join(got, rel)
		wi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		gi, err := os.Lstat(q)
		if err != nil {
			t.Errorf("%s: missing: %v", rel, err)
			return nil
		}
		if wi.Mode().Type() != gi.Mode().Type() {
			t.Errorf("%s: type %v, want %v", rel, gi.Mode().Type(), wi.Mode().Type())
			return nil
		}
		if wi.Mode()&fs.ModeSymlink != 0 {
			wl, _ := os.Readlink(p)
			gl, _ := os.Readlink(q)
			if wl != gl {
				t.Errorf("%s: link to %q, want %q", rel, gl, wl)
			}
			return nil
		}
		if wi.Mode().Perm() != gi.Mode().Perm() {
			t.Errorf("%s: mode %v, want %v", rel, gi.Mode().Perm(), wi.Mode().Perm())
		}
		if !wi.ModTime().Equal(gi.ModTime()) {
			t.Errorf("%s: mtime %v, want %v", rel, gi.ModTime(), wi.ModTime())
		}
		if wi.Mode().IsRegular() {
			wb, _ := os.ReadFile(p)
			gb, _ := os.ReadFile(q)
			if !bytes.Equal(wb, gb) {
				t.Errorf("%s: %d bytes differ from the %d saved", rel, len(gb), len(wb))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	filepath.WalkDir(got, func(string, fs.DirEntry, error) error { n++; return nil })
	if n != seen {
		t.Errorf("%s holds %d entries, %s %d", got, n, want, seen)
	}
}

// wantNothingStored requires that the store lists nothing and that no
// checkpoint, staged or complete, is on disk.
func wantNothingStored(t *testing.T, s *catalog.Store) {
	t.Helper()
	recs, err := s.List(catalog.Filter{IncludeAll: true})
	if err != nil || len(recs) != 0 {
		t.Errorf("store lists %+v, %v", recs, err)
	}
	for _, d := range []string{"staging", "checkpoints", "trash"} {
		entries, err := os.ReadDir(filepath.Join(s.Root, d))
		if err != nil || len(entries) != 0 {
			t.Errorf("%s/ holds %v (%v)", d, entries, err)
		}
	}
}

// wantNoTemp requires that dir's parent holds no temporary load directory.
func wantNoTemp(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(filepath.Dir(dir))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.Contains(e.Name(), "stasis-load") {
			t.Errorf("temporary directory %s left behind", e.Name())
		}
	}
}

func TestSaveLoad(t *testing.T) {
	s := mustStore(t)
	proj, top := buildTree(t)
	rec, err := fileset.Save(context.Background(), s, []string{proj, top}, opts("files-test"))
	if err != nil {
		t.Fatalf("Save: %v", err)
	}
	if rec.Kind != catalog.KindFiles || rec.Job != "files-test" || rec.Step != 3 || rec.Tags["who"] != "test" {
		t.Errorf("record %+v", rec)
	}
	entries, total, err := fileset.Plan([]string{proj, top})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Bytes != total {
		t.Errorf("checkpoint holds %d bytes, Plan counted %d", rec.Bytes, total)
	}
	m, err := s.Verify(context.Background(), rec.ID, catalog.ReadOptions{})
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if len(m.Files) != 1 || len(m.Files[0].Chunks) < 5 {
		t.Errorf("want one data file of several chunks, got %+v", m.Files)
	}
	if len(m.Entries) != len(entries) {
		t.Errorf("manifest has %d entries, Plan %d", len(m.Entries), len(entries))
	}

	out := filepath.Join(t.TempDir(), "out")
	if _, err := fileset.Load(context.Background(), s, rec.ID, out, fileset.LoadOptions{}); err != nil {
		t.Fatalf("Load: %v", err)
	}
	t.Cleanup(func() { os.Chmod(filepath.Join(out, "proj", "ro"), 0o755) })
	sameTree(t, proj, filepath.Join(out, "proj"))
	sameTree(t, top, filepath.Join(out, "top.dat"))
	if names, _ := os.ReadDir(out); len(names) != 2 {
		t.Errorf("load target holds %v", names)
	}
	wantNoTemp(t, out)

	// Into an existing empty directory, with one reader.
	empty := t.TempDir()
	if _, err := fileset.Load(context.Background(), s, rec.ID, empty, fileset.LoadOptions{Read: catalog.ReadOptions{Workers: 1, NoDirect: true}}); err != nil {
		t.Fatalf("Load into an empty directory: %v", err)
	}
	t.Cleanup(func() { os.Chmod(filepath.Join(empty, "proj", "ro"), 0o755) })
	sameTree(t, proj, filepath.Join(empty, "proj"))
	wantNoTemp(t, empty)
}

func TestPlan(t *testing.T) {
	proj, top := buildTree(t)
	entries, total, err := fileset.Plan([]string{proj, top})
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	var sum int64
	for _, e := range entries {
		paths = append(paths, e.Path+":"+e.Type)
		sum += e.Size
		if e.Type == catalog.EntrySymlink && (e.MTime != nil || e.Mode != 0) {
			t.Errorf("symlink %s has mode or time: %+v", e.Path, e)
		}
	}
	want := []string{
		"proj:dir", "proj/a.txt:file", "proj/empty:file", "proj/emptydir:dir", "proj/link:symlink",
		"proj/ro:dir", "proj/ro/r.txt:file", "proj/secret:file", "proj/sub:dir", "proj/sub/dangling:symlink",
		"proj/sub/deep:dir", "proj/sub/deep/f.bin:file", "proj/sub/exact.bin:file", "proj/sub/g.bin:file",
		"top.dat:file",
	}
	if !slices.Equal(paths, want) {
		t.Errorf("Plan entries\n got %v\nwant %v", paths, want)
	}
	if sum != total || total != int64(18+3+3*chunk+500+chunk+1+chunk+9+100_000) {
		t.Errorf("total %d, entries sum to %d", total, sum)
	}
	// A symlink given as a path is stored as the link, not its target.
	entries, _, err = fileset.Plan([]string{filepath.Join(proj, "link")})
	if err != nil || len(entries) != 1 || entries[0].Type != catalog.EntrySymlink || entries[0].Link != "a.txt" {
		t.Errorf("Plan of a symlink: %+v, %v", entries, err)
	}
}

func TestSaveRefuses(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "one", "x"), []byte("1"), 0o644)
	write(t, filepath.Join(dir, "two", "x"), []byte("2"), 0o644)
	pipeDir := filepath.Join(dir, "withpipe")
	write(t, filepath.Join(pipeDir, "ok"), []byte("ok"), 0o644)
	if err := unix.Mkfifo(filepath.Join(pipeDir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "does-not-exist")
	for _, tc := range []struct {
		name  string
		paths []string
		is    []error
		msg   string
	}{
		{"missing path", []string{missing}, []error{fileset.ErrSource, fs.ErrNotExist}, missing},
		{"missing second path", []string{filepath.Join(dir, "one"), missing}, []error{fileset.ErrSource, fs.ErrNotExist}, missing},
		{"named pipe", []string{filepath.Join(pipeDir, "fifo")}, []error{fileset.ErrSource}, "named pipe"},
		{"named pipe in a directory", []string{pipeDir}, []error{fileset.ErrSource}, "named pipe"},
		{"same base name twice", []string{filepath.Join(dir, "one", "x"), filepath.Join(dir, "two", "x")}, []error{fileset.ErrSource}, "same name"},
		{"same path twice", []string{filepath.Join(dir, "one"), filepath.Join(dir, "one") + "/"}, []error{fileset.ErrSource}, "same name"},
		{"the root", []string{"/"}, []error{fileset.ErrSource}, "below /"},
		{"no paths", nil, []error{fileset.ErrSource}, "no paths"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check := func(what string, err error) {
				t.Helper()
				if err == nil {
					t.Fatalf("%s succeeded", what)
				}
				for _, target := range tc.is {
					if !errors.Is(err, target) {
						t.Errorf("%s: %v does not wrap %v", what, err, target)
					}
				}
				if !strings.Contains(err.Error(), tc.msg) {
					t.Errorf("%s: %q does not say %q", what, err, tc.msg)
				}
			}
			_, _, err := fileset.Plan(tc.paths)
			check("Plan", err)
			s := mustStore(t)
			_, err = fileset.Save(context.Background(), s, tc.paths, opts("j"))
			check("Save", err)
			wantNothingStored(t, s)
		})
	}
}

func TestSaveFailsCleanly(t *testing.T) {
	proj, _ := buildTree(t)
	t.Run("invalid job", func(t *testing.T) {
		s := mustStore(t)
		if _, err := fileset.Save(context.Background(), s, []string{proj}, opts(" bad job")); !errors.Is(err, catalog.ErrInvalid) {
			t.Errorf("Save with an invalid job: %v", err)
		}
		wantNothingStored(t, s)
	})
	t.Run("cancelled", func(t *testing.T) {
		s := mustStore(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := fileset.Save(ctx, s, []string{proj}, opts("j")); !errors.Is(err, context.Canceled) {
			t.Errorf("Save with a cancelled context: %v", err)
		}
		wantNothingStored(t, s)
	})
	t.Run("bad writer options", func(t *testing.T) {
		s := mustStore(t)
		o := opts("j")
		o.Writer.ChunkSize = 1000
		if _, err := fileset.Save(context.Background(), s, []string{proj}, o); err == nil {
			t.Error("Save with chunk size 1000 succeeded")
		}
		wantNothingStored(t, s)
	})
}

// TestSaveFileChangesSize changes a file after Plan has sized it and before
// Save copies it. Files are copied one after another in walk order, and
// with one worker and 64 KiB chunks the writer holds at most three chunk
// buffers, so when the first chunk of a.bin (512 KiB) is written, z.txt has
// not been opened yet: the write-progress callback changes it then.
func TestSaveFileChangesSize(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(path string) error
	}{
		{"grows", func(p string) error {
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.Write([]byte("more"))
			return err
		}},
		{"shrinks", func(p string) error { return os.Truncate(p, 3) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "d")
			write(t, filepath.Join(dir, "a.bin"), randBytes(8*chunk, 5), 0o644)
			victim := filepath.Join(dir, "z.txt")
			write(t, victim, []byte("stable content"), 0o644)
			s := mustStore(t)
			o := opts("j")
			o.Writer.Workers = 1
			var once sync.Once
			var changeErr error
			o.Writer.Progress = func(int64) { once.Do(func() { changeErr = tc.change(victim) }) }
			_, err := fileset.Save(context.Background(), s, []string{dir}, o)
			if changeErr != nil {
				t.Fatal(changeErr)
			}
			if !errors.Is(err, fileset.ErrSource) || !strings.Contains(err.Error(), "changed size") || !strings.Contains(err.Error(), victim) {
				t.Errorf("Save of a file that %s: %v", tc.name, err)
			}
			wantNothingStored(t, s)
		})
	}
}

func TestLoadRefuses(t *testing.T) {
	s := mustStore(t)
	proj, _ := buildTree(t)
	rec, err := fileset.Save(context.Background(), s, []string{proj}, opts("j"))
	if err != nil {
		t.Fatal(err)
	}

	t.Run("non-empty target", func(t *testing.T) {
		target := t.TempDir()
		write(t, filepath.Join(target, "keep.txt"), []byte("mine"), 0o600)
		_, err := fileset.Load(context.Background(), s, rec.ID, target, fileset.LoadOptions{})
		if !errors.Is(err, catalog.ErrInvalid) {
			t.Errorf("Load into a non-empty directory: %v", err)
		}
		names, _ := os.ReadDir(target)
		if b, _ := os.ReadFile(filepath.Join(target, "keep.txt")); len(names) != 1 || string(b) != "mine" {
			t.Errorf("target changed: %v, %q", names, b)
		}
		wantNoTemp(t, target)
	})
	t.Run("target is a file", func(t *testing.T) {
		target := filepath.Join(t.TempDir(), "f")
		write(t, target, []byte("x"), 0o600)
		if _, err := fileset.Load(context.Background(), s, rec.ID, target, fileset.LoadOptions{}); !errors.Is(err, catalog.ErrInvalid) {
			t.Errorf("Load onto a file: %v", err)
		}
		wantNoTemp(t, target)
	})
	t.Run("unknown checkpoint", func(t *testing.T) {
		if _, err := fileset.Load(context.Background(), s, uuid.NewString(), filepath.Join(t.TempDir(), "o"), fileset.LoadOptions{}); !errors.Is(err, catalog.ErrNotFound) {
			t.Errorf("Load of an unknown checkpoint: %v", err)
		}
	})
	t.Run("not a files checkpoint", func(t *testing.T) {
		p, err := s.Begin(catalog.KindTensors, "t", 1, nil)
		if err != nil {
			t.Fatal(err)
		}
		trec, err := p.Commit()
		if err != nil {
			t.Fatal(err)
		}
		target := filepath.Join(t.TempDir(), "o")
		if _, err := fileset.Load(context.Background(), s, trec.ID, target, fileset.LoadOptions{}); !errors.Is(err, catalog.ErrInvalid) {
			t.Errorf("Load of a tensors checkpoint: %v", err)
		}
		if _, err := os.Stat(target); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("target created: %v", err)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		target := filepath.Join(t.TempDir(), "o")
		if _, err := fileset.Load(ctx, s, rec.ID, target, fileset.LoadOptions{}); !errors.Is(err, context.Canceled) {
			t.Errorf("Load with a cancelled context: %v", err)
		}
		if _, err := os.Stat(target); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("target created: %v", err)
		}
		wantNoTemp(t, target)
	})
}

func TestLoadCorrupt(t *testing.T) {
	s := mustStore(t)
	proj, _ := buildTree(t)
	rec, err := fileset.Save(context.Background(), s, []string{proj}, opts("j"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.ReadManifest(rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(s.CheckpointDir(rec.ID), "data.0000")
	// Damage the last chunk, so that most files are written before the
	// damage is found.
	c := m.Files[0].Chunks[len(m.Files[0].Chunks)-1]
	flip(t, data, c.Offset+c.Stored-1)
	for _, existing := range []bool{false, true} {
		target := filepath.Join(t.TempDir(), "out")
		if existing {
			os.Mkdir(target, 0o700)
		}
		_, err := fileset.Load(context.Background(), s, rec.ID, target, fileset.LoadOptions{})
		if !errors.Is(err, gdswriter.ErrCorrupt) || !strings.Contains(err.Error(), data) {
			t.Errorf("Load of a damaged checkpoint: %v", err)
		}
		entries, statErr := os.ReadDir(target)
		switch {
		case existing && (statErr != nil || len(entries) != 0):
			t.Errorf("existing empty target changed: %v, %v", entries, statErr)
		case !existing && !errors.Is(statErr, os.ErrNotExist):
			t.Errorf("failed load created its target: %v", statErr)
		}
		wantNoTemp(t, target)
	}
}

func flip(t *testing.T, path string, off int64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[off] ^= 0xff
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// plantFiles writes a files checkpoint by hand, as another implementation
// or a hostile writer might: stream is the data file's decoded content and
// entries say where files lie in it. It returns the checkpoint's ID.
func plantFiles(t *testing.T, s *catalog.Store, stream []byte, entries []catalog.Entry) string {
	t.Helper()
	id := uuid.NewString()
	dir := s.CheckpointDir(id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	w, err := gdswriter.Create(context.Background(), filepath.Join(dir, "data.0000"), gdswriter.WriterOptions{ChunkSize: chunk, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	w.Write(stream)
	res, err := w.Close()
	if err != nil {
		t.Fatal(err)
	}
	m := catalog.Manifest{
		Format: catalog.FormatVersion, ID: id, Kind: catalog.KindFiles, Job: "planted", Created: time.Now().UTC(), Host: "h",
		Bytes: res.RawSize, StoredBytes: res.Size,
		Files:   []catalog.DataFile{{Name: "data.0000", Size: res.Size, RawSize: res.RawSize, ChunkSize: res.ChunkSize, Chunks: res.Chunks}},
		Entries: entries,
	}
	body, err := json.MarshalIndent(m, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	body = append(body, '\n')
	data := append(fmt.Appendf(nil, "stasis-manifest %d sha256=%x\n", catalog.FormatVersion, sha256.Sum256(body)), body...)
	if err := os.WriteFile(filepath.Join(dir, "manifest"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestLoadGaps loads a checkpoint whose file entries do not cover the
// whole stream (valid per the manifest format; Save never writes one):
// every file must still get exactly its bytes.
func TestLoadGaps(t *testing.T) {
	s := mustStore(t)
	stream := randBytes(3*chunk, 9)
	type span struct {
		path      string
		off, size int64
	}
	spans := []span{
		{"g/a", 0, 100},
		{"g/b", 1000, 2000},                // gap, then a start inside chunk 0
		{"g/c", chunk - 50, 200},           // across the first boundary
		{"g/e", chunk + 300, 0},            // empty, inside a gap
		{"g/d", 2*chunk + 10, chunk - 100}, // a whole chunk skipped before it
	}
	entries := []catalog.Entry{{Path: "g", Type: catalog.EntryDir, Mode: 0o755}}
	for _, sp := range spans {
		entries = append(entries, catalog.Entry{Path: sp.path, Type: catalog.EntryFile, Mode: 0o644, Size: sp.size, Offset: sp.off})
	}
	id := plantFiles(t, s, stream, entries)
	m, err := s.ReadManifest(id)
	if err != nil {
		t.Fatalf("planted manifest is invalid: %v", err)
	}
	if _, err := s.Verify(context.Background(), m.ID, catalog.ReadOptions{}); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	if _, err := fileset.Load(context.Background(), s, id, out, fileset.LoadOptions{}); err != nil {
		t.Fatalf("Load: %v", err)
	}
	for _, sp := range spans {
		got, err := os.ReadFile(filepath.Join(out, sp.path))
		if err != nil || !bytes.Equal(got, stream[sp.off:sp.off+sp.size]) {
			t.Errorf("%s: %d bytes (%v), want stream[%d:%d]", sp.path, len(got), err, sp.off, sp.off+sp.size)
		}
	}
}

// TestLoadOverlap: two file entries sharing bytes of the stream are valid
// manifest entries, but Load writes the stream in one pass; it must refuse
// rather than write a wrong file.
func TestLoadOverlap(t *testing.T) {
	s := mustStore(t)
	stream := randBytes(2*chunk, 10)
	id := plantFiles(t, s, stream, []catalog.Entry{
		{Path: "a", Type: catalog.EntryFile, Mode: 0o644, Size: 1000},
		{Path: "b", Type: catalog.EntryFile, Mode: 0o644, Offset: 500, Size: 1000},
	})
	if _, err := s.ReadManifest(id); err != nil {
		t.Fatalf("planted manifest is invalid: %v", err)
	}
	out := filepath.Join(t.TempDir(), "out")
	_, err := fileset.Load(context.Background(), s, id, out, fileset.LoadOptions{})
	if err == nil {
		a, _ := os.ReadFile(filepath.Join(out, "a"))
		b, _ := os.ReadFile(filepath.Join(out, "b"))
		if bytes.Equal(a, stream[:1000]) && bytes.Equal(b, stream[500:1500]) {
			return // loading overlaps correctly is fine too
		}
		t.Fatalf("Load wrote wrong files for overlapping entries (a ok: %v, b ok: %v)", bytes.Equal(a, stream[:1000]), bytes.Equal(b, stream[500:1500]))
	}
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("failed load created its target: %v", err)
	}
	wantNoTemp(t, out)
}

// TestLoadNeverWritesThroughSymlinks plants manifests whose entries lie
// below a symlink entry pointing out of the target: loading must not write
// outside the target.
func TestLoadNeverWritesThroughSymlinks(t *testing.T) {
	s := mustStore(t)
	outside := t.TempDir()
	stream := []byte("pwned")
	for name, entries := range map[string][]catalog.Entry{
		"file below a symlink": {
			{Path: "r", Type: catalog.EntryDir, Mode: 0o755},
			{Path: "r/esc", Type: catalog.EntrySymlink, Link: outside},
			{Path: "r/esc/pwned", Type: catalog.EntryFile, Mode: 0o644, Size: 5},
		},
		"symlink below a symlink": {
			{Path: "esc", Type: catalog.EntrySymlink, Link: outside},
			{Path: "esc/pwned", Type: catalog.EntrySymlink, Link: "/etc/passwd"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			id := plantFiles(t, s, stream, entries)
			out := filepath.Join(t.TempDir(), "out")
			_, err := fileset.Load(context.Background(), s, id, out, fileset.LoadOptions{})
			if err == nil {
				t.Errorf("Load of a manifest with entries below a symlink succeeded")
			}
			if names, _ := os.ReadDir(outside); len(names) != 0 {
				t.Errorf("Load wrote outside its target: %v", names)
				for _, n := range names {
					os.Remove(filepath.Join(outside, n.Name()))
				}
			}
			wantNoTemp(t, out)
		})
	}
}

// A checkpoint with no file bytes at all: an empty directory and an empty
// file give a data file of no chunks.
func TestSaveLoadNoBytes(t *testing.T) {
	s := mustStore(t)
	src := filepath.Join(t.TempDir(), "hollow")
	if err := os.MkdirAll(filepath.Join(src, "nothing"), 0o700); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(src, "zero"), nil, 0o600)
	rec, err := fileset.Save(context.Background(), s, []string{src}, opts("j"))
	if err != nil {
		t.Fatalf("Save: %v", err)
	}
	if rec.Bytes != 0 || rec.StoredBytes != 0 {
		t.Errorf("record of an empty tree: %+v", rec)
	}
	out := filepath.Join(t.TempDir(), "out")
	if _, err := fileset.Load(context.Background(), s, rec.ID, out, fileset.LoadOptions{}); err != nil {
		t.Fatalf("Load: %v", err)
	}
	sameTree(t, src, filepath.Join(out, "hollow"))
}
