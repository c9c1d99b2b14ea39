package catalog

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stasis-ckpt/stasis/gdswriter"
)

// commitTwoFiles commits a checkpoint with two data files of 64 KiB
// chunks: one compressed with zstd (compressible bytes) and one raw
// (random bytes), with an entry on each.
func commitTwoFiles(t testing.TB, s *Store, job string) Record {
	t.Helper()
	p, err := s.Begin(KindFiles, job, 3, map[string]string{"node": "a"})
	if err != nil {
		t.Fatal(err)
	}
	text := bytes.Repeat([]byte("the same line of a log, again and again\n"), 9000)
	for i, f := range []struct {
		data   []byte
		method gdswriter.Method
	}{{text, gdswriter.MethodZstd}, {testData(300<<10, 5), gdswriter.MethodNone}} {
		name := fmt.Sprintf("data.%04d", i)
		w, err := gdswriter.Create(context.Background(), p.Path(name), gdswriter.WriterOptions{ChunkSize: 64 << 10, Workers: 2, Method: f.method})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(f.data); err != nil {
			t.Fatal(err)
		}
		res, err := w.Close()
		if err != nil {
			t.Fatal(err)
		}
		p.Manifest.Files = append(p.Manifest.Files, DataFile{Name: name, Size: res.Size, RawSize: res.RawSize, ChunkSize: res.ChunkSize, Chunks: res.Chunks})
		p.Manifest.Entries = append(p.Manifest.Entries, Entry{Path: "f" + name, Type: EntryFile, Mode: 0o600, Size: int64(len(f.data)), File: i})
	}
	rec, err := p.Commit()
	if err != nil {
		t.Fatal(err)
	}
	return *rec
}

func exportBytes(t testing.TB, s *Store, id string) []byte {
	t.Helper()
	var b bytes.Buffer
	if _, err := s.Export(context.Background(), id, &b, TransferOptions{}); err != nil {
		t.Fatalf("Export: %v", err)
	}
	return b.Bytes()
}

func importBytes(s *Store, stream []byte) (*Record, error) {
	return s.Import(context.Background(), bytes.NewReader(stream), TransferOptions{Workers: 3})
}

func TestExportImport(t *testing.T) {
	a, b := mustStore(t), mustStore(t)
	rec := commitTwoFiles(t, a, "move")
	raw := mustCommit(t, a, "raw", 1, 200<<10)
	stream := exportBytes(t, a, rec.ID)

	var seen *Manifest
	var moved int64
	got, err := b.Import(context.Background(), bytes.NewReader(stream), TransferOptions{
		Manifest: func(m *Manifest) { seen = m },
		Progress: func(n int64) { moved += n },
	})
	if err != nil {
		t.Fatalf("Import: %v", err)
	}
	if !reflect.DeepEqual(*got, rec) {
		t.Errorf("imported record %+v, want %+v", *got, rec)
	}
	if seen == nil || seen.ID != rec.ID || moved != rec.StoredBytes {
		t.Errorf("callbacks: manifest %v, %d bytes moved of %d", seen, moved, rec.StoredBytes)
	}
	if listed := mustList(t, b); len(listed) != 1 || !reflect.DeepEqual(listed[0], rec) {
		t.Errorf("B lists %+v", listed)
	}
	if _, err := b.Verify(context.Background(), rec.ID, ReadOptions{}); err != nil {
		t.Errorf("Verify after import: %v", err)
	}
	// The manifest is kept byte for byte, so B exports the same stream.
	for _, name := range []string{manifestName, "data.0000", "data.0001"} {
		x, _ := os.ReadFile(filepath.Join(a.CheckpointDir(rec.ID), name))
		y, _ := os.ReadFile(filepath.Join(b.CheckpointDir(rec.ID), name))
		if !bytes.Equal(x, y) {
			t.Errorf("%s differs after the import", name)
		}
	}
	if again := exportBytes(t, b, rec.ID); !bytes.Equal(again, stream) {
		t.Error("B's export of the imported checkpoint differs from A's")
	}
	wantEmpty(t, b)

	// The stream is a plain tar: regular files under <id>/, manifest
	// first.
	tr := tar.NewReader(bytes.NewReader(stream))
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag != tar.TypeReg || h.Mode != 0o600 {
			t.Errorf("entry %s: type %q mode %o", h.Name, h.Typeflag, h.Mode)
		}
		names = append(names, h.Name)
	}
	want := []string{rec.ID + "/manifest", rec.ID + "/data.0000", rec.ID + "/data.0001"}
	if !slices.Equal(names, want) {
		t.Errorf("entries %v, want %v", names, want)
	}

	// A checkpoint of raw chunks moves too.
	if _, err := importBytes(b, exportBytes(t, a, raw.ID)); err != nil {
		t.Fatalf("import of raw chunks: %v", err)
	}
	if _, err := b.Verify(context.Background(), raw.ID, ReadOptions{}); err != nil {
		t.Error(err)
	}
}

