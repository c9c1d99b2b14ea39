// Package atomicfile replaces a file whole: readers see its old content or
// its new, never a part.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write writes data to path through a new file beside it (mode 0600) and
// a rename over path. On error the new file is removed and path is as it
// was. It does not fsync: what it writes is state a crash may lose.
func Write(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-")
	if err != nil {
		return err
	}
	_, werr := tmp.Write(data)
	if cerr := tmp.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp.Name(), path)
	}
	if werr != nil {
		os.Remove(tmp.Name())
	}
	return werr
}
