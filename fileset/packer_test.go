package fileset_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/fileset"
	"github.com/stasis-ckpt/stasis/gdswriter"
)

// appendSlowly appends data to path in pieces, as CRIU writes an image.
func appendSlowly(t *testing.T, path string, data []byte, piece int) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Error(err)
		return
	}
	defer f.Close()
	for len(data) > 0 {
		n := min(piece, len(data))
		if _, err := f.Write(data[:n]); err != nil {
			t.Error(err)
			return
		}
		data = data[n:]
		time.Sleep(time.Millisecond)
	}
}

// commitAndUnpack adds the rest of dir, commits the checkpoint and unpacks
// it into a new directory, which it returns with the manifest.
func commitAndUnpack(t *testing.T, s *catalog.Store, k *fileset.Packer, p *catalog.Pending, dir string) (*catalog.Manifest, string) {
	t.Helper()
	if err := k.AddDir(dir); err != nil {
		t.Fatal(err)
	}
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	rec, err := p.Commit()
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.ReadManifest(rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	if err := fileset.Unpack(context.Background(), s, m, out, fileset.LoadOptions{}); err != nil {
		t.Fatal(err)
	}
	return m, out
}

// TestPackerFollow streams two growing files while they are written, then
// adds the rest of the directory, including one followed file that was
// rewritten after it was streamed: it must be stored again, whole. Loading
// the checkpoint gives back the directory as it was at the end.
func TestPackerFollow(t *testing.T) {
	s := mustStore(t)
	dir := t.TempDir()
	pages1 := randBytes(9*gdswriter.DefaultChunkSize+1234, 1)
	pages2 := randBytes(3*gdswriter.DefaultChunkSize+77, 2)
	write(t, filepath.Join(dir, "core-1.img"), []byte("core"), 0o600)

	p, err := s.Begin(catalog.KindProcess, "follow", 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	var written atomic.Int64
	k, err := fileset.NewPacker(context.Background(), p, gdswriter.WriterOptions{Method: gdswriter.MethodAuto, Progress: func(n int64) { written.Add(n) }})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	followed := make(chan error, 1)
	isPages := func(name string) bool { return strings.HasPrefix(name, "pages-") }
	go func() { followed <- k.Follow(dir, isPages, stop, false) }()

	appendSlowly(t, filepath.Join(dir, "pages-1.img"), pages1, 1<<20)
	appendSlowly(t, filepath.Join(dir, "pages-2.img"), pages2, 1<<20)
	// Once pages-1 is streamed, it changes: Follow has moved on to pages-2.
	for deadline := time.Now().Add(20 * time.Second); written.Load() < int64(len(pages1)); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Follow streamed %d bytes of the %d of pages-1", written.Load(), len(pages1))
		}
	}
	rewritten := randBytes(len(pages1)-5000, 3)
	write(t, filepath.Join(dir, "pages-1.img"), rewritten, 0o600)
	close(stop)
	if err := <-followed; err != nil {
		t.Fatal(err)
	}
	m, out := commitAndUnpack(t, s, k, p, dir)
	for name, want := range map[string][]byte{"pages-1.img": rewritten, "pages-2.img": pages2, "core-1.img": []byte("core")} {
		got, err := os.ReadFile(filepath.Join(out, name))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: %d bytes back, want %d (%v)", name, len(got), len(want), err)
		}
	}
	// pages-2 was kept as streamed; pages-1, rewritten, was stored again
	// after it, and its first copy is a gap in the stream.
	offsets := map[string]int64{}
	for _, e := range m.Entries {
		offsets[e.Path] = e.Offset
	}
	if offsets["pages-1.img"] <= offsets["pages-2.img"] {
		t.Errorf("pages-1 at %d, pages-2 at %d: the rewritten file was not stored again", offsets["pages-1.img"], offsets["pages-2.img"])
	}
	if m.Bytes != int64(len(pages1)+len(pages2)+len(rewritten)+len("core")) {
		t.Errorf("stream holds %d bytes, want both copies of pages-1, pages-2 and core", m.Bytes)
	}
}