func TestExportRefusesDamage(t *testing.T) {
	s := mustStore(t)
	rec := commitTwoFiles(t, s, "damaged")
	data := filepath.Join(s.CheckpointDir(rec.ID), "data.0001")
	flipByte(t, data, 70000)
	_, err := s.Export(context.Background(), rec.ID, io.Discard, TransferOptions{})
	var ce *gdswriter.ChunkError
	if !errors.As(err, &ce) || !errors.Is(err, gdswriter.ErrCorrupt) || !regexpMatch(`data\.0001: chunk \d at offset 65536: checksum mismatch`, err.Error()) {
		t.Fatalf("export of a damaged chunk: %v", err)
	}
	flipByte(t, data, 70000)
	flipByte(t, filepath.Join(s.CheckpointDir(rec.ID), manifestName), 200)
	if _, err := s.Export(context.Background(), rec.ID, io.Discard, TransferOptions{}); !errors.Is(err, ErrBadManifest) {
		t.Fatalf("export of a damaged manifest: %v", err)
	}
	if _, err := s.Export(context.Background(), testID("0", 1), io.Discard, TransferOptions{}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("export of a missing checkpoint: %v", err)
	}
}

// tarEntry is one entry of a hand-made stream.
type tarEntry struct {
	name     string
	typeflag byte
	link     string
	data     []byte
	size     int64 // the header's size when not len(data)
}

// makeTar writes entries as a tar stream, with the end marker when end.
func makeTar(t *testing.T, end bool, entries ...tarEntry) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typeflag, Linkname: e.link, Mode: 0o600, Size: int64(len(e.data)), ModTime: time.Unix(0, 0)}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if e.size != 0 {
			h.Size = e.size
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.data); err != nil {
			t.Fatal(err)
		}
	}
	if end {
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
	} else {
		tw.Flush()
	}
	return b.Bytes()
}

// storeState is what a refused import must leave as it was: the listing
// and the directories of the store.
func storeState(t *testing.T, s *Store) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "%v\n", mustList(t, s))
	for _, d := range []string{checkpointsDir, stagingDir, trashDir} {
		fmt.Fprintf(&b, "%s: %v\n", d, dirNames(t, s.path(d)))
	}
	return b.String()
}

