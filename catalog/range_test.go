package catalog

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/stasis-ckpt/stasis/gdswriter"
)

// commitFiveChunks commits a files checkpoint of one data file of 64 KiB
// chunks, five of them, the last short, holding testData of seed.
func commitFiveChunks(t *testing.T, s *Store, seed uint64) ([]byte, *Record, *Manifest) {
	t.Helper()
	data := testData(300<<10+123, seed)
	rec, err := commitData(s, KindFiles, "j", 1, data)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.ReadManifest(rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	return data, rec, m
}

// TestStreamRangeAndEachChunkOf reads parts of a data file of 64 KiB
// chunks: ranges inside one chunk, across chunk boundaries, at the ends,
// empty and out of bounds; then chunks by index; then both over a
// corrupted chunk, whose error must give its index in the whole file.
func TestStreamRangeAndEachChunkOf(t *testing.T) {
	s := mustStore(t)
	data, rec, m := commitFiveChunks(t, s, 7)
	f := m.Files[0]
	ctx := context.Background()
	for _, r := range [][2]int64{{0, 10}, {100, 64 << 10}, {64 << 10, 64 << 10}, {1, int64(len(data)) - 1}, {int64(len(data)) - 5, 5}, {0, int64(len(data))}, {70000, 0}} {
		var got []byte
		calls := 0
		err := s.StreamRange(ctx, m, f, r[0], r[1], ReadOptions{Workers: 3}, func(b []byte) error {
			calls++
			got = append(got, b...)
			return nil
		})
		if err != nil || !bytes.Equal(got, data[r[0]:r[0]+r[1]]) {
			t.Fatalf("range %v: %d bytes, %v", r, len(got), err)
		}
		if want := int((r[0]+r[1]-1)/f.ChunkSize - r[0]/f.ChunkSize + 1); r[1] > 0 && calls != want {
			t.Errorf("range %v: %d calls, want one per chunk (%d)", r, calls, want)
		}
	}
	if err := s.StreamRange(ctx, m, f, int64(len(data))-5, 6, ReadOptions{}, func([]byte) error { return nil }); !errors.Is(err, ErrBadManifest) {
		t.Fatalf("range past the end: %v", err)
	}

	var mu sync.Mutex
	var seen []int
	err := s.EachChunkOf(ctx, m, f, []int{4, 1}, ReadOptions{Workers: 2}, func(i int, raw []byte) error {
		mu.Lock()
		seen = append(seen, i)
		mu.Unlock()
		if !bytes.Equal(raw, data[int64(i)*f.ChunkSize:min(int64(i+1)*f.ChunkSize, int64(len(data)))]) {
			t.Errorf("chunk %d holds other bytes", i)
		}
		return nil
	})
	slices.Sort(seen)
	if err != nil || !slices.Equal(seen, []int{1, 4}) {
		t.Fatalf("EachChunkOf(4, 1): saw %v, %v", seen, err)
	}
	if err := s.EachChunkOf(ctx, m, f, []int{5}, ReadOptions{}, func(int, []byte) error { return nil }); !errors.Is(err, ErrBadManifest) {
		t.Fatalf("a chunk that does not exist: %v", err)
	}

	// Chunk 3 corrupted: reading it, by range or by index, names chunk 3.
	path := filepath.Join(s.CheckpointDir(rec.ID), f.Name)
	b, _ := os.ReadFile(path)
	b[f.Chunks[3].Offset+10] ^= 0xff
	os.WriteFile(path, b, 0o600)
	var ce *gdswriter.ChunkError
	err = s.StreamRange(ctx, m, f, 3<<16-10, 20, ReadOptions{}, func([]byte) error { return nil })
	if !errors.As(err, &ce) || ce.Index != 3 {
		t.Fatalf("range over chunk 3: %v", err)
	}
	err = s.EachChunkOf(ctx, m, f, []int{0, 3}, ReadOptions{}, func(int, []byte) error { return nil })
	if !errors.As(err, &ce) || ce.Index != 3 {
		t.Fatalf("chunks 0 and 3: %v", err)
	}
	if err := s.StreamRange(ctx, m, f, 0, 1000, ReadOptions{}, func([]byte) error { return nil }); err != nil {
		t.Fatalf("a range of good chunks: %v", err)
	}
}

// TestEachExtent reassembles extents of a data file of 64 KiB chunks, given
// out of order: inside one chunk, across chunk boundaries, up to the end,
// and empty; an extent past the end is refused.
func TestEachExtent(t *testing.T) {
	s := mustStore(t)
	data, _, m := commitFiveChunks(t, s, 9)
	extents := []Extent{{0, 200 << 10, 50 << 10}, {0, 10, 100}, {0, 60 << 10, 70 << 10}, {0, 250 << 10, int64(len(data)) - 250<<10}, {0, 1000, 0}}
	got := make([][]byte, len(extents))
	for k, x := range extents {
		got[k] = make([]byte, x.Size)
	}
	var mu sync.Mutex
	calls := 0
	err := s.EachExtent(context.Background(), m, extents, ReadOptions{Workers: 3}, func(k int, at int64, b []byte) error {
		mu.Lock()
		calls++
		mu.Unlock()
		if copy(got[k][at:], b) != len(b) {
			t.Errorf("extent %d: a part of %d bytes at %d runs past its end", k, len(b), at)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for k, x := range extents {
		if !bytes.Equal(got[k], data[x.Offset:x.Offset+x.Size]) {
			t.Errorf("extent %d (%d+%d) holds other bytes", k, x.Offset, x.Size)
		}
	}
	// One call per chunk an extent touches: 1 + 1 + 3 + 2, and the empty one none.
	if calls != 7 {
		t.Errorf("%d calls, want 7", calls)
	}
	if err := s.EachExtent(context.Background(), m, []Extent{{0, int64(len(data)) - 5, 6}}, ReadOptions{}, func(int, int64, []byte) error { return nil }); !errors.Is(err, ErrBadManifest) {
		t.Errorf("an extent past the end: %v", err)
	}
	if err := s.EachExtent(context.Background(), m, []Extent{{1, 0, 1}}, ReadOptions{}, func(int, int64, []byte) error { return nil }); !errors.Is(err, ErrBadManifest) {
		t.Errorf("an extent of a data file that does not exist: %v", err)
	}
}
