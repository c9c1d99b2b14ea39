package fileset

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/gdswriter"
	"golang.org/x/sys/unix"
)

// Packer writes the files of a directory into one data file of a pending
// checkpoint, and can start on files while another program is still
// writing them (Follow): a process checkpoint streams CRIU's memory images
// into the store while CRIU is still dumping.
type Packer struct {
	ctx     context.Context
	p       *catalog.Pending
	w       *gdswriter.Writer
	streams map[string]catalog.Entry // files streamed by Follow, by path
	punched map[string]bool          // files whose streamed bytes Follow freed
	piped   []catalog.Entry          // files stored by Stream, in order
}

// NewPacker starts the data file of p.
func NewPacker(ctx context.Context, p *catalog.Pending, o gdswriter.WriterOptions) (*Packer, error) {
	w, err := gdswriter.Create(ctx, p.Path(dataFileName), o)
	if err != nil {
		return nil, err
	}
	return &Packer{ctx: ctx, p: p, w: w, streams: map[string]catalog.Entry{}, punched: map[string]bool{}}, nil
}

// followPoll is how often Follow looks for new bytes when there were none.
const followPoll = 2 * time.Millisecond

// Follow streams the files of dir that match, in name order, into the data
// file as they grow: a file is followed until a later matching file
// appears, or until stop is closed, after which Follow takes what is left
// of each and returns. Files are never trusted to be final: AddDir checks
// each streamed file against its final size and stores a file again,
// whole, if it changed after it was streamed. With punch, Follow frees each
// range of a file once it is in the writer (a hole punched into a scratch
// file: memory back while CRIU still dumps); such a file cannot be stored
// again, so a change to it makes AddDir fail. Follow must not run at the
// same time as AddDir.
func (k *Packer) Follow(dir string, match func(name string) bool, stop <-chan struct{}, punch bool) error {
	done := map[string]bool{}
	for {
		stopping := false
		select {
		case <-stop:
			stopping = true
		default:
		}
		names, err := matching(dir, match)
		if err != nil {
			return err
		}
		var next string
		for _, n := range names {
			if !done[n] {
				next = n
				break
			}
		}
		if next == "" {
			if stopping {
				return nil
			}
			if err := k.pause(stop); err != nil {
				return err
			}
			continue
		}
		later := func() bool {
			names, err := matching(dir, match)
			return err == nil && len(names) > 0 && names[len(names)-1] != next
		}
		if err := k.follow(filepath.Join(dir, next), next, later, stop, punch); err != nil {
			return err
		}
		done[next] = true
	}
}

// follow streams one file until it is complete as far as Follow can tell:
// a later file exists (CRIU has moved on) or stop is closed.
func (k *Packer) follow(path, name string, later func() bool, stop <-chan struct{}, punch bool) error {
	flag := os.O_RDONLY
	if punch {
		flag = os.O_RDWR
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	e := catalog.Entry{Path: name, Type: catalog.EntryFile, Offset: k.w.Offset(), Mode: 0o600}
	defer func() { k.streams[name] = e }()
	stopped := false
	for {
		if !stopped {
			select {
			case <-stop:
				stopped = true
			default:
			}
		}
		st, err := f.Stat()
		if err != nil {
			return err
		}
		// Take whole chunks while the file grows; everything once it is done.
		avail := st.Size() - e.Size
		if !stopped {
			avail -= avail % gdswriter.DefaultChunkSize
		}
		if avail > 0 {
			n, err := k.w.ReadFrom(io.NewSectionReader(f, e.Size, avail))
			if err == nil && punch && n > 0 {
				// The bytes are in the writer's buffers now.
				if perr := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, e.Size, n); perr == nil {
					k.punched[name] = true
				}
			}
			e.Size += n
			if err != nil {
				return err
			}
			continue
		}
		if stopped {
			return nil
		}
		if later() {
			stopped = true // take the rest of this file, then move on
			continue
		}
		if err := k.pause(stop); err != nil {
			return err
		}
	}
}

func (k *Packer) pause(stop <-chan struct{}) error {
	select {
	case <-k.ctx.Done():
		return k.ctx.Err()
	case <-stop:
	case <-time.After(followPoll):
	}
	return nil
}