func TestImportRefuses(t *testing.T) {
	a, b := mustStore(t), mustStore(t)
	rec := commitTwoFiles(t, a, "bad")
	present := mustCommit(t, b, "here", 1, 5000)
	stream := exportBytes(t, a, rec.ID)
	dir := a.CheckpointDir(rec.ID)
	manifest, _ := os.ReadFile(filepath.Join(dir, manifestName))
	data0, _ := os.ReadFile(filepath.Join(dir, "data.0000"))
	data1, _ := os.ReadFile(filepath.Join(dir, "data.0001"))
	id := rec.ID
	good := []tarEntry{{name: id + "/manifest", data: manifest}, {name: id + "/data.0000", data: data0}, {name: id + "/data.0001", data: data1}}
	with := func(i int, e tarEntry) []tarEntry {
		out := slices.Clone(good)
		out[i] = e
		return out
	}
	flipped := func(b []byte, off int) []byte {
		b = bytes.Clone(b)
		b[off] ^= 0x04
		return b
	}
	before := storeState(t, b)
	cases := []struct {
		name   string
		stream []byte
		want   error
		msg    string
	}{
		{"absolute path", makeTar(t, true, with(0, tarEntry{name: "/" + id + "/manifest", data: manifest})...), ErrBadStream, "absolute path"},
		{"dot-dot", makeTar(t, true, with(1, tarEntry{name: id + "/../data.0000", data: data0})...), ErrBadStream, "climbs out"},
		{"symlink", makeTar(t, true, with(1, tarEntry{name: id + "/data.0000", typeflag: tar.TypeSymlink, link: "/etc/passwd"})...), ErrBadStream, "is a link"},
		{"hard link", makeTar(t, true, with(2, tarEntry{name: id + "/data.0001", typeflag: tar.TypeLink, link: id + "/data.0000"})...), ErrBadStream, "is a link"},
		{"directory", makeTar(t, true, append([]tarEntry{{name: id + "/", typeflag: tar.TypeDir}}, good...)...), ErrBadStream, "is a directory"},
		{"deeper path", makeTar(t, true, with(1, tarEntry{name: id + "/sub/data.0000", data: data0})...), ErrBadStream, "not <checkpoint id>/<file name>"},
		{"other name", makeTar(t, true, with(1, tarEntry{name: id + "/data.0007", data: data0})...), ErrBadStream, "the manifest's data file 0"},
		{"manifest not first", makeTar(t, true, good[1], good[0], good[2]), ErrBadStream, "starts with <id>/manifest"},
		{"size mismatch", makeTar(t, true, with(1, tarEntry{name: id + "/data.0000", data: data0[:len(data0)-4096]})...), ErrBadStream, "holds \\d+ bytes; the manifest says"},
		{"flipped chunk", makeTar(t, true, with(2, tarEntry{name: id + "/data.0001", data: flipped(data1, 100000)})...), gdswriter.ErrCorrupt, "data.0001 \\(import stream\\): chunk \\d at offset 65536: checksum mismatch"},
		{"flipped compressed chunk", makeTar(t, true, with(1, tarEntry{name: id + "/data.0000", data: flipped(data0, 10)})...), gdswriter.ErrCorrupt, "data.0000 \\(import stream\\): chunk \\d+ .*checksum mismatch"},
		{"flipped manifest", makeTar(t, true, with(0, tarEntry{name: id + "/manifest", data: flipped(manifest, len(manifest)-40)})...), ErrBadManifest, "checksum mismatch"},
		{"extra entry", makeTar(t, true, append(slices.Clone(good), tarEntry{name: id + "/data.0002", data: []byte("x")})...), ErrBadStream, "more follows the last data file"},
		{"no end marker", makeTar(t, false, good...), ErrBadStream, "truncated before the end-of-archive marker"},
		{"data after the end", append(slices.Clone(stream), []byte("trailing")...), ErrBadStream, "data follows the end-of-archive marker"},
		{"empty", nil, ErrBadStream, "the stream is empty"},
		{"garbage", testData(10000, 9), ErrBadStream, "not a tar header"},
		{"already present", exportBytes(t, b, present.ID), ErrExists, "already in this store"},
	}
	// Truncated at several points: in the first header, in the manifest,
	// in each data file, in the end marker.
	for _, n := range []int{100, 512 + len(manifest)/2, len(stream) / 3, len(stream) / 2, len(stream) - 5000, len(stream) - 1000, len(stream) - 1} {
		cases = append(cases, struct {
			name   string
			stream []byte
			want   error
			msg    string
		}{fmt.Sprintf("truncated at %d of %d", n, len(stream)), stream[:n], ErrBadStream, "truncated"})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := importBytes(b, c.stream)
			if !errors.Is(err, c.want) {
				t.Fatalf("Import: %v, want %v", err, c.want)
			}
			if !regexpMatch(c.msg, err.Error()) {
				t.Errorf("error %q does not say %q", err, c.msg)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error of more than one line: %q", err)
			}
			if after := storeState(t, b); after != before {
				t.Fatalf("a refused import changed the store:\n%s\nwas\n%s", after, before)
			}
		})
	}
	if _, err := b.Verify(context.Background(), present.ID, ReadOptions{}); err != nil {
		t.Fatal(err)
	}
	// The good stream still imports.
	if _, err := importBytes(b, stream); err != nil {
		t.Fatalf("the intact stream: %v", err)
	}
}

