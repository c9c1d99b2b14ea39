package restore

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/checkpoint"
	"github.com/stasis-ckpt/stasis/criu"
)

// memoryImage says whether entry e is one of CRIU's memory images
// (pages-N.img), which hold almost all of a checkpoint's bytes: unless
// restored with PagesUnpack, they are not unpacked before CRIU runs, but
// written into the tree (PagesFill, with only the pages left to CRIU
// unpacked) or served to CRIU as it reads them (PagesStream).
func memoryImage(e catalog.Entry) bool {
	return e.Type == catalog.EntryFile && !strings.Contains(e.Path, "/") && checkpoint.IsPagesImage(e.Path)
}

// serveImages answers `criu restore --stream` for checkpoint m: the memory
// images are read from the store, verified and decoded chunk by chunk (several
// chunks ahead) as CRIU reads them; every other image is read from the
// files unpacked into images. A chunk that fails its checks ends its image
// there, so CRIU fails and undoes the restore: no byte that was not
// verified reaches a process that runs.
func serveImages(ctx context.Context, s *catalog.Store, m *catalog.Manifest, images string, ro catalog.ReadOptions) (*criu.ImageServer, error) {
	streamed := map[string]catalog.Entry{}
	for _, e := range m.Entries {
		if memoryImage(e) {
			streamed[e.Path] = e
		}
	}
	return criu.ServeImages(images, func(name string) (criu.ImageSender, bool) {
		if e, ok := streamed[name]; ok {
			return func(w io.Writer) error {
				return s.StreamRange(ctx, m, m.Files[e.File], e.Offset, e.Size, ro, func(b []byte) error {
					_, err := w.Write(b)
					return err
				})
			}, true
		}
		if name == "" || name == "." || name == ".." || strings.Contains(name, "/") {
			return nil, false
		}
		path := filepath.Join(images, name)
		if st, err := os.Lstat(path); err != nil || !st.Mode().IsRegular() {
			return nil, false
		}
		return func(w io.Writer) error {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(w, f)
			return err
		}, true
	})
}
