package catalog

import (
	"archive/tar"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/google/uuid"
	"github.com/stasis-ckpt/stasis/gdswriter"
	"golang.org/x/sys/unix"
)

// An export is one tar stream (docs/format.md, "Export streams"): the
// entry <id>/manifest first, then one entry <id>/<name> per data file in
// the manifest's order, each a regular file holding the data file's bytes
// as stored, then the end-of-archive marker. Nothing else: no directories,
// no links, no other names.

// endOfArchive is tar's end marker: two 512-byte blocks of zeros.
const (
	tarBlock     = 512
	endOfArchive = 2 * tarBlock
)

// TransferOptions configure Export and Import.
type TransferOptions struct {
	// Manifest, when set, is called once the manifest has been read and
	// checked, before any data moves (to size a progress bar).
	Manifest func(m *Manifest)
	// Progress, when set, is called with stored byte counts as data
	// files move.
	Progress func(storedBytes int64)
	// Workers verify chunks at once during an import;
	// gdswriter.DefaultWorkers() when zero.
	Workers int
}

// Export writes checkpoint id to w as one export stream. Every byte is
// checked as it is read: the manifest's SHA-256, and each extent of each
// data file against its chunk's CRC32C. A failed check stops the export
// with an error that wraps gdswriter.ErrCorrupt or ErrBadManifest; what was
// written before it is not a valid stream (it lacks the end marker).
//
// The checkpoint's directory is opened once and its files relative to it,
// so a removal (its rename into trash/) does not disturb a running
// export; if files the export has not opened yet are deleted meanwhile,
// it fails with an error wrapping ErrNotFound.
func (s *Store) Export(ctx context.Context, id string, w io.Writer, o TransferOptions) (*Manifest, error) {
	tw := tar.NewWriter(w)
	m, err := s.exportOne(ctx, id, tw, o, true)
	if err != nil {
		return nil, err
	}
	if m.Kind == KindJob {
		// A job checkpoint: its manifest first (it tells the reader what
		// follows), then each rank's part in rank order; import commits
		// the job checkpoint last.
		jm, err := ReadJobMeta(m)
		if err != nil {
			return nil, err
		}
		for _, p := range jm.Parts {
			if _, err := s.exportOne(ctx, p.ID, tw, o, false); err != nil {
				return nil, fmt.Errorf("job checkpoint %s: rank %d's part: %w", id, p.Rank, err)
			}
		}
	}
	return m, tw.Close()
}

// exportOne writes checkpoint id's manifest and data files into tw. A job
// checkpoint's parts are exported only through their job checkpoint
// (first), and a part's manifest must be the one its job names.
func (s *Store) exportOne(ctx context.Context, id string, tw *tar.Writer, o TransferOptions, first bool) (*Manifest, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, fmt.Errorf("%w: %q is not a checkpoint ID", ErrNotFound, id)
	}
	dir, err := os.Open(s.CheckpointDir(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	mf, err := s.openForExport(dir, id, manifestName)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s has no manifest", ErrNotFound, id)
	}
	if err != nil {
		return nil, err
	}
	manifest, err := io.ReadAll(io.LimitReader(mf, maxManifestSize+tarBlock))
	mf.Close()
	if err != nil {
		return nil, err
	}
	m, manifest, err := checkManifestFile(id, filepath.Join(s.CheckpointDir(id), manifestName), manifest)
	if err != nil {
		return nil, err
	}
	if _, isPart := PartOf(m.Tags); isPart && first && m.Kind == KindTensors {
		return nil, fmt.Errorf("%w: %s is one rank's part of a job checkpoint: export the job checkpoint (its parts go with it)", ErrInvalid, id)
	}
	if m.Kind == KindJob {
		if _, _, err := s.JobParts(id); err != nil {
			return nil, err
		}
	}
	if o.Manifest != nil && first {
		o.Manifest(m)
	}
	header := func(name string, size int64) *tar.Header {
		return &tar.Header{Typeflag: tar.TypeReg, Name: m.ID + "/" + name, Size: size, Mode: 0o600, ModTime: m.Created}
	}
	if err := tw.WriteHeader(header(manifestName, int64(len(manifest)))); err != nil {
		return nil, err
	}
	if _, err := tw.Write(manifest); err != nil {
		return nil, err
	}
	crashPoint("export-manifest-written")
	for _, f := range m.Files {
		if err := tw.WriteHeader(header(f.Name, f.Size)); err != nil {
			return nil, err
		}
		if err := s.exportData(ctx, dir, m, f, tw, o.Progress); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// extentsInFileOrder returns a data file's chunk indexes in the order of
// their extents in the file, which the manifest's checks guarantee tile it.
func extentsInFileOrder(f DataFile) []int {
	order := make([]int, len(f.Chunks))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(f.Chunks[a].Offset, f.Chunks[b].Offset) })
	return order
}

