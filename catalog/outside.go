package catalog

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Directories that a command builds outside the store (`stasis load
// --to DIR` unpacks into a hidden directory beside DIR and renames it into
// place) are registered in the store first, so that gc can remove what a
// killed command left there: loads/<token> names the directory, and its
// writer holds a lock on that file for as long as it works. The directory
// is named .<base>.stasis-load-<token>, so gc removes only a directory of
// that exact name, owned by the store's user, that a registration without
// a live writer names.
const (
	loadsDir     = "loads"
	outsideInfix = ".stasis-load-"
)

// OutsideDir is a directory being built outside the store, registered so
// that gc removes it if its writer dies.
type OutsideDir struct {
	// Dir is the directory to build in: .<base>.stasis-load-<token>
	// beside the target.
	Dir  string
	reg  string
	lock *os.File
}

// NewOutsideDir registers, then creates (mode 0700), a hidden directory
// beside target to build target's contents in.
func (s *Store) NewOutsideDir(target string) (*OutsideDir, error) {
	target, err := filepath.Abs(target)
	if err != nil {
		return nil, err
	}
	if err := os.Mkdir(s.path(loadsDir), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	if err := s.checkStructure(loadsDir); err != nil {
		return nil, err
	}
	var raw [8]byte
	rand.Read(raw[:])
	token := hex.EncodeToString(raw[:])
	o := &OutsideDir{
		Dir: filepath.Join(filepath.Dir(target), "."+filepath.Base(target)+outsideInfix+token),
		reg: s.path(loadsDir, token),
	}
	if o.lock, err = lockFile(o.reg, true); err != nil {
		return nil, err
	}
	if _, err := o.lock.WriteString(o.Dir + "\n"); err == nil {
		err = o.lock.Sync()
	}
	if err == nil {
		err = syncDir(s.path(loadsDir))
	}
	if err == nil {
		err = os.Mkdir(o.Dir, 0o700)
	}
	if err != nil {
		o.lock.Close()
		os.Remove(o.reg)
		return nil, err
	}
	return o, nil
}

// Done removes the directory (what is left of it once its contents were
// moved into place, or all of it after a failure) and its registration.
func (o *OutsideDir) Done() error {
	err := os.RemoveAll(o.Dir)
	os.Remove(o.reg)
	o.lock.Close()
	return err
}

// gcOutside removes the directories of registrations whose writer is
// gone, and those registrations.
func (s *Store) gcOutside() (removed []string, bytes int64, err error) {
	entries, err := readStructureDir(s, loadsDir)
	if err != nil {
		return nil, 0, err
	}
	for _, e := range entries {
		reg := s.path(loadsDir, e.Name())
		if !e.Type().IsRegular() {
			continue
		}
		lock, err := lockFile(reg, false)
		if err != nil || lock == nil {
			continue // its writer works on
		}
		data, _ := os.ReadFile(reg)
		dir := strings.TrimSuffix(string(data), "\n")
		if ok, n := removeOutside(dir, e.Name()); ok {
			removed = append(removed, dir)
			bytes += n
		}
		os.Remove(reg)
		lock.Close()
	}
	return removed, bytes, nil
}

// removeOutside removes dir if it is what registration token names: an
// absolute path whose base is .<name>.stasis-load-<token>, a directory
// (not a link) owned by this user. It is removed through its parent
// opened as an os.Root, so nothing under it is followed out of it.
func removeOutside(dir, token string) (bool, int64) {
	base := filepath.Base(dir)
	if !filepath.IsAbs(dir) || !strings.HasPrefix(base, ".") || !strings.HasSuffix(base, outsideInfix+token) {
		return false, 0
	}
	st, err := os.Lstat(dir)
	if err != nil || !st.IsDir() {
		return false, 0
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); !ok || int(sys.Uid) != os.Geteuid() {
		return false, 0
	}
	parent, err := os.OpenRoot(filepath.Dir(dir))
	if err != nil {
		return false, 0
	}
	defer parent.Close()
	n := diskUsage(dir)
	if err := parent.RemoveAll(base); err != nil {
		return false, 0
	}
	return true, n
}