// TestBeginImport covers the commit of a checkpoint under an existing
// manifest and ID, and the IDs it must refuse.
func TestBeginImport(t *testing.T) {
	a, b := mustStore(t), mustStore(t)
	rec := mustCommit(t, a, "imp", 4, 100<<10)
	manifest, _ := os.ReadFile(filepath.Join(a.CheckpointDir(rec.ID), manifestName))
	data, _ := os.ReadFile(filepath.Join(a.CheckpointDir(rec.ID), "data.0000"))

	if _, err := b.BeginImport(manifest[:len(manifest)-1]); !errors.Is(err, ErrBadManifest) {
		t.Fatalf("a damaged manifest: %v", err)
	}
	p, err := b.BeginImport(manifest)
	if err != nil {
		t.Fatal(err)
	}
	if p.ID() != rec.ID {
		t.Fatalf("staged as %s, the manifest says %s", p.ID(), rec.ID)
	}
	// Another import of the same ID while this one holds it.
	if _, err := b.BeginImport(manifest); !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), "another process") {
		t.Fatalf("a concurrent import: %v", err)
	}
	// A data file of the wrong size is refused by Commit.
	os.WriteFile(p.Path("data.0000"), data[:len(data)-1], 0o600)
	if _, err := p.Commit(); err == nil {
		t.Fatal("Commit accepted a short data file")
	}
	wantEmpty(t, b)
	if len(mustList(t, b)) != 0 {
		t.Fatal("a failed import commit is listed")
	}

	p, err = b.BeginImport(manifest)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(p.Path("data.0000"), data, 0o600)
	got, err := p.Commit()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(*got, rec) {
		t.Errorf("record %+v, want %+v", *got, rec)
	}
	if kept, _ := os.ReadFile(filepath.Join(b.CheckpointDir(rec.ID), manifestName)); !bytes.Equal(kept, manifest) {
		t.Error("the manifest was rewritten")
	}
	if _, err := b.BeginImport(manifest); !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), "already in this store") {
		t.Fatalf("a listed ID: %v", err)
	}
	// Being removed, or on disk but not listed: refused too.
	markDeleting(t, b, rec.ID)
	if _, err := b.BeginImport(manifest); !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), "being removed") {
		t.Fatalf("an ID being removed: %v", err)
	}
	mustRebuild(t, b)
	os.Rename(b.CheckpointDir(rec.ID), b.path(trashDir, rec.ID))
	mustRebuild(t, b)
	if _, err := b.BeginImport(manifest); !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), "stasis gc") {
		t.Fatalf("an ID in trash/: %v", err)
	}
}

// TestImportKilled kills an import half-way through its stream: nothing
// is listed, and gc removes what it staged.
func TestImportKilled(t *testing.T) {
	a, b := mustStore(t), mustStore(t)
	rec := mustCommit(t, a, "killed", 1, 2<<20)
	stream := exportBytes(t, a, rec.ID)
	cmd := helperCmd("import", b.Root)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Write(stream[:len(stream)/2]); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if st, err := os.Stat(filepath.Join(b.path(stagingDir, rec.ID), "data.0000")); err == nil && st.Size() > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the import never staged any data")
		}
	}
	killHelper(t, cmd)
	in.Close()
	if len(mustList(t, b)) != 0 {
		t.Fatal("a killed import is listed")
	}
	rep, err := b.GC()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rep.StagingRemoved, []string{rec.ID}) {
		t.Errorf("gc removed %v from staging, want the import's %s", rep.StagingRemoved, rec.ID)
	}
	wantEmpty(t, b)
	// And the import can be made again.
	if _, err := importBytes(b, stream); err != nil {
		t.Fatal(err)
	}
}