// maxExtent is the largest extent of a data file.
func maxExtent(f DataFile) int64 {
	n := int64(gdswriter.Alignment)
	for _, c := range f.Chunks {
		n = max(n, c.Extent())
	}
	return n
}

// exportData copies data file f of a complete checkpoint to w, extent by
// extent, checking each against its chunk's stored CRC.
func (s *Store) exportData(ctx context.Context, dir *os.File, m *Manifest, f DataFile, w io.Writer, progress func(int64)) error {
	name := filepath.Join(s.CheckpointDir(m.ID), f.Name)
	file, err := s.openForExport(dir, m.ID, f.Name)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: data file %s: %v", gdswriter.ErrCorrupt, name, err)
	}
	if err != nil {
		return err
	}
	defer file.Close()
	if st, err := file.Stat(); err != nil || st.Size() != f.Size {
		return fmt.Errorf("%w: data file %s does not have the %d bytes the manifest says", gdswriter.ErrCorrupt, name, f.Size)
	}
	buf := make([]byte, maxExtent(f))
	for _, i := range extentsInFileOrder(f) {
		if err := ctx.Err(); err != nil {
			return err
		}
		c := f.Chunks[i]
		extent := buf[:c.Extent()]
		if _, err := file.ReadAt(extent, c.Offset); err != nil {
			return fmt.Errorf("read %s: %w", name, err)
		}
		if err := c.CheckStored(extent); err != nil {
			return &gdswriter.ChunkError{Path: name, Index: i, Offset: c.Offset, Reason: err.Error()}
		}
		if _, err := w.Write(extent); err != nil {
			return err
		}
		if progress != nil {
			progress(c.Extent())
		}
	}
	return nil
}

// openForExport opens name in checkpoint id's directory dir. A file that
// is missing because the checkpoint was removed since dir was opened (dir
// is no longer checkpoints/<id>) is reported as removed, wrapping
// ErrNotFound; one missing from a checkpoint still in place wraps
// os.ErrNotExist.
func (s *Store) openForExport(dir *os.File, id, name string) (*os.File, error) {
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err == nil {
		return os.NewFile(uintptr(fd), filepath.Join(s.CheckpointDir(id), name)), nil
	}
	if !errors.Is(err, unix.ENOENT) {
		return nil, fmt.Errorf("open %s: %w", filepath.Join(s.CheckpointDir(id), name), err)
	}
	held, herr := dir.Stat()
	here, serr := os.Stat(s.CheckpointDir(id))
	if herr == nil && serr == nil && os.SameFile(held, here) {
		return nil, fmt.Errorf("%s: %w", filepath.Join(s.CheckpointDir(id), name), os.ErrNotExist)
	}
	return nil, fmt.Errorf("%w: %s was removed during the export", ErrNotFound, id)
}

