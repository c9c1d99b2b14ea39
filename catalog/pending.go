package catalog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/google/uuid"
	"github.com/stasis-ckpt/stasis/internal/trace"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// Pending is a checkpoint being written into the staging area. Its writer
// holds an exclusive lock on staging/<id>.lock for its whole life, which is
// how gc tells a live writer from a dead one.
type Pending struct {
	// Manifest is filled by the writer: Files, Entries and Meta. Commit
	// sets the totals.
	Manifest Manifest

	store *Store
	dir   string
	lock  *os.File
	done  bool
	// imported holds the manifest, byte for byte, of a checkpoint made
	// elsewhere (BeginImport): Commit writes it as it is and lists the
	// checkpoint only if its ID is still free.
	imported []byte
}

// Begin starts a checkpoint of kind for job at step.
func (s *Store) Begin(kind Kind, job string, step int64, tags map[string]string) (*Pending, error) {
	if !kind.valid() {
		return nil, fmt.Errorf("%w: unknown kind %q", ErrInvalid, kind)
	}
	if err := ValidateJob(job); err != nil {
		return nil, err
	}
	if err := ValidateTags(tags); err != nil {
		return nil, err
	}
	host, err := os.Hostname()
	if err != nil {
		host = "unknown"
	}
	id := uuid.NewString()
	dir := s.path(stagingDir, id)
	lock, err := lockFile(dir+lockSuffix, true)
	if err != nil {
		return nil, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		lock.Close()
		os.Remove(dir + lockSuffix)
		return nil, fmt.Errorf("create staging directory: %w", err)
	}
	return &Pending{
		Manifest: Manifest{
			Format:  FormatVersion,
			ID:      id,
			Kind:    kind,
			Job:     job,
			Step:    step,
			Created: time.Now().UTC(),
			Host:    host,
			Tags:    tags,
		},
		store: s,
		dir:   dir,
		lock:  lock,
	}, nil
}

// BeginImport stages a checkpoint made elsewhere under its own ID and
// manifest (the file's bytes, which ParseManifest checks). The caller
// writes the data files the manifest names into Path(name) and commits;
// Commit checks their sizes, writes the manifest unchanged and lists the
// checkpoint. An ID this store already has (listed, on disk, being
// removed, or being imported by another process) is refused with
// ErrExists, and nothing is created.
func (s *Store) BeginImport(manifest []byte) (*Pending, error) {
	m, err := ParseManifest(manifest)
	if err != nil {
		return nil, err
	}
	if err := s.idFree(m.ID); err != nil {
		return nil, err
	}
	dir := s.path(stagingDir, m.ID)
	lock, err := lockFile(dir+lockSuffix, false)
	if err != nil {
		return nil, err
	}
	if lock == nil {
		return nil, fmt.Errorf("%w: %s is being written into this store by another process", ErrExists, m.ID)
	}
	// A staging directory nobody holds is a dead writer's: gc would
	// remove it, and so may we, holding its lock.
	if err := s.removeIn(stagingDir, m.ID); err == nil {
		err = os.Mkdir(dir, 0o700)
	}
	if err != nil {
		lock.Close()
		os.Remove(dir + lockSuffix)
		return nil, fmt.Errorf("create staging directory: %w", err)
	}
	return &Pending{Manifest: *m, store: s, dir: dir, lock: lock, imported: manifest}, nil
}

// idFree fails with ErrExists when the store knows id in any form.
func (s *Store) idFree(id string) error {
	var rec Record
	var listed bool
	if err := s.view(func(tx *bolt.Tx) error {
		var err error
		rec, listed, err = getRecordTx(tx, id)
		return err
	}); err != nil {
		return err
	}
	switch {
	case listed && rec.Status == StatusDeleting:
		return fmt.Errorf("%w: %s is being removed from this store (run `stasis gc`, then import again)", ErrExists, id)
	case listed:
		return fmt.Errorf("%w: %s (job %s, step %d) is already in this store", ErrExists, id, rec.Job, rec.Step)
	}
	for _, dir := range []string{s.CheckpointDir(id), s.path(trashDir, id)} {
		if _, err := os.Lstat(dir); err == nil {
			return fmt.Errorf("%w: %s exists but is not listed (run `stasis gc`)", ErrExists, dir)
		}
	}
	return nil
}

// ID is the new checkpoint's ID.
func (p *Pending) ID() string { return p.Manifest.ID }

// Path is where the data file name goes while the checkpoint is staged.
func (p *Pending) Path(name string) string { return filepath.Join(p.dir, name) }