// TestPackerStream stores two files from readers (pipes, as CRIU hands its
// images over) that never exist in the directory, then the directory: all
// come back on loading. A streamed name that is also a file in the
// directory is refused.
func TestPackerStream(t *testing.T) {
	s := mustStore(t)
	dir := t.TempDir()
	write(t, filepath.Join(dir, "core-1.img"), []byte("core"), 0o600)
	pages1 := randBytes(5*gdswriter.DefaultChunkSize+999, 4)
	pages2 := randBytes(1234, 5)

	p, err := s.Begin(catalog.KindProcess, "stream", 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	k, err := fileset.NewPacker(context.Background(), p, gdswriter.WriterOptions{Method: gdswriter.MethodAuto})
	if err != nil {
		t.Fatal(err)
	}
	// pages-3.img is filled by the writer's workers, a chunk each.
	pages3 := randBytes(7*gdswriter.DefaultChunkSize+4321, 6)
	if err := k.StreamFill("pages-3.img", int64(len(pages3)), func(dst []byte, off int64) error {
		copy(dst, pages3[off:])
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"pages-1.img": pages1, "pages-2.img": pages2} {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			defer w.Close()
			for rest := data; len(rest) > 0; {
				n, err := w.Write(rest[:min(len(rest), 100_000)])
				if err != nil {
					return
				}
				rest = rest[n:]
			}
		}()
		err = k.Stream(name, r)
		r.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, out := commitAndUnpack(t, s, k, p, dir)
	for name, want := range map[string][]byte{"pages-1.img": pages1, "pages-2.img": pages2, "pages-3.img": pages3, "core-1.img": []byte("core")} {
		got, err := os.ReadFile(filepath.Join(out, name))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: %d bytes back, want %d (%v)", name, len(got), len(want), err)
		}
	}

	p2, err := s.Begin(catalog.KindProcess, "stream", 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Abort()
	k2, err := fileset.NewPacker(context.Background(), p2, gdswriter.WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer k2.Abort()
	if err := k2.Stream("core-1.img", bytes.NewReader([]byte("other"))); err != nil {
		t.Fatal(err)
	}
	if err := k2.AddDir(dir); !errors.Is(err, fileset.ErrSource) || !strings.Contains(err.Error(), "core-1.img") {
		t.Fatalf("AddDir with a streamed name that is also a file: %v", err)
	}
}

// TestUnpackLeavesZerosAsHoles loads a file whose middle is zeros: the
// bytes come back right, and the zero range takes no space.
func TestUnpackLeavesZerosAsHoles(t *testing.T) {
	s := mustStore(t)
	src := t.TempDir()
	data := append(append(randBytes(chunk, 5), make([]byte, 16*chunk)...), randBytes(chunk, 6)...)
	write(t, filepath.Join(src, "f"), data, 0o600)
	rec, err := fileset.Save(context.Background(), s, []string{filepath.Join(src, "f")}, opts("holes"))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	if _, err := fileset.Load(context.Background(), s, rec.ID, out, fileset.LoadOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(out, "f"))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("loaded %d bytes, want %d equal ones (%v)", len(got), len(data), err)
	}
	var st = statBlocks(t, filepath.Join(out, "f"))
	if st*512 >= int64(len(data)) {
		t.Errorf("the file uses %d bytes on disk for %d bytes with %d of zeros", st*512, len(data), 16*chunk)
	}
}

// TestPackerFollowPunch frees what it streamed: the followed file reads as
// zeros behind the stream and takes no space, the checkpoint still holds
// every byte, and a freed file that changes makes AddDir fail instead of
// storing zeros.
func TestPackerFollowPunch(t *testing.T) {
	for _, change := range []bool{false, true} {
		s := mustStore(t)
		dir := t.TempDir()
		pages := randBytes(6*gdswriter.DefaultChunkSize+99, 4)
		p, err := s.Begin(catalog.KindProcess, "punch", 1, nil)
		if err != nil {
			t.Fatal(err)
		}
		k, err := fileset.NewPacker(context.Background(), p, gdswriter.WriterOptions{})
		if err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		followed := make(chan error, 1)
		go func() {
			followed <- k.Follow(dir, func(n string) bool { return strings.HasPrefix(n, "pages-") }, stop, true)
		}()
		appendSlowly(t, filepath.Join(dir, "pages-1.img"), pages, 1<<20)
		close(stop)
		if err := <-followed; err != nil {
			t.Fatal(err)
		}
		if blocks := statBlocks(t, filepath.Join(dir, "pages-1.img")); blocks*512 >= int64(len(pages))/2 {
			t.Errorf("the streamed file still takes %d bytes", blocks*512)
		}
		if change {
			f, _ := os.OpenFile(filepath.Join(dir, "pages-1.img"), os.O_WRONLY|os.O_APPEND, 0)
			f.Write([]byte("late"))
			f.Close()
			if err := k.AddDir(dir); err == nil || !strings.Contains(err.Error(), "changed after it was streamed and freed") {
				t.Fatalf("a freed file that changed: %v", err)
			}
			k.Abort()
			p.Abort()
			continue
		}
		_, out := commitAndUnpack(t, s, k, p, dir)
		if got, _ := os.ReadFile(filepath.Join(out, "pages-1.img")); !bytes.Equal(got, pages) {
			t.Fatal("the checkpoint does not hold the streamed bytes")
		}
	}
}

// TestUnpackSkip unpacks all but the files Skip names, reading only the
// chunks the others need: a chunk that only a skipped file uses may be
// corrupted without failing the unpack.
func TestUnpackSkip(t *testing.T) {
	s := mustStore(t)
	src := t.TempDir()
	big, small := randBytes(6*chunk, 7), randBytes(1000, 8)
	write(t, filepath.Join(src, "a-big"), big, 0o600)
	write(t, filepath.Join(src, "b-small"), small, 0o600)
	rec, err := fileset.Save(context.Background(), s, []string{filepath.Join(src, "a-big"), filepath.Join(src, "b-small")}, opts("skip"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.ReadManifest(rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	var bigEntry catalog.Entry
	for _, e := range m.Entries {
		if e.Path == "a-big" {
			bigEntry = e
		}
	}
	// Corrupt a chunk that holds nothing but a-big.
	df := m.Files[bigEntry.File]
	i := int((bigEntry.Offset + df.ChunkSize) / df.ChunkSize)
	path := filepath.Join(s.CheckpointDir(rec.ID), df.Name)
	b, _ := os.ReadFile(path)
	b[df.Chunks[i].Offset] ^= 1
	os.WriteFile(path, b, 0o600)

	out := t.TempDir()
	skipBig := func(e catalog.Entry) bool { return e.Path == "a-big" }
	if err := fileset.Unpack(context.Background(), s, m, out, fileset.LoadOptions{Skip: skipBig}); err != nil {
		t.Fatalf("Unpack skipping a-big read its chunk: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(out, "b-small")); err != nil || !bytes.Equal(got, small) {
		t.Fatalf("b-small: %d bytes, %v", len(got), err)
	}
	if _, err := os.Stat(filepath.Join(out, "a-big")); !os.IsNotExist(err) {
		t.Fatalf("a skipped file was written: %v", err)
	}
	if err := fileset.Unpack(context.Background(), s, m, t.TempDir(), fileset.LoadOptions{}); !errors.Is(err, gdswriter.ErrCorrupt) {
		t.Fatalf("Unpack of everything: %v, want the corrupted chunk", err)
	}
}