func matching(dir string, match func(string) bool) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if e.Type().IsRegular() && match(e.Name()) {
			names = append(names, e.Name())
		}
	}
	// pages-2.img before pages-10.img: shorter names first.
	sort.Slice(names, func(i, j int) bool {
		if len(names[i]) != len(names[j]) {
			return len(names[i]) < len(names[j])
		}
		return names[i] < names[j]
	})
	return names, nil
}

// Stream stores what r yields, to its end, as the file name of the
// directory AddDir adds next: a file that never lands on disk, such as an
// image CRIU hands over through a pipe. AddDir lists it with the
// directory's files; a file of the same name there is an error. Stream
// must not run at the same time as Follow, AddDir or another Stream.
func (k *Packer) Stream(name string, r io.Reader) error {
	return k.stream(name, func() (int64, error) { return k.w.ReadFrom(r) })
}

// StreamFill stores n bytes that fill writes, as Stream stores a reader's:
// the writer's workers fill whole chunks at the same time
// (gdswriter.Writer.FillParallel), so fill must be safe for concurrent
// use. The bytes may still be filling when it returns; Close waits for
// them and fails if fill did.
func (k *Packer) StreamFill(name string, n int64, fill func(dst []byte, off int64) error) error {
	return k.stream(name, func() (int64, error) { return n, k.w.FillParallel(n, fill) })
}

// stream stores what put adds to the writer as the file name.
func (k *Packer) stream(name string, put func() (int64, error)) error {
	if !catalog.ValidEntryPath(name) {
		return fmt.Errorf("%w %s: name cannot be stored", ErrSource, name)
	}
	e := catalog.Entry{Path: name, Type: catalog.EntryFile, Offset: k.w.Offset(), Mode: 0o600}
	n, err := put()
	if err != nil {
		return err
	}
	mtime := time.Now().UTC()
	e.Size, e.MTime = n, &mtime
	k.piped = append(k.piped, e)
	return nil
}

// AddDir adds everything below dir (not dir itself) with paths relative to
// dir, and the files Stream stored. A file Follow streamed keeps its bytes
// if its size has not changed since; otherwise it is stored again, whole
// (its first bytes stay in the data file as an unreferenced gap).
func (k *Packer) AddDir(dir string) error {
	var srcs []source
	var total int64
	if err := walk(dir, "", &srcs, &total); err != nil {
		return err
	}
	for _, e := range k.piped {
		for _, src := range srcs {
			if src.entry.Path == e.Path {
				return fmt.Errorf("%w %s: exists both as a file and as a stream already stored", ErrSource, src.from)
			}
		}
	}
	if err := k.addSources(srcs); err != nil {
		return err
	}
	k.p.Manifest.Entries = append(k.p.Manifest.Entries, k.piped...)
	k.piped = nil
	return nil
}

// addSources stores each source's bytes (unless Follow already streamed
// all of them) and adds its entry to the manifest.
func (k *Packer) addSources(srcs []source) error {
	for i := range srcs {
		e := &srcs[i].entry
		streamed, ok := k.streams[e.Path]
		if ok && k.punched[e.Path] && (e.Type != catalog.EntryFile || streamed.Size != e.Size) {
			return fmt.Errorf("%s changed after it was streamed and freed (%d bytes then, %d now); it cannot be stored", e.Path, streamed.Size, e.Size)
		}
		if ok && e.Type == catalog.EntryFile && streamed.Size == e.Size {
			e.Offset = streamed.Offset
		} else if e.Type == catalog.EntryFile {
			e.Offset = k.w.Offset()
			if err := copyFile(k.w, srcs[i].from, e.Size); err != nil {
				return err
			}
		}
		k.p.Manifest.Entries = append(k.p.Manifest.Entries, *e)
	}
	return nil
}

// Close finishes the data file and adds it to the manifest.
func (k *Packer) Close() error {
	res, err := k.w.Close()
	if err != nil {
		return err
	}
	k.p.Manifest.Files = append(k.p.Manifest.Files, catalog.NewDataFile(dataFileName, res))
	return nil
}

// Hurry says the caller now waits for Close: the writer's last chunks take
// s2 where they would take zstd (gdswriter.Writer.Hurry).
func (k *Packer) Hurry() { k.w.Hurry() }

// Abort stops the writer; the caller aborts the pending checkpoint.
func (k *Packer) Abort() { k.w.Abort() }