// Import reads an export stream from r and adds its checkpoint to the
// store under its own ID. The checkpoint is staged and committed by the
// commit protocol, and listed only once every check has passed: the
// stream's shape (regular files only, the expected names in the expected
// order, sizes as the manifest says, the end marker and nothing after
// it), the manifest's SHA-256 and structure, and every chunk of every data
// file (stored CRC, decoding, decoded CRC). On any failure nothing is
// listed and nothing is left (a killed import leaves a staging directory
// that gc removes). Errors wrap ErrBadStream, ErrBadManifest,
// gdswriter.ErrCorrupt or ErrExists.
//
// Import ends: every read first checks ctx (so a canceled import stops
// even while the stream keeps coming), every entry must hold exactly the
// bytes its header and the manifest declare, and at most maxTrailing
// bytes of zeros may follow the end-of-archive marker. A reader that
// blocks is the caller's to unblock on cancellation (the CLI sets a read
// deadline on its file).
func (s *Store) Import(ctx context.Context, r io.Reader, o TransferOptions) (*Record, error) {
	counted := &countingReader{r: r, ctx: ctx}
	tr := tar.NewReader(counted)
	p, entries, err := s.importOne(ctx, tr, 0, o)
	if err != nil {
		return nil, err
	}
	committed := false
	defer func() {
		if !committed {
			p.Abort()
		}
	}()
	if p.Manifest.Kind == KindJob {
		// Its parts follow, each committed as it is complete (a part is
		// never listed on its own: a stream cut here leaves parts that
		// gc removes), and the job checkpoint is committed last.
		jm, err := ReadJobMeta(&p.Manifest)
		if err != nil {
			return nil, err
		}
		for _, want := range jm.Parts {
			pp, n, err := s.importOne(ctx, tr, entries, o)
			if err != nil {
				return nil, fmt.Errorf("job checkpoint %s: rank %d's part: %w", p.Manifest.ID, want.Rank, err)
			}
			entries += n
			sum := sha256.Sum256(pp.imported)
			if pp.Manifest.ID != want.ID || hex.EncodeToString(sum[:]) != want.ManifestSHA256 {
				pp.Abort()
				return nil, badStream("job checkpoint %s: rank %d's part is %s, not the part %s it names", p.Manifest.ID, want.Rank, pp.Manifest.ID, want.ID)
			}
			if _, err := pp.Commit(); err != nil {
				return nil, err
			}
		}
	}
	if err := expectEnd(counted); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err // the last point at which a signal stops it unlisted
	}
	rec, err := p.Commit()
	committed = true // a failed Commit removes what it staged
	return rec, err
}

// importOne reads one checkpoint of the stream, from entry first on (its
// manifest, then its data files), into a staged Pending, verifying every
// chunk; it returns the Pending, uncommitted, and the entries it read.
func (s *Store) importOne(ctx context.Context, tr *tar.Reader, first int, o TransferOptions) (*Pending, int, error) {
	hdr, err := nextEntry(tr, first)
	if err != nil {
		return nil, 0, err
	}
	id, name, err := entryName(hdr.Name, first)
	if err != nil {
		return nil, 0, err
	}
	if name != manifestName {
		return nil, 0, badStream("entry %d is %q; a checkpoint of an export starts with <id>/manifest", first, hdr.Name)
	}
	if hdr.Size > maxManifestSize {
		return nil, 0, badStream("the manifest entry declares %d bytes, more than the %d a manifest may have", hdr.Size, maxManifestSize)
	}
	manifest := make([]byte, hdr.Size)
	if _, err := io.ReadFull(tr, manifest); err != nil {
		return nil, 0, truncated(err, "in the manifest")
	}
	p, err := s.BeginImport(manifest)
	if err != nil {
		return nil, 0, err
	}
	ok := false
	defer func() {
		if !ok {
			p.Abort()
		}
	}()
	m := &p.Manifest
	if id != m.ID {
		return nil, 0, badStream("the manifest is stored under %s/ but names checkpoint %s", id, m.ID)
	}
	if o.Manifest != nil && first == 0 {
		o.Manifest(m)
	}
	for i, f := range m.Files {
		n := first + i + 1
		hdr, err := nextEntry(tr, n)
		if err != nil {
			return nil, 0, err
		}
		entryID, name, err := entryName(hdr.Name, n)
		if err != nil {
			return nil, 0, err
		}
		if entryID != m.ID || name != f.Name {
			return nil, 0, badStream("entry %d is %q; the manifest's data file %d is %s/%s", n, hdr.Name, i, m.ID, f.Name)
		}
		if hdr.Size != f.Size {
			return nil, 0, badStream("entry %s holds %d bytes; the manifest says %d", hdr.Name, hdr.Size, f.Size)
		}
		if err := importData(ctx, tr, f, p.Path(f.Name), o); err != nil {
			return nil, 0, err
		}
		// The extents tile the file, so nothing is left of the entry;
		// a reader that disagreed would have it skipped unchecked.
		if n, err := tr.Read(make([]byte, 1)); n != 0 || (err != nil && !errors.Is(err, io.EOF)) {
			if err := ctx.Err(); err != nil {
				return nil, 0, err
			}
			return nil, 0, badStream("entry %s holds more than its chunks' extents", hdr.Name)
		}
	}
	ok = true
	return p, 1 + len(m.Files), nil
}

