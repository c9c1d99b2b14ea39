// Package fileset saves files and directories as a checkpoint of kind
// "files" and loads them back. Their bytes are packed one after another into
// a single chunked data stream (so thousands of small files cost what one
// large file does), and the manifest's entries say where each file's bytes
// lie in it.
package fileset

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/gdswriter"
	"golang.org/x/sys/unix"
)

// dataFileName is the name of the one data file of a files checkpoint.
const dataFileName = "data.0000"

// ErrSource is wrapped by errors about the paths given to Save: missing,
// unreadable, or of a kind that cannot be saved.
var ErrSource = errors.New("cannot save path")

// SaveOptions configure Save.
type SaveOptions struct {
	Job    string
	Step   int64
	Tags   map[string]string
	Writer gdswriter.WriterOptions
}

type source struct {
	entry catalog.Entry
	from  string // path on disk
}

// Plan lists what Save would store for paths, with the total bytes of
// regular files: each path is stored under its base name, directories with
// everything below them. It fails on a missing path, a name given twice, or
// a file that is neither regular, a directory nor a symlink.
func Plan(paths []string) ([]catalog.Entry, int64, error) {
	srcs, total, err := plan(paths)
	entries := make([]catalog.Entry, len(srcs))
	for i, s := range srcs {
		entries[i] = s.entry
	}
	return entries, total, err
}

func plan(paths []string) ([]source, int64, error) {
	if len(paths) == 0 {
		return nil, 0, fmt.Errorf("%w: no paths given", ErrSource)
	}
	var srcs []source
	var total int64
	roots := map[string]string{}
	for _, p := range paths {
		abs, err := filepath.Abs(p)
		if err != nil {
			return nil, 0, fmt.Errorf("%w %s: %v", ErrSource, p, err)
		}
		root := filepath.Base(abs)
		if root == "/" || root == "." {
			return nil, 0, fmt.Errorf("%w %s: give a file or directory below /", ErrSource, p)
		}
		if other, dup := roots[root]; dup {
			return nil, 0, fmt.Errorf("%w %s: %s has the same name %q; both would be stored under it", ErrSource, p, other, root)
		}
		roots[root] = p
		if err := walk(abs, root, &srcs, &total); err != nil {
			return nil, 0, err
		}
	}
	return srcs, total, nil
}

// walk adds the tree at abs to srcs, each entry's path prefixed with prefix
// ("" for paths relative to abs, and abs itself left out).
func walk(abs, prefix string, srcs *[]source, total *int64) error {
	return filepath.WalkDir(abs, func(file string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("%w %s: %w", ErrSource, file, unwrapPathError(err))
		}
		rel, _ := filepath.Rel(abs, file)
		if prefix == "" && rel == "." {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return fmt.Errorf("%w %s: %w", ErrSource, file, unwrapPathError(err))
		}
		name := path.Join(prefix, filepath.ToSlash(rel))
		mtime := info.ModTime().UTC()
		e := catalog.Entry{Path: name, Mode: uint32(info.Mode().Perm()), MTime: &mtime}
		switch {
		case info.Mode().IsRegular():
			e.Type, e.Size = catalog.EntryFile, info.Size()
			*total += e.Size
		case info.IsDir():
			e.Type = catalog.EntryDir
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(file)
			if err != nil {
				return fmt.Errorf("%w %s: %v", ErrSource, file, err)
			}
			e.Type, e.Link, e.Mode, e.MTime = catalog.EntrySymlink, target, 0, nil
		default:
			return fmt.Errorf("%w %s: a %s cannot be saved (only files, directories and symlinks)", ErrSource, file, describeMode(info.Mode()))
		}
		if !catalog.ValidEntryPath(e.Path) {
			return fmt.Errorf("%w %s: name cannot be stored", ErrSource, file)
		}
		*srcs = append(*srcs, source{entry: e, from: file})
		return nil
	})
}

func unwrapPathError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

func describeMode(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "named pipe"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeDevice != 0:
		return "device"
	}
	return "special file"
}

// Save stores paths as a new complete checkpoint and returns its record. On
// any error or cancellation nothing is left in the store but what gc
// removes, and nothing is listed.
func Save(ctx context.Context, s *catalog.Store, paths []string, o SaveOptions) (*catalog.Record, error) {
	srcs, _, err := plan(paths)
	if err != nil {
		return nil, err
	}
	p, err := s.Begin(catalog.KindFiles, o.Job, o.Step, o.Tags)
	if err != nil {
		return nil, err
	}
	if err := add(ctx, p, srcs, o.Writer); err != nil {
		p.Abort()
		return nil, err
	}
	rec, err := p.Commit()
	if err != nil {
		p.Abort()
		return nil, err
	}
	return rec, nil
}

