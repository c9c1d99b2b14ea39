// Package atomicfile replaces a file whole: readers see its old content or
// its new, never a part.
package atomicfile

import (
	"io"
	"os"
	"path/filepath"
)

// Write writes data to path through a new file beside it (mode 0600) and
// a rename over path. On error the new file is removed and path is as it
// was. It does not fsync: what it writes is state a crash may lose.
func Write(path string, data []byte) error {
	return WriteFrom(path, false, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// WriteFrom has write fill a new file beside path (mode 0600, named
// .NAME.partial-*), fsyncs it when durable, and renames it over path. On
// error the new file is removed and path is as it was: no file that looks
// whole is left.
func WriteFrom(path string, durable bool, write func(io.Writer) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".partial-*")
	if err != nil {
		return err
	}
	err = write(tmp)
	if err == nil && durable {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}
