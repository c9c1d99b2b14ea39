package catalog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/stasis-ckpt/stasis/gdswriter"
)

// What the remote tier (package remote) needs of the store: a complete
// checkpoint's manifest bytes and its data files read back checked, and,
// for a pull, the import's own staging and verification (BeginImport,
// Pending.ImportData, Commit), so that a checkpoint fetched from an
// object store is checked exactly as an imported stream is before it is
// listed.

// MaxManifestSize is the largest manifest a reader accepts.
const MaxManifestSize = maxManifestSize

// ManifestFile reads and checks the manifest of complete checkpoint id,
// and returns its bytes as stored too.
func (s *Store) ManifestFile(id string) (*Manifest, []byte, error) {
	return s.readManifestFile(id)
}

// RecordOf is the index record a complete checkpoint with manifest m
// has.
func RecordOf(m *Manifest) Record { return recordOf(m) }

// OpenChecked opens data file f of complete checkpoint m for reading its
// stored bytes front to back, as an export sends them: each extent is
// checked against its chunk's CRC32C before any of its bytes are
// returned, and a read past a bad extent fails with a
// *gdswriter.ChunkError (wrapping gdswriter.ErrCorrupt).
func (s *Store) OpenChecked(m *Manifest, f DataFile) (io.ReadCloser, error) {
	name := filepath.Join(s.CheckpointDir(m.ID), f.Name)
	file, err := os.Open(name)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: data file %s is missing", gdswriter.ErrCorrupt, name)
	}
	if err != nil {
		return nil, err
	}
	if st, err := file.Stat(); err != nil || st.Size() != f.Size {
		file.Close()
		return nil, fmt.Errorf("%w: data file %s does not have the %d bytes the manifest says", gdswriter.ErrCorrupt, name, f.Size)
	}
	return &checkedReader{file: file, name: name, f: f, order: extentsInFileOrder(f), buf: make([]byte, maxExtent(f))}, nil
}

type checkedReader struct {
	file  *os.File
	name  string
	f     DataFile
	order []int
	next  int    // index into order of the next extent to read
	buf   []byte // the current extent
	rest  []byte // what of it is not returned yet
}

func (r *checkedReader) Read(p []byte) (int, error) {
	for len(r.rest) == 0 {
		if r.next == len(r.order) {
			return 0, io.EOF
		}
		i := r.order[r.next]
		c := r.f.Chunks[i]
		extent := r.buf[:c.Extent()]
		if _, err := r.file.ReadAt(extent, c.Offset); err != nil {
			return 0, fmt.Errorf("read %s: %w", r.name, err)
		}
		if err := c.CheckStored(extent); err != nil {
			return 0, &gdswriter.ChunkError{Path: r.name, Index: i, Offset: c.Offset, Reason: err.Error()}
		}
		r.rest = extent
		r.next++
	}
	n := copy(p, r.rest)
	r.rest = r.rest[n:]
	return n, nil
}

func (r *checkedReader) Close() error { return r.file.Close() }

// ImportData writes data file name of a checkpoint staged by BeginImport
// from r, which gives its bytes as stored, verifying every chunk (stored
// CRC, decoding, decoded CRC) as Import does; r must end there. where
// names r's source in errors. Commit lists the checkpoint once every
// data file is in.
func (p *Pending) ImportData(ctx context.Context, r io.Reader, name, where string, o TransferOptions) error {
	if p.imported == nil {
		return errors.New("catalog: ImportData on a checkpoint not begun by BeginImport")
	}
	var f *DataFile
	for i := range p.Manifest.Files {
		if p.Manifest.Files[i].Name == name {
			f = &p.Manifest.Files[i]
		}
	}
	if f == nil {
		return fmt.Errorf("%w: checkpoint %s has no data file %s", ErrInvalid, p.Manifest.ID, name)
	}
	if err := importData(ctx, r, *f, p.Path(f.Name), o); err != nil {
		var ce *gdswriter.ChunkError
		if errors.As(err, &ce) {
			ce.Path = where
		}
		return err
	}
	if n, err := r.Read(make([]byte, 1)); n != 0 || (err != nil && !errors.Is(err, io.EOF)) {
		if err != nil && n == 0 {
			return err
		}
		return fmt.Errorf("%w: %s holds more than the %d bytes of its chunks' extents", gdswriter.ErrCorrupt, where, f.Size)
	}
	return nil
}