func badStream(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadStream, fmt.Sprintf(format, args...))
}

// truncated reports a stream that ended early (or could not be read).
func truncated(err error, where string) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return badStream("the stream is truncated %s", where)
	}
	return fmt.Errorf("read the import stream %s: %w", where, err)
}

// nextEntry reads the header of entry n and refuses anything but a regular
// file.
func nextEntry(tr *tar.Reader, n int) (*tar.Header, error) {
	hdr, err := tr.Next()
	if errors.Is(err, tar.ErrInsecurePath) {
		err = nil // entryName says what is wrong with the name
	}
	switch {
	case errors.Is(err, io.EOF) && n == 0:
		return nil, badStream("the stream is empty")
	case errors.Is(err, io.EOF):
		return nil, badStream("the stream ends after entry %d; the manifest names more data files", n-1)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return nil, badStream("the stream is truncated in the header of entry %d", n)
	case errors.Is(err, tar.ErrHeader):
		return nil, badStream("entry %d: not a tar header (%v)", n, err)
	case err != nil:
		return nil, fmt.Errorf("read the import stream: %w", err)
	}
	switch hdr.Typeflag {
	case tar.TypeReg:
		return hdr, nil
	case tar.TypeSymlink, tar.TypeLink:
		return nil, badStream("entry %d (%q) is a link; an export holds regular files only", n, hdr.Name)
	case tar.TypeDir:
		return nil, badStream("entry %d (%q) is a directory; an export holds regular files only", n, hdr.Name)
	}
	return nil, badStream("entry %d (%q) is of tar type %q; an export holds regular files only", n, hdr.Name, hdr.Typeflag)
}

// entryName splits an entry's name, <id>/<name>, refusing absolute and
// climbing paths and anything deeper.
func entryName(full string, n int) (id, name string, err error) {
	switch {
	case strings.HasPrefix(full, "/"):
		return "", "", badStream("entry %d (%q) has an absolute path", n, full)
	case slices.Contains(strings.Split(full, "/"), ".."):
		return "", "", badStream("entry %d (%q) climbs out of its directory with ..", n, full)
	}
	id, name, ok := strings.Cut(full, "/")
	if _, err := uuid.Parse(id); !ok || err != nil || !ValidEntryPath(full) || path.Base(full) != name {
		return "", "", badStream("entry %d (%q) is not <checkpoint id>/<file name>", n, full)
	}
	return id, name, nil
}