func regexpMatch(pattern, s string) bool { return regexp.MustCompile(pattern).MatchString(s) }

// actAfter is a writer that calls act once, when more than n bytes have
// been written to it.
type actAfter struct {
	bytes.Buffer
	n   int
	act func()
}

func (w *actAfter) Write(p []byte) (int, error) {
	n, err := w.Buffer.Write(p)
	if w.act != nil && w.Len() > w.n {
		w.act()
		w.act = nil
	}
	return n, err
}

// TestExportDuringRemoval removes the checkpoint while its first data
// file is being exported: moved into trash/ only, the export goes on and
// its stream imports; deleted, the export fails as not found, not as
// corrupt.
func TestExportDuringRemoval(t *testing.T) {
	t.Run("moved", func(t *testing.T) {
		a, b := mustStore(t), mustStore(t)
		rec := commitTwoFiles(t, a, "moved")
		w := &actAfter{n: 2 * tarBlock, act: func() {
			// Remove's rename, before it deletes anything.
			if err := os.Rename(a.CheckpointDir(rec.ID), a.path(trashDir, rec.ID)); err != nil {
				t.Fatal(err)
			}
		}}
		if _, err := a.Export(context.Background(), rec.ID, w, TransferOptions{}); err != nil {
			t.Fatalf("export of a checkpoint moved into trash/ during it: %v", err)
		}
		if w.act != nil {
			t.Fatal("the checkpoint was not moved during the export")
		}
		if _, err := importBytes(b, w.Bytes()); err != nil {
			t.Fatalf("import of that export: %v", err)
		}
	})
	t.Run("deleted", func(t *testing.T) {
		s := mustStore(t)
		rec := commitTwoFiles(t, s, "deleted")
		w := &actAfter{n: 2 * tarBlock, act: func() {
			if err := s.Remove(rec.ID); err != nil {
				t.Fatal(err)
			}
		}}
		_, err := s.Export(context.Background(), rec.ID, w, TransferOptions{})
		if !errors.Is(err, ErrNotFound) || errors.Is(err, gdswriter.ErrCorrupt) || !strings.Contains(err.Error(), "removed during the export") {
			t.Fatalf("export of a checkpoint removed during it: %v, want not found", err)
		}
	})
}

// TestImportBuffersBounded: what an import allocates to verify chunks
// follows the chunks a manifest declares, not its chunk_size, and stays
// within importMemory however many workers are asked for.
func TestImportBuffersBounded(t *testing.T) {
	big := int64(gdswriter.MaxChunkSize)
	chunks := make([]gdswriter.Chunk, 8)
	for i := range chunks {
		chunks[i] = gdswriter.Chunk{Offset: int64(i) * big, Stored: big, Raw: big, Codec: gdswriter.CodecRaw}
	}
	workers, size := importBuffers(DataFile{ChunkSize: big, Chunks: chunks}, 64)
	if workers < 1 || int64(workers+1)*size > importMemory+size {
		t.Errorf("%d workers with buffers of %d bytes for 256 MiB chunks, over %d", workers, size, importMemory)
	}

	// A real stream whose manifest declares the largest chunk size for
	// one small chunk.
	a, b := mustStore(t), mustStore(t)
	rec := mustCommit(t, a, "huge", 1, 10000)
	m, err := a.ReadManifest(rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	m.Files[0].ChunkSize = big
	data, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a.CheckpointDir(rec.ID), manifestName), data, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, size := importBuffers(m.Files[0], 16); size > 64<<10 {
		t.Errorf("buffers of %d bytes for a chunk of 10000 bytes", size)
	}
	stream := exportBytes(t, a, rec.ID)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, err := b.Import(context.Background(), bytes.NewReader(stream), TransferOptions{Workers: 16}); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if n := after.TotalAlloc - before.TotalAlloc; n > 64<<20 {
		t.Errorf("importing %d bytes allocated %d bytes", len(stream), n)
	}
}