// Commit makes the checkpoint complete: it checks the data files against the
// manifest, writes and fsyncs the manifest, fsyncs the staging directory,
// renames it into checkpoints/, fsyncs that, and lists the checkpoint in the
// index. Before the rename a crash leaves a staging directory that gc
// removes; after it the checkpoint is complete, and gc indexes it if the
// crash came before the index did. If the index cannot be updated, the
// checkpoint is removed again and the error returned: a failed Commit leaves
// no checkpoint, and no staging directory either (Abort after Commit does
// nothing).
func (p *Pending) Commit() (_ *Record, err error) {
	if p.done {
		return nil, errors.New("catalog: Commit after Commit or Abort")
	}
	defer func() {
		if err != nil {
			p.store.removeIn(stagingDir, filepath.Base(p.dir))
		}
		p.release()
	}()
	m := &p.Manifest
	m.Bytes, m.StoredBytes = 0, 0
	for _, f := range m.Files {
		st, err := os.Stat(p.Path(f.Name))
		if err != nil {
			return nil, fmt.Errorf("data file %s: %w", f.Name, err)
		}
		if st.Size() != f.Size {
			return nil, fmt.Errorf("data file %s has %d bytes, its table says %d", f.Name, st.Size(), f.Size)
		}
		m.Bytes += f.RawSize
		m.StoredBytes += f.Size
	}
	data := p.imported
	if data == nil {
		if data, err = m.Marshal(); err != nil {
			return nil, err
		}
	}
	crashPoint("before-manifest")
	if err := writeFileSync(p.Path(manifestName), data); err != nil {
		return nil, err
	}
	if err := syncDir(p.dir); err != nil {
		return nil, err
	}
	trace.Mark("catalog: manifest durable")
	crashPoint("before-rename")
	final := p.store.CheckpointDir(m.ID)
	if err := os.Rename(p.dir, final); err != nil {
		if p.imported != nil && (errors.Is(err, os.ErrExist) || errors.Is(err, unix.ENOTEMPTY)) {
			return nil, fmt.Errorf("%w: checkpoint %s appeared in this store during the import", ErrExists, m.ID)
		}
		return nil, fmt.Errorf("move checkpoint into place: %w", err)
	}
	// From here on the directory is under checkpoints/: the deferred
	// RemoveAll of p.dir finds nothing, and only unlist may take it away.
	if err := syncDir(filepath.Dir(final)); err != nil {
		return nil, p.unlist(err)
	}
	trace.Mark("catalog: checkpoint moved into place")
	crashPoint("before-index")
	rec := recordOf(m)
	put := p.store.putRecord
	if p.imported != nil {
		put = p.store.putNewRecord
	}
	if err := put(rec); err != nil {
		// A damaged catalog was rebuilt from the manifests, this
		// checkpoint's among them: it is listed, and complete.
		if errors.Is(err, ErrDamaged) {
			if got, gerr := p.store.Get(m.ID); gerr == nil && got.Created.Equal(rec.Created) {
				return &rec, nil
			}
		}
		return nil, p.unlist(err)
	}
	trace.Mark("catalog: indexed")
	return &rec, nil
}

// unlist takes back a checkpoint that was renamed into checkpoints/ but
// could not be listed (cause), unless a record points to it by now: a
// directory a record names is never deleted. gc does not list a
// checkpoint whose staging lock is held, which p holds, so a record here
// is one that existed before (an ID being removed, which gc finishes), or
// one a rebuild of the catalog put (it lists what it finds complete).
func (p *Pending) unlist(cause error) error {
	id := p.Manifest.ID
	trash := p.store.path(trashDir, id)
	var listed bool
	err := p.store.update(func(tx *bolt.Tx) error {
		_, ok, err := getRecordTx(tx, id)
		if err != nil || ok {
			listed = ok
			return err
		}
		if err := os.Rename(p.store.CheckpointDir(id), trash); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return syncDir(p.store.path(checkpointsDir))
	})
	switch {
	case listed:
		return fmt.Errorf("checkpoint %s written, but a record with its ID appeared meanwhile, so it was left to that record: %w", id, cause)
	case err != nil:
		// The index cannot be read either (it stays locked): nobody but
		// p lists this ID while p holds its staging lock, so the
		// directory is still unlisted.
		if derr := p.store.discard(id); derr != nil {
			return fmt.Errorf("checkpoint %s written but not listed, and not removed either (run `stasis gc`): %w", id, cause)
		}
	default:
		p.store.removeIn(trashDir, id)
	}
	return fmt.Errorf("checkpoint %s written but not listed, so removed again: %w", id, cause)
}

// Abort drops the staged checkpoint and everything written for it.
func (p *Pending) Abort() {
	if p.done {
		return
	}
	p.store.removeIn(stagingDir, filepath.Base(p.dir))
	p.release()
}

func (p *Pending) release() {
	p.done = true
	os.Remove(p.dir + lockSuffix)
	p.lock.Close()
}

// writeFileSync creates name (it must not exist), writes data and fsyncs it.
func writeFileSync(name string, data []byte) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("fsync %s: %w", name, err)
	}
	return f.Close()
}
