package catalog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/stasis-ckpt/stasis/gdswriter"
)

// ReadOptions configure reading a checkpoint's data.
type ReadOptions struct {
	Workers  int
	NoDirect bool
	// Progress is called with raw byte counts as chunks are delivered.
	Progress func(rawBytes int64)
	// Pin registers EachChunk's buffers with a device driver (see
	// gdswriter.ReadOptions).
	Pin gdswriter.Pinning
}

// OpenData opens data file f of a complete checkpoint for reading, after
// checking its size against the manifest: StreamFile, EachChunk and the
// like use it, and so do readers that go to the chunks themselves
// (straight into device memory). The caller closes it.
func (s *Store) OpenData(m *Manifest, f DataFile, noDirect bool) (*gdswriter.Reader, error) {
	path := filepath.Join(s.CheckpointDir(m.ID), f.Name)
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%w: data file %s: %v", gdswriter.ErrCorrupt, path, err)
	}
	if st.Size() != f.Size {
		return nil, fmt.Errorf("%w: data file %s has %d bytes, the manifest says %d", gdswriter.ErrCorrupt, path, st.Size(), f.Size)
	}
	return gdswriter.OpenReader(path, noDirect)
}

// StreamFile reads data file f of a complete checkpoint, verifying every
// chunk, and calls fn with the decoded chunks in order. Bad data comes back
// as an error that wraps gdswriter.ErrCorrupt and names the file and chunk.
func (s *Store) StreamFile(ctx context.Context, m *Manifest, f DataFile, o ReadOptions, fn func(i int, raw []byte) error) error {
	r, err := s.OpenData(m, f, o.NoDirect)
	if err != nil {
		return err
	}
	defer r.Close()
	return r.Stream(ctx, f.Chunks, gdswriter.ReadOptions{Workers: o.Workers, Progress: o.Progress}, fn)
}

// StreamRange streams bytes [off, off+n) of data file f's decoded stream
// to fn in order, in pieces, reading, verifying and decoding only the
// chunks that hold them (several at once, ahead of fn). Bad data comes
// back as an error that names the file and the chunk's index in f.
func (s *Store) StreamRange(ctx context.Context, m *Manifest, f DataFile, off, n int64, o ReadOptions, fn func(b []byte) error) error {
	if off < 0 || n < 0 || off+n > f.RawSize {
		return fmt.Errorf("%w: range %d+%d outside data file %s (%d bytes)", ErrBadManifest, off, n, f.Name, f.RawSize)
	}
	if n == 0 {
		return nil
	}
	first, last := int(off/f.ChunkSize), int((off+n-1)/f.ChunkSize)
	r, err := s.OpenData(m, f, o.NoDirect)
	if err != nil {
		return err
	}
	defer r.Close()
	workers := o.Workers
	if workers <= 0 {
		workers = gdswriter.DefaultWorkers()
	}
	ro := gdswriter.ReadOptions{Workers: min(workers, last-first+1), Progress: o.Progress}
	err = r.Stream(ctx, f.Chunks[first:last+1], ro, func(i int, raw []byte) error {
		start := int64(first+i) * f.ChunkSize
		lo, hi := max(off, start), min(off+n, start+int64(len(raw)))
		return fn(raw[lo-start : hi-start])
	})
	var ce *gdswriter.ChunkError
	if errors.As(err, &ce) {
		ce.Index += first
	}
	return err
}

// EachChunk reads data file f of a complete checkpoint like StreamFile, but
// calls fn for the chunks in any order, from several goroutines at once.
func (s *Store) EachChunk(ctx context.Context, m *Manifest, f DataFile, o ReadOptions, fn func(i int, raw []byte) error) error {
	return s.EachChunkOf(ctx, m, f, nil, o, fn)
}

// EachChunkOf is EachChunk for only the chunks whose indexes are listed
// (all of them when indexes is nil).
func (s *Store) EachChunkOf(ctx context.Context, m *Manifest, f DataFile, indexes []int, o ReadOptions, fn func(i int, raw []byte) error) error {
	chunks := f.Chunks
	if indexes != nil {
		chunks = make([]gdswriter.Chunk, len(indexes))
		for k, i := range indexes {
			if i < 0 || i >= len(f.Chunks) {
				return fmt.Errorf("%w: data file %s has no chunk %d", ErrBadManifest, f.Name, i)
			}
			chunks[k] = f.Chunks[i]
		}
	}
	r, err := s.OpenData(m, f, o.NoDirect)
	if err != nil {
		return err
	}
	defer r.Close()
	index := func(k int) int {
		if indexes == nil {
			return k
		}
		return indexes[k]
	}
	err = r.ForEach(ctx, chunks, gdswriter.ReadOptions{Workers: o.Workers, Progress: o.Progress, Pin: o.Pin}, func(k int, raw []byte) error {
		return fn(index(k), raw)
	})
	var ce *gdswriter.ChunkError
	if errors.As(err, &ce) && indexes != nil {
		ce.Index = index(ce.Index)
	}
	return err
}

