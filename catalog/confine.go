package catalog

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// A store is trusted with its owner's checkpoints and acted on with its
// owner's rights (gc deletes in it, hooks named in its config.toml run as
// its owner), so it must be its owner's alone: Open refuses a store that
// another user owns or that its group or others may write (as ssh refuses
// a private key others can read), unless the owner accepts it with
// --allow-unsafe-store or AllowUnsafeEnv (never a file in the store,
// which whoever can write the store could plant). And the store's own
// structure (checkpoints/, staging/, trash/, catalog.db, ...) holds no
// symbolic link: Open refuses one, and every removal goes through the
// structural directory opened as an os.Root, checked to be the directory
// that was looked at, so no link planted later is followed out of it.

// AllowUnsafeEnv, set to a non-empty value, accepts a store that others
// may write or that another user owns (Options.AllowUnsafe).
const AllowUnsafeEnv = "STASIS_ALLOW_UNSAFE_STORE"

// ErrUnsafe is returned for a store, configuration file or hook script
// that another user owns or may write, and for a store whose structure
// holds a symbolic link. The message names the fix.
var ErrUnsafe = errors.New("unsafe store")

// structure lists the names stasis keeps in a store's root.
var structure = []string{
	checkpointsDir, stagingDir, trashDir, scratchDir, cacheDir, logsDir, loadsDir,
	"run", indexName, "config.toml",
}

// AllowsUnsafe says whether the store was opened accepting that it is not
// its user's alone (Options.AllowUnsafe, AllowUnsafeEnv): what else it
// trusts with its user's rights (config.toml's hooks) is then not checked
// either.
func (s *Store) AllowsUnsafe() bool { return s.opts.allowUnsafe() }

// allowUnsafe says whether o, or the environment, accepts a store that is
// not its user's alone.
func (o Options) allowUnsafe() bool { return o.AllowUnsafe || os.Getenv(AllowUnsafeEnv) != "" }

// CheckOwned checks that path (what it names, following links: a hook
// script may be a link into /usr/bin) is owned by this user or root and
// that neither its group nor others may write it, nor the directory it
// is in (unless that directory is sticky, as /tmp is, where others cannot
// replace a file they do not own). what names it in the error, which
// wraps ErrUnsafe and says how to fix it.
func CheckOwned(what, path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if err := ownedBy(what, path, st, true); err != nil {
		return err
	}
	dir := filepath.Dir(path)
	dst, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if dst.Mode()&os.ModeSticky != 0 {
		return nil
	}
	return ownedBy("the directory of "+what, dir, dst, true)
}

// ownedBy checks st (of path) for an owner other than this user (or
// root, when rootToo) and for group or world write permission.
func ownedBy(what, path string, st fs.FileInfo, rootToo bool) error {
	uid := os.Geteuid()
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && int(sys.Uid) != uid && !(rootToo && sys.Uid == 0) {
		return fmt.Errorf("%w: %s %s belongs to uid %d, not to you (uid %d), who would act on it: run `chown %d %s` (or accept it with --allow-unsafe-store or %s=1)",
			ErrUnsafe, what, path, sys.Uid, uid, uid, path, AllowUnsafeEnv)
	}
	if st.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%w: %s %s may be written by others (mode %04o), who could make stasis delete or run files as you: run `chmod go-w %s` (or accept it with --allow-unsafe-store or %s=1)",
			ErrUnsafe, what, path, st.Mode().Perm(), path, AllowUnsafeEnv)
	}
	return nil
}

// checkStore checks the store's root and the names of its structure that
// exist: no link among them, ever; and, unless allowed, all owned by this
// user and written by nobody else.
func (s *Store) checkStore() error {
	st, err := os.Lstat(s.Root)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		// The root itself may be reached through links (the user
		// names it), but must be a directory.
		if st, err = os.Stat(s.Root); err != nil {
			return err
		}
		if !st.IsDir() {
			return fmt.Errorf("%w: store %s is not a directory", ErrUnsafe, s.Root)
		}
	}
	if !s.opts.allowUnsafe() {
		if err := ownedBy("store", s.Root, st, false); err != nil {
			return err
		}
	}
	return s.checkStructure(structure...)
}

// checkStructure checks names of the store's structure: none may be a
// link; unless allowed, each must be owned by this user and written by
// nobody else. Names that do not exist pass.
func (s *Store) checkStructure(names ...string) error {
	for _, name := range names {
		st, err := os.Lstat(s.path(name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if st.Mode()&os.ModeSymlink != 0 {
			to, _ := os.Readlink(s.path(name))
			return fmt.Errorf("%w: %s is a symbolic link (to %s); stasis follows no link in its store's structure: remove the link (`rm %s`) and run again",
				ErrUnsafe, s.path(name), to, s.path(name))
		}
		if !s.opts.allowUnsafe() {
			if err := ownedBy("store file", s.path(name), st, false); err != nil {
				return err
			}
		}
	}
	return nil
}

// openStructure opens the structural directory name of the store as an
// os.Root without following a link at name: it looks at name (Lstat),
// opens it, and checks that what it opened is what it looked at. What is
// done through the Root stays in that directory.
func (s *Store) openStructure(name string) (*os.Root, error) {
	root, err := os.OpenRoot(s.Root)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	seen, err := root.Lstat(name)
	if err != nil {
		return nil, err
	}
	if !seen.IsDir() {
		return nil, fmt.Errorf("%w: %s is not a directory (%s); stasis follows no link in its store's structure: remove it (`rm %s`) and run again",
			ErrUnsafe, s.path(name), seen.Mode().Type(), s.path(name))
	}
	dir, err := root.OpenRoot(name)
	if err != nil {
		return nil, err
	}
	opened, err := dir.Stat(".")
	if err == nil && !os.SameFile(seen, opened) {
		err = fmt.Errorf("%w: %s changed while it was opened (a link put in its place?)", ErrUnsafe, s.path(name))
	}
	if err != nil {
		dir.Close()
		return nil, err
	}
	return dir, nil
}

// removeIn removes name, and all under it, from the store's structural
// directory dir without following any link: not at dir, not at name, not
// below. A name that does not exist is no error.
func (s *Store) removeIn(dir, name string) error {
	r, err := s.openStructure(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer r.Close()
	return r.RemoveAll(name)
}

// readStructureDir lists the store's structural directory dir (none when
// it does not exist), opened as openStructure does.
func readStructureDir(s *Store, dir string) ([]fs.DirEntry, error) {
	r, err := s.openStructure(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return fs.ReadDir(r.FS(), ".")
}

// usageIn adds up the sizes of the regular files under name in the
// structural directory dir, following no link.
func (s *Store) usageIn(dir, name string) int64 {
	r, err := s.openStructure(dir)
	if err != nil {
		return 0
	}
	defer r.Close()
	var n int64
	fs.WalkDir(r.FS(), name, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}