// AddDir packs everything below dir (not dir itself) into a pending
// checkpoint of any kind, as its data file and entries, with paths relative
// to dir.
func AddDir(ctx context.Context, p *catalog.Pending, dir string, o gdswriter.WriterOptions) error {
	k, err := NewPacker(ctx, p, o)
	if err != nil {
		return err
	}
	if err := k.AddDir(dir); err != nil {
		k.Abort()
		return err
	}
	return k.Close()
}

// add writes the sources into the pending checkpoint's data file and adds
// their entries and the data file to its manifest.
func add(ctx context.Context, p *catalog.Pending, srcs []source, o gdswriter.WriterOptions) error {
	k, err := NewPacker(ctx, p, o)
	if err != nil {
		return err
	}
	if err := k.addSources(srcs); err != nil {
		k.Abort()
		return err
	}
	return k.Close()
}

// copyFile streams one file into w and checks it still has the size it had
// when planned: a file that changes while it is saved is an error, not a
// silently torn copy.
func copyFile(w *gdswriter.Writer, name string, size int64) error {
	f, err := os.Open(name)
	if err != nil {
		return fmt.Errorf("%w %s: %w", ErrSource, name, unwrapPathError(err))
	}
	defer f.Close()
	n, err := w.ReadFrom(io.LimitReader(f, size+1))
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("%w %s: it changed size while being saved (%d bytes, then %d)", ErrSource, name, size, n)
	}
	return nil
}

// LoadOptions configure Load.
type LoadOptions struct {
	Read catalog.ReadOptions
	// Skip, when set, leaves out the file entries it returns true for
	// (Unpack only): a restore that streams CRIU's memory images from the
	// store unpacks only the rest.
	Skip func(catalog.Entry) bool
}

// Load writes the entries of a files checkpoint under dir. dir must not
// exist or be empty. Everything is first written to a temporary directory
// beside it and moved into place only after every chunk has been verified,
// so a failed load leaves dir as it was, and one killed meanwhile leaves
// a hidden directory beside dir that `stasis gc` removes
// (catalog.NewOutsideDir).
func Load(ctx context.Context, s *catalog.Store, id, dir string, o LoadOptions) (*catalog.Manifest, error) {
	m, err := s.ReadManifest(id)
	if err != nil {
		return nil, err
	}
	if m.Kind != catalog.KindFiles {
		return nil, fmt.Errorf("%w: checkpoint %s is of kind %s; `stasis load` restores files checkpoints", catalog.ErrInvalid, id, m.Kind)
	}
	if err := checkTarget(dir); err != nil {
		return nil, err
	}
	// Registered in the store before it is made: gc removes what a
	// killed load leaves there.
	tmp, err := s.NewOutsideDir(dir)
	if err != nil {
		return nil, err
	}
	if err := unpack(ctx, s, m, tmp.Dir, o); err != nil {
		tmp.Done()
		return nil, err
	}
	catalog.CrashPoint("load-unpacked")
	if err := moveInto(tmp.Dir, dir); err != nil {
		tmp.Done()
		return nil, err
	}
	return m, tmp.Done()
}

// checkTarget accepts a directory that does not exist or is empty.
func checkTarget(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w: target %s: %v", catalog.ErrInvalid, dir, unwrapPathError(err))
	}
	if len(entries) > 0 {
		return fmt.Errorf("%w: target %s is not empty; load into a new or empty directory", catalog.ErrInvalid, dir)
	}
	return nil
}

