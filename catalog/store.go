package catalog

import (
	"errors"
	"fmt"
	"github.com/stasis-ckpt/stasis/internal/atomicfile"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"
)

// Names inside the store root.
const (
	indexName       = "catalog.db"
	checkpointsDir  = "checkpoints"
	stagingDir      = "staging"
	trashDir        = "trash"
	cacheDir        = "cache"
	manifestName    = "manifest"
	lockSuffix      = ".lock"
	defaultLockWait = 10 * time.Second
)

// Options configure a Store.
type Options struct {
	// LockTimeout bounds how long an operation waits for the index lock
	// held by another process; 10 s when zero.
	LockTimeout time.Duration
	// AllowUnsafe accepts a store that another user owns or that others
	// may write (so does AllowUnsafeEnv); links in its structure are
	// refused all the same.
	AllowUnsafe bool
	// NoIndex leaves the index (catalog.db) unopened: for Rebuild, which
	// replaces it without reading it.
	NoIndex bool
}

// Store is a checkpoint store rooted at one directory.
type Store struct {
	Root string
	opts Options
}

// DefaultHome is where the store lives when neither $STASIS_HOME nor --home
// says otherwise: /var/lib/stasis for root, ~/.local/share/stasis for others.
func DefaultHome() (string, error) {
	if os.Geteuid() == 0 {
		return "/var/lib/stasis", nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no home directory to put the store in (set STASIS_HOME or --home): %w", err)
	}
	return filepath.Join(home, ".local", "share", "stasis"), nil
}

// Open opens the store at root, creating its directories (mode 0700) and its
// index when they do not exist. A store that is not this user's alone, or
// whose structure holds a link, is refused with an error wrapping
// ErrUnsafe (confine.go).
func Open(root string, o Options) (*Store, error) {
	if o.LockTimeout <= 0 {
		o.LockTimeout = defaultLockWait
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	s := &Store{Root: abs, opts: o}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("create store directory: %w", err)
	}
	if err := s.checkStore(); err != nil {
		return nil, err
	}
	for _, dir := range []string{s.path(checkpointsDir), s.path(stagingDir), s.path(trashDir)} {
		if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("create store directory: %w", err)
		}
	}
	if o.NoIndex {
		return s, nil
	}
	if err := s.initIndex(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Store) path(parts ...string) string {
	return filepath.Join(append([]string{s.Root}, parts...)...)
}

// CheckpointDir is the directory of a complete checkpoint.
func (s *Store) CheckpointDir(id string) string { return s.path(checkpointsDir, id) }

// CacheDir is where data that can be computed again (the hashes of the
// files a process maps) is kept, cache/<name> in the store. Whoever
// writes there creates it.
func (s *Store) CacheDir(name string) string { return s.path(cacheDir, name) }

// ReadManifest reads and checks the manifest of a complete checkpoint.
func (s *Store) ReadManifest(id string) (*Manifest, error) {
	m, _, err := s.readManifestFile(id)
	return m, err
}

// readManifestFile reads and checks the manifest of a complete checkpoint,
// and returns its bytes too.
func (s *Store) readManifestFile(id string) (*Manifest, []byte, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, nil, fmt.Errorf("%w: %q is not a checkpoint ID", ErrNotFound, id)
	}
	file := filepath.Join(s.CheckpointDir(id), manifestName)
	data, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("%w: %s has no manifest", ErrNotFound, id)
	}
	if err != nil {
		return nil, nil, err
	}
	return checkManifestFile(id, file, data)
}

// checkManifestFile parses and checks the bytes of checkpoint id's
// manifest, read from file.
func checkManifestFile(id, file string, data []byte) (*Manifest, []byte, error) {
	m, err := ParseManifest(data)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", file, err)
	}
	if m.ID != id {
		return nil, nil, fmt.Errorf("%s: %w: it names checkpoint %s", file, ErrBadManifest, m.ID)
	}
	return m, data, nil
}

// syncDir makes a directory's entries (new files, renames) durable.
var syncDir = atomicfile.SyncDir

// lockFile opens (creating) and flocks path exclusively. With wait false it
// returns (nil, nil) when another process holds the lock. After locking it
// checks that path still names the file it locked: gc removes lock files
// it can lock, and a lock on a removed file protects nothing, so it retries.
//
// It never follows a link at path (O_NOFOLLOW): a lock file is the
// store's own.
func lockFile(path string, wait bool) (*os.File, error) {
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return nil, err
		}
		how := unix.LOCK_EX
		if !wait {
			how |= unix.LOCK_NB
		}
		if err := unix.Flock(int(f.Fd()), how); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, nil
			}
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		held, err1 := f.Stat()
		named, err2 := os.Stat(path)
		if err1 == nil && err2 == nil && os.SameFile(held, named) {
			return f, nil
		}
		f.Close()
	}
}

// CrashPoint is crashPoint for the packages that write through the store
// (a load's unpacking, an export's stream).
func CrashPoint(point string) { crashPoint(point) }

// crashPoint kills the process when STASIS_CRASH_AT names point. It exists
// for the crash tests, which need a process to die at exactly one step of a
// protocol, as it would on a power cut or kill -9.
//
// STASIS_HOLD_AT=point:FIFO instead stops the process there until another
// process has opened the named pipe FIFO for writing and closed it again,
// so that a test can act while a writer is held at exactly that step.
func crashPoint(point string) {
	if os.Getenv("STASIS_CRASH_AT") == point {
		_ = unix.Kill(os.Getpid(), unix.SIGKILL)
		select {}
	}
	if at, fifo, ok := strings.Cut(os.Getenv("STASIS_HOLD_AT"), ":"); ok && at == point {
		if f, err := os.Open(fifo); err == nil {
			_, _ = io.Copy(io.Discard, f)
			f.Close()
		}
	}
}