// importData writes the entry being read from tr into the new data file
// path, extent by extent in file order, and verifies every chunk (stored
// CRC, decoding, decoded CRC) with several workers while the next extents
// are read.
func importData(ctx context.Context, tr io.Reader, f DataFile, path string, o TransferOptions) (err error) {
	file, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := file.Close(); err == nil {
			err = cerr
		}
	}()
	workers, size := importBuffers(f, o.Workers)
	free := make(chan []byte, workers+1)
	for range workers + 1 {
		free <- make([]byte, size)
	}
	type job struct {
		index int
		buf   []byte
	}
	jobs := make(chan job)
	var failed error
	var failOnce sync.Once
	stop := make(chan struct{})
	fail := func(err error) { failOnce.Do(func() { failed = err; close(stop) }) }
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dec := gdswriter.NewDecoder()
			for j := range jobs {
				c := f.Chunks[j.index]
				extent := j.buf[:c.Extent()]
				if _, err := c.Verify(extent, j.buf[c.Extent():], dec); err != nil {
					fail(&gdswriter.ChunkError{Path: f.Name + " (import stream)", Index: j.index, Offset: c.Offset, Reason: err.Error()})
				}
				free <- j.buf
			}
		}()
	}
	readErr := func() error {
		for _, i := range extentsInFileOrder(f) {
			if err := ctx.Err(); err != nil {
				return err
			}
			var buf []byte
			select {
			case <-stop:
				return nil // a chunk failed its checks
			case buf = <-free:
			}
			c := f.Chunks[i]
			extent := buf[:c.Extent()]
			if _, err := io.ReadFull(tr, extent); err != nil {
				return truncated(err, "in data file "+f.Name)
			}
			if _, err := file.Write(extent); err != nil {
				return fmt.Errorf("write %s: %w", path, err)
			}
			jobs <- job{index: i, buf: buf}
			if o.Progress != nil {
				o.Progress(c.Extent())
			}
		}
		return nil
	}()
	close(jobs)
	wg.Wait()
	if readErr != nil {
		return readErr
	}
	if failed != nil {
		return failed
	}
	if err := file.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", path, err)
	}
	return nil
}

// importMemory bounds the buffers of one data file's import: a manifest
// may declare chunks of up to gdswriter.MaxChunkSize, and fewer workers
// verify them rather than one such pair of buffers each.
const importMemory = 1 << 30

// importBuffers says how many workers verify f's chunks during an import
// (asked, or gdswriter.DefaultWorkers() when 0), each with a buffer of
// size bytes, and one more buffer being read into. A buffer holds the
// largest extent and the largest decoded chunk that f's chunk table
// declares (which ValidateChunks bounds by the chunk size, itself at most
// gdswriter.MaxChunkSize), not chunk_size: a manifest cannot make import
// allocate more than its chunks need, nor, with several workers, more
// than importMemory, past which fewer workers run (at least one).
func importBuffers(f DataFile, asked int) (workers int, size int64) {
	if asked <= 0 {
		asked = gdswriter.DefaultWorkers()
	}
	var raw int64
	for _, c := range f.Chunks {
		raw = max(raw, c.Raw)
	}
	size = maxExtent(f) + raw
	workers = max(1, min(asked, len(f.Chunks), int(importMemory/size)-1))
	return workers, size
}

// countingReader counts the bytes read through it, and fails every read
// once ctx is done (with ctx's error, whatever the read itself returned).
type countingReader struct {
	r   io.Reader
	ctx context.Context
	n   int64
}

func (c *countingReader) Read(b []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := c.r.Read(b)
	c.n += int64(n)
	if err != nil {
		if cerr := c.ctx.Err(); cerr != nil {
			return n, cerr
		}
	}
	return n, err
}

// maxTrailing bounds the zeros accepted after the end-of-archive marker:
// tar pads an archive to whole records (10 KiB by default, more with a
// larger blocking factor), and nothing that pads needs more than this.
const maxTrailing = 1 << 20

// expectEnd checks what follows the last data file's bytes: zero padding
// to the tar block, the end-of-archive marker, and nothing else but zeros
// (tar pads archives to whole records with zeros), at most maxTrailing
// bytes of them. A stream cut before the marker is truncated; another
// entry, any other data, or more zeros than that are refused.
func expectEnd(r *countingReader) error {
	pad := (tarBlock - r.n%tarBlock) % tarBlock
	end := make([]byte, pad+endOfArchive)
	n, err := io.ReadFull(r, end)
	if !AllZero(end[:n]) {
		return badStream("more follows the last data file; an export ends there")
	}
	if err != nil {
		return truncated(err, "before the end-of-archive marker")
	}
	buf := make([]byte, 64<<10)
	var trailing int64
	for {
		n, err := r.Read(buf)
		if !AllZero(buf[:n]) {
			return badStream("data follows the end-of-archive marker")
		}
		if trailing += int64(n); trailing > maxTrailing {
			return badStream("more than %d bytes of zeros follow the end-of-archive marker; an export ends there", maxTrailing)
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			if errors.Is(err, context.Canceled) {
				return err
			}
			return fmt.Errorf("read the import stream: %w", err)
		}
	}
}