// moveInto renames tmp to dir, or, when dir exists (empty), moves tmp's
// entries into it.
func moveInto(tmp, dir string) error {
	if err := os.Rename(tmp, dir); err == nil {
		return nil
	}
	entries, err := os.ReadDir(tmp)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.Rename(filepath.Join(tmp, e.Name()), filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return os.Remove(tmp)
}

// Unpack writes every entry of a complete checkpoint, of any kind, under
// root (an existing, empty directory), verifying every chunk as it goes.
// Unlike Load it writes in place: the caller owns root and removes it if
// Unpack fails.
func Unpack(ctx context.Context, s *catalog.Store, m *catalog.Manifest, root string, o LoadOptions) error {
	return unpack(ctx, s, m, root, o)
}

func unpack(ctx context.Context, s *catalog.Store, m *catalog.Manifest, root string, o LoadOptions) error {
	local := func(e catalog.Entry) string { return filepath.Join(root, filepath.FromSlash(e.Path)) }
	for _, e := range m.Entries {
		if e.Type == catalog.EntryDir {
			if err := os.MkdirAll(local(e), 0o700); err != nil {
				return err
			}
		}
	}
	var files []catalog.Entry
	for _, e := range m.Entries {
		switch e.Type {
		case catalog.EntryFile:
			if o.Skip == nil || !o.Skip(e) {
				files = append(files, e)
			}
		case catalog.EntrySymlink:
			if err := os.MkdirAll(filepath.Dir(local(e)), 0o700); err != nil {
				return err
			}
			if err := os.Symlink(e.Link, local(e)); err != nil {
				return err
			}
		}
	}
	if err := writeFiles(ctx, s, m, files, local, o); err != nil {
		return err
	}
	// Modes and times last, deepest first, so that read-only directories
	// are filled before they are closed.
	sorted := append([]catalog.Entry(nil), m.Entries...)
	sort.SliceStable(sorted, func(i, j int) bool { return strings.Count(sorted[i].Path, "/") > strings.Count(sorted[j].Path, "/") })
	for _, e := range sorted {
		if e.Type == catalog.EntrySymlink || e.Type == catalog.EntryFile && o.Skip != nil && o.Skip(e) {
			continue
		}
		if err := os.Chmod(local(e), fs.FileMode(e.Mode)); err != nil {
			return err
		}
		if e.MTime != nil {
			if err := os.Chtimes(local(e), time.Time{}, *e.MTime); err != nil {
				return err
			}
		}
	}
	return nil
}

// writeFiles creates every file entry at its final size, then reads the
// data files' chunks in parallel and writes each chunk's bytes straight to
// their places in the files they belong to. Large files are written
// through a shared mapping: parallel writes to one file serialise on its
// inode lock, page faults on a mapping do not. Byte ranges that are all zeros
// are not written: a file created at its size reads as zeros there, and
// leaving holes saves writing them (process images are often half zeros).
// Every chunk is verified before any of its bytes are written.
func writeFiles(ctx context.Context, s *catalog.Store, m *catalog.Manifest, files []catalog.Entry, local func(catalog.Entry) string, o LoadOptions) error {
	byFile := map[int][]catalog.Entry{}
	mapped := map[string][]byte{}
	defer func() {
		for _, m := range mapped {
			unix.Munmap(m)
		}
	}()
	for _, e := range files {
		f, err := os.OpenFile(local(e), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		err = f.Truncate(e.Size)
		if err == nil && e.Size >= mapThreshold {
			// Writing through a mapping cannot report a full disk (the
			// process would get SIGBUS), so the space is reserved first;
			// a file system that cannot reserve gets pwrite.
			if ferr := unix.Fallocate(int(f.Fd()), 0, 0, e.Size); ferr == nil {
				if m, merr := unix.Mmap(int(f.Fd()), 0, int(e.Size), unix.PROT_WRITE, unix.MAP_SHARED); merr == nil {
					mapped[local(e)] = m
				}
			} else if errors.Is(ferr, unix.ENOSPC) || errors.Is(ferr, unix.EDQUOT) {
				err = ferr
			}
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		if e.Size > 0 {
			byFile[e.File] = append(byFile[e.File], e)
		}
	}
	for fi, df := range m.Files {
		entries := byFile[fi]
		if len(entries) == 0 {
			continue
		}
		sort.Slice(entries, func(i, j int) bool { return entries[i].Offset < entries[j].Offset })
		for i := 1; i < len(entries); i++ {
			if entries[i].Offset < entries[i-1].Offset+entries[i-1].Size {
				return fmt.Errorf("%w: entries %s and %s overlap in data file %s", catalog.ErrBadManifest, entries[i-1].Path, entries[i].Path, df.Name)
			}
		}
		// Only the chunks that hold the entries are read (a restore
		// unpacks a few small images of a file that holds the memory
		// images too).
		extents := make([]catalog.Extent, len(entries))
		for k, e := range entries {
			extents[k] = catalog.Extent{File: e.File, Offset: e.Offset, Size: e.Size}
		}
		err := s.EachExtent(ctx, m, extents, o.Read, func(k int, off int64, b []byte) error {
			e := entries[k]
			if m, ok := mapped[local(e)]; ok {
				if !catalog.AllZero(b) {
					copy(m[off:], b)
				}
				return nil
			}
			return writeRange(local(e), b, off)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// mapThreshold is the file size from which Load writes through a mapping.
const mapThreshold = 16 << 20

// writeRange writes b at off in the file at path, skipping it when it is
// all zeros (the file was created at its size, so it reads as zeros there).
func writeRange(path string, b []byte, off int64) error {
	if catalog.AllZero(b) {
		return nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteAt(b, off)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
