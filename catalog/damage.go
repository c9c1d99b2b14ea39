package catalog

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/google/uuid"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	"golang.org/x/sys/unix"
)

// The catalog is an index over the manifests, so damage to it must never
// stop a user: every use of catalog.db goes through openIndex, view and
// update, which contain what bbolt does with a damaged file (its
// assertions panic; a page past the end of a truncated file faults on
// the memory map, which debug.SetPanicOnFault turns into a panic), check
// at open what is cheap (the file holds every page its meta page counts,
// the buckets are there), and on damage move the file aside as
// catalog.db.damaged-<time> and rebuild the catalog from the manifests.
// The command that met the damage then fails with an error wrapping
// ErrDamaged that says so (the CLI's exit 19), but for a commit, whose
// checkpoint the rebuild listed: it succeeds.

// contain runs fn with memory faults turned into panics, and a panic into
// an error wrapping ErrDamaged.
func contain(what string, fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %s: %v", ErrDamaged, what, r)
		}
	}()
	return fn()
}

// openIndex opens catalog.db with bbolt, never following a link at its
// name, checks it, and returns it (the caller closes it with closeIndex).
// It retries when the file it locked was replaced meanwhile (a rebuild).
// file is the file bbolt opened.
func (s *Store) openIndex(readOnly bool) (db *bolt.DB, file *os.File, err error) {
	path := s.path(indexName)
	for {
		file = nil
		opts := &bolt.Options{Timeout: s.opts.LockTimeout, ReadOnly: readOnly,
			OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
				f, err := os.OpenFile(name, flag|unix.O_NOFOLLOW, perm)
				file = f
				return f, err
			}}
		err = contain("open", func() error {
			var err error
			db, err = bolt.Open(path, 0o600, opts)
			return err
		})
		var errno unix.Errno
		switch {
		case errors.Is(err, berrors.ErrTimeout):
			return nil, nil, fmt.Errorf("%w (waited %s for %s; another stasis may be running, or raise --lock-timeout)", ErrBusy, s.opts.LockTimeout, path)
		case errors.Is(err, ErrDamaged):
			release(file) // bbolt panicked holding it, and its lock
			return nil, nil, err
		case err != nil && (errors.As(err, new(*fs.PathError)) || errors.As(err, &errno)):
			return nil, nil, fmt.Errorf("open catalog %s: %w", path, err)
		case err != nil:
			return nil, nil, fmt.Errorf("%w: %v", ErrDamaged, err)
		}
		held, err1 := file.Stat()
		named, err2 := os.Lstat(path)
		if err1 != nil || err2 != nil || !os.SameFile(held, named) {
			closeIndex(db, file)
			continue // replaced by a rebuild while we waited for its lock
		}
		err = contain("check", func() error {
			return db.View(func(tx *bolt.Tx) error {
				if tx.Size() > held.Size() {
					return fmt.Errorf("%w: it has %d bytes, its meta page counts %d", ErrDamaged, held.Size(), tx.Size())
				}
				return nil
			})
		})
		if err != nil {
			closeIndex(db, file)
			return nil, nil, err
		}
		return db, file, nil
	}
}

// closeIndex closes db; if bbolt panics there, it closes its file (and
// so lets go of its lock) itself.
func closeIndex(db *bolt.DB, file *os.File) error {
	err := contain("close", db.Close)
	if errors.Is(err, ErrDamaged) {
		release(file)
	}
	return err
}

// release lets go of bbolt's lock on file and closes it, after bbolt
// panicked with it open. The lock is released explicitly: bbolt's memory
// map of the file keeps the open file, and so its lock, alive past the
// descriptor's close.
func release(file *os.File) {
	if file == nil {
		return
	}
	unix.Flock(int(file.Fd()), unix.LOCK_UN)
	file.Close()
}

// buckets checks that tx has the index's buckets.
func buckets(tx *bolt.Tx) error {
	for _, b := range [][]byte{bucketCheckpoints, bucketJobs} {
		if tx.Bucket(b) == nil {
			return fmt.Errorf("%w: it has no %q bucket", ErrDamaged, b)
		}
	}
	return nil
}

func (s *Store) update(fn func(tx *bolt.Tx) error) error {
	return s.withIndex(false, func(db *bolt.DB) error {
		return db.Update(func(tx *bolt.Tx) error {
			if err := buckets(tx); err != nil {
				return err
			}
			return fn(tx)
		})
	})
}

func (s *Store) view(fn func(tx *bolt.Tx) error) error {
	return s.withIndex(true, func(db *bolt.DB) error {
		return db.View(func(tx *bolt.Tx) error {
			if err := buckets(tx); err != nil {
				return err
			}
			return fn(tx)
		})
	})
}