// Extent is the range [Offset, Offset+Size) of data file File's decoded
// stream.
type Extent struct {
	File         int
	Offset, Size int64
}

// EachExtent reads, verifies and decodes only the chunks that hold the
// extents (several at once, like EachChunkOf) and calls fn for every part
// of an extent a chunk holds: the extent's index in extents, where the
// part begins within the extent, and its bytes. fn runs on several
// goroutines at once, in no order. Extents of one data file must not
// overlap; empty ones are passed over.
func (s *Store) EachExtent(ctx context.Context, m *Manifest, extents []Extent, o ReadOptions, fn func(k int, at int64, b []byte) error) error {
	byFile := map[int][]int{}
	for k, x := range extents {
		if x.File < 0 || x.File >= len(m.Files) || x.Offset < 0 || x.Size < 0 || x.Offset+x.Size > m.Files[x.File].RawSize {
			return fmt.Errorf("%w: extent %d+%d of data file %d is outside the checkpoint's data", ErrBadManifest, x.Offset, x.Size, x.File)
		}
		if x.Size > 0 {
			byFile[x.File] = append(byFile[x.File], k)
		}
	}
	for fi, df := range m.Files {
		of := byFile[fi]
		if len(of) == 0 {
			continue
		}
		sort.Slice(of, func(i, j int) bool { return extents[of[i]].Offset < extents[of[j]].Offset })
		var needed []int
		covered := 0
		for _, k := range of {
			x := extents[k]
			first, last := int(x.Offset/df.ChunkSize), int((x.Offset+x.Size-1)/df.ChunkSize)
			for i := max(first, covered); i <= last; i++ {
				needed = append(needed, i)
			}
			covered = max(covered, last+1)
		}
		if len(needed) == len(df.Chunks) {
			needed = nil
		}
		err := s.EachChunkOf(ctx, m, df, needed, o, func(i int, raw []byte) error {
			start := int64(i) * df.ChunkSize
			end := start + int64(len(raw))
			// The first extent that ends after this chunk starts.
			j := sort.Search(len(of), func(j int) bool { x := extents[of[j]]; return x.Offset+x.Size > start })
			for ; j < len(of) && extents[of[j]].Offset < end; j++ {
				x := extents[of[j]]
				lo, hi := max(x.Offset, start), min(x.Offset+x.Size, end)
				if err := fn(of[j], lo-x.Offset, raw[lo-start:hi-start]); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// AllZero says whether b holds nothing but zeros, comparing a block at a
// time (bytes.Equal is vectorised).
func AllZero(b []byte) bool {
	for len(b) > 0 {
		n := min(len(b), len(zeroBlock))
		if !bytes.Equal(b[:n], zeroBlock[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}

var zeroBlock [4096]byte

// ReadFileInto reads the whole decoded stream of data file f into dst
// (exactly f.RawSize bytes), verifying every chunk, with chunks read and
// decoded in parallel straight into their place.
func (s *Store) ReadFileInto(ctx context.Context, m *Manifest, f DataFile, dst []byte, o ReadOptions) error {
	r, err := s.OpenData(m, f, o.NoDirect)
	if err != nil {
		return err
	}
	defer r.Close()
	return r.ReadInto(ctx, f.Chunks, f.ChunkSize, dst, gdswriter.ReadOptions{Workers: o.Workers, Progress: o.Progress})
}

// Verify re-reads a complete checkpoint: the manifest's checksum and
// structure, then every chunk of every data file (stored checksum, decoding,
// decoded checksum).
func (s *Store) Verify(ctx context.Context, id string, o ReadOptions) (*Manifest, error) {
	m, err := s.ReadManifest(id)
	if err != nil {
		return nil, err
	}
	for _, f := range m.Files {
		if err := s.StreamFile(ctx, m, f, o, func(int, []byte) error { return nil }); err != nil {
			return m, err
		}
	}
	return m, nil
}