// withIndex opens the index, runs use on it with damage contained, closes
// it, and handles damage (s.damaged).
func (s *Store) withIndex(readOnly bool, use func(db *bolt.DB) error) error {
	db, file, err := s.openIndex(readOnly)
	if err == nil {
		err = contain("read", func() error { return use(db) })
		if cerr := closeIndex(db, file); err == nil {
			err = cerr
		}
	}
	if errors.Is(err, ErrDamaged) {
		return s.damaged(err)
	}
	return err
}

// damaged moves the damaged catalog aside, rebuilds it from the
// manifests, and returns the one-line error that says so (wrapping
// ErrDamaged).
func (s *Store) damaged(cause error) error {
	path := s.path(indexName)
	why := strings.TrimPrefix(cause.Error(), ErrDamaged.Error()+": ")
	aside := fmt.Sprintf("%s.damaged-%s", path, time.Now().UTC().Format("20060102T150405.000000000Z"))
	rep, err := s.rebuild(aside)
	if err != nil {
		return fmt.Errorf("%w: %s (%s); moving it aside and rebuilding it from the manifests failed: %v (run `stasis catalog rebuild`)", ErrDamaged, path, why, err)
	}
	return fmt.Errorf("%w: %s (%s); moved it to %s and rebuilt the catalog from the manifests (%d checkpoints): run the command again", ErrDamaged, path, why, aside, rep.Indexed)
}

// RebuildReport says what Rebuild found.
type RebuildReport struct {
	Indexed int      `json:"indexed"`
	Damaged []string `json:"damaged"` // directories whose manifest could not be read, not indexed
	// Previous is where the catalog it replaced was kept.
	Previous string `json:"previous,omitempty"`
}

// Rebuild recreates the index from the manifests under checkpoints/. It
// never reads the catalog it replaces (which may be damaged): it takes
// that file's lock, writes a new catalog beside it, keeps the old one as
// catalog.db.before-rebuild and renames the new one over catalog.db, so
// readers see the old index or the new one. Processes waiting for the old
// file's lock notice it was replaced and open the new one.
func (s *Store) Rebuild() (RebuildReport, error) {
	return s.rebuild(s.path(indexName) + ".before-rebuild")
}

// rebuild is Rebuild keeping the old catalog as aside.
func (s *Store) rebuild(aside string) (RebuildReport, error) {
	var rep RebuildReport
	if err := s.checkStructure(indexName, checkpointsDir); err != nil {
		return rep, err
	}
	path := s.path(indexName)
	old, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return rep, err
	}
	defer old.Close()
	if err := s.flockWait(old); err != nil {
		return rep, err
	}
	entries, err := readStructureDir(s, checkpointsDir)
	if err != nil {
		return rep, err
	}
	var recs []Record
	for _, e := range entries {
		if _, err := uuid.Parse(e.Name()); err != nil {
			rep.Damaged = append(rep.Damaged, e.Name())
			continue
		}
		// One whose writer still holds its staging lock is listed too:
		// there is no old index to keep its record from, and its
		// writer's own listing only repeats this one.
		m, err := s.ReadManifest(e.Name())
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			rep.Damaged = append(rep.Damaged, e.Name())
			continue
		}
		recs = append(recs, recordOf(m))
	}
	tmp, err := os.CreateTemp(s.Root, indexName+".new-*")
	if err != nil {
		return rep, err
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	db, err := bolt.Open(tmp.Name(), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return rep, err
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketCheckpoints, bucketJobs} {
			if _, err := tx.CreateBucket(b); err != nil {
				return err
			}
		}
		for _, r := range recs {
			if err := putRecordTx(tx, r); err != nil {
				return err
			}
		}
		return nil
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return rep, err
	}
	if st, err := old.Stat(); err == nil && st.Size() > 0 {
		os.Remove(aside)
		if err := os.Link(path, aside); err != nil {
			return rep, fmt.Errorf("keep the old catalog: %w", err)
		}
		rep.Previous = aside
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return rep, err
	}
	if err := syncDir(s.Root); err != nil {
		return rep, err
	}
	rep.Indexed = len(recs)
	return rep, nil
}

// flockWait takes f's exclusive lock (bbolt's lock on catalog.db),
// waiting at most the lock timeout.
func (s *Store) flockWait(f *os.File) error {
	deadline := time.Now().Add(s.opts.LockTimeout)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("lock %s: %w", f.Name(), err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w (waited %s for %s; another stasis may be running, or raise --lock-timeout)", ErrBusy, s.opts.LockTimeout, f.Name())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
