// Package tensors saves named buffers (GPU memory or host memory) as one
// checkpoint of kind "tensors" and loads them back into buffers the caller
// provides: the application-level fast path a training loop calls.
//
// GPU memory takes one of two paths (SaveOptions.IO, $STASIS_IO). Its own
// pinned pipeline: GPU memory is copied into the writer's chunk buffers,
// which are registered with the driver as pinned memory, so the bytes go
// from the GPU to the buffer that is compressed and written with O_DIRECT
// with no copy in between; each tensor's dtype is known, so the byte-plane
// codecs get the element width. Or cuFile (cufile.go): every raw chunk
// that lies inside one GPU tensor goes from GPU memory to the file by
// cuFileWrite, checksummed on the GPU, the other chunks through the
// pipeline. Loading reads, verifies and decodes chunks in parallel and
// copies each straight to its place on the GPU, or with cuFile reads raw
// chunks straight into it and verifies them there.
//
// It lives apart from gdswriter because it makes checkpoints (catalog),
// which gdswriter, below catalog, must not know.
package tensors

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/cuda"
	"github.com/stasis-ckpt/stasis/gdswriter"
)

// ErrMismatch is wrapped by errors about buffers that do not match what
// they describe or what a checkpoint holds.
var ErrMismatch = errors.New("tensor does not match")

// DType is an element type.
type DType string

var dtypeSizes = map[DType]int{
	"bool": 1, "int8": 1, "uint8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
	"int16": 2, "uint16": 2, "fp16": 2, "bf16": 2,
	"int32": 4, "uint32": 4, "fp32": 4,
	"int64": 8, "uint64": 8, "fp64": 8, "complex64": 8,
	"complex128": 16,
}

// Size is the element width in bytes, 0 for an unknown dtype.
func (d DType) Size() int { return dtypeSizes[d] }

// Tensor is a named buffer. Exactly one of Device and Host is set.
type Tensor struct {
	Name  string
	DType DType
	Shape []int64
	// Device is a CUDA device pointer to Bytes bytes.
	Device uintptr
	// Host is host memory.
	Host []byte
	// Bytes is the buffer's size; it must equal the product of Shape times
	// the dtype's size.
	Bytes int64
}

// Meta is what a tensors checkpoint records in its manifest's meta: the
// path its bytes took, and why, and the caller's own description of the
// state the tensors belong to (the Python package keeps the structure of
// nested dicts and lists, and the small values in it, there).
type Meta struct {
	// IOPath is "pinned" (GPU memory through pinned chunk buffers),
	// "cufile" or "cufile-compat" (whole chunks of GPU memory written by
	// cuFile, doing GPUDirect Storage or in its compat mode; the other
	// chunks through pinned buffers), "host" (host memory only) or
	// "snapshot" (a pinned host snapshot taken before an asynchronous save
	// returned).
	IOPath string          `json:"io_path"`
	Why    string          `json:"why"`
	State  json.RawMessage `json:"state,omitempty"`
}

const whyPinned = "GPU memory copied by the driver into pinned chunk buffers, checksummed and compressed on the host, written with O_DIRECT"

// attrs is what a tensor entry records in the manifest.
type attrs struct {
	DType DType   `json:"dtype"`
	Shape []int64 `json:"shape"`
}

// Check reports whether t describes itself consistently: a known dtype, a
// size that matches its shape, one buffer, a usable name.
func Check(t Tensor) error { return t.check() }

func (t Tensor) check() error {
	size := t.DType.Size()
	if size == 0 {
		return fmt.Errorf("%w: %s: unknown dtype %q", ErrMismatch, t.Name, t.DType)
	}
	n := int64(size)
	for _, d := range t.Shape {
		if d < 0 {
			return fmt.Errorf("%w: %s: negative dimension in shape %v", ErrMismatch, t.Name, t.Shape)
		}
		n *= d
	}
	if t.Device != 0 && t.Host != nil {
		return fmt.Errorf("%w: %s: give either a device pointer or host memory", ErrMismatch, t.Name)
	}
	if t.Host != nil && int64(len(t.Host)) != t.Bytes {
		return fmt.Errorf("%w: %s: host buffer has %d bytes, Bytes says %d", ErrMismatch, t.Name, len(t.Host), t.Bytes)
	}
	if n != t.Bytes {
		return fmt.Errorf("%w: %s: %s%v needs %d bytes, the buffer has %d", ErrMismatch, t.Name, t.DType, t.Shape, n, t.Bytes)
	}
	if t.Device == 0 && t.Host == nil && t.Bytes > 0 {
		return fmt.Errorf("%w: %s: no buffer", ErrMismatch, t.Name)
	}
	if !catalog.ValidEntryPath(t.Name) {
		return fmt.Errorf("%w: %q is not a usable tensor name (slash-separated, relative, no ..)", ErrMismatch, t.Name)
	}
	return nil
}

// SaveOptions configure Save.
type SaveOptions struct {
	Job    string
	Step   int64
	Tags   map[string]string
	Writer gdswriter.WriterOptions
	// IO is the I/O path of GPU memory: IOAuto, IOCuFile or IOPinned; ""
	// is $STASIS_IO, else auto.
	IO string
	// Meta is recorded in the manifest; an empty IOPath is filled in with
	// the path the bytes take here.
	Meta Meta
}

// Save writes the tensors as a new complete checkpoint. The device memory
// is read while Save runs; the caller must not change it until Save
// returns. On any error nothing is listed and pinned memory is released.
func Save(ctx context.Context, s *catalog.Store, ts []Tensor, o SaveOptions) (*catalog.Record, error) {
	mode, err := ParseIO(o.IO)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var drv *cuda.Driver
	elem, mixed := 0, false
	for _, t := range ts {
		if err := t.check(); err != nil {
			return nil, err
		}
		if seen[t.Name] {
			return nil, fmt.Errorf("%w: two tensors are named %s", ErrMismatch, t.Name)
		}
		seen[t.Name] = true
		if elem == 0 {
			elem = t.DType.Size()
		} else if elem != t.DType.Size() {
			mixed = true
		}
	}
	ctxs := map[string]cuda.Context{}
	var pinCtx cuda.Context
	for _, t := range ts {
		if t.Device == 0 {
			continue
		}
		var err error
		if drv == nil {
			if drv, err = cuda.LoadLibrary(); err != nil {
				return nil, err
			}
		}
		if ctxs[t.Name], err = drv.PointerContext(t.Device); err != nil {
			return nil, fmt.Errorf("%s: %w", t.Name, err)
		}
		pinCtx = ctxs[t.Name]
	}
	wo := o.Writer
	if !mixed && (elem == 2 || elem == 4) {
		wo.ElemSize = elem
	}
	if drv != nil {
		wo.Pin = pinner(drv, pinCtx)
	}
	var cf *cuda.CuFile
	whyNot := ""
	if drv != nil {
		if cf, whyNot, err = cuFileFor(mode, compressed(wo), drv); err != nil {
			return nil, err
		}
	}
	p, err := s.Begin(catalog.KindTensors, o.Job, o.Step, o.Tags)
	if err != nil {
		return nil, err
	}
	plan := ioPlan{mode: mode, cf: cf, whyNot: whyNot, fileCtx: pinCtx}
	rec, err := save(ctx, p, drv, ctxs, ts, wo, plan, o.Meta)
	if err != nil {
		p.Abort()
		return nil, err
	}
	return rec, nil
}

// pinner registers buffers with the driver (portable: every context may
// use them), so that copies between them and GPU memory run at full speed.
func pinner(drv *cuda.Driver, ctx cuda.Context) gdswriter.Pinning {
	return func(b []byte) (func([]byte), error) {
		if err := drv.RegisterHost(ctx, b); err != nil {
			return nil, err
		}
		return func(b []byte) { drv.UnregisterHost(ctx, b) }, nil
	}
}

const dataFileName = "data.0000"

// ioPlan is how a save moves GPU memory: through cuFile (cf set), or not,
// and why not.
type ioPlan struct {
	mode    string
	cf      *cuda.CuFile
	whyNot  string
	fileCtx cuda.Context // the context the data file is registered in
}

func save(ctx context.Context, p *catalog.Pending, drv *cuda.Driver, ctxs map[string]cuda.Context, ts []Tensor, wo gdswriter.WriterOptions, plan ioPlan, meta Meta) (*catalog.Record, error) {
	w, err := gdswriter.Create(ctx, p.Path(dataFileName), wo)
	if err != nil {
		return nil, err
	}
	var dio *cufileIO
	if plan.cf != nil {
		if dio, plan.whyNot, err = useCuFile(w, drv, ts, ctxs, wo, plan); err != nil {
			w.Abort()
			return nil, err
		}
	}
	if dio != nil {
		// Released once the writer is done with the GPU memory.
		defer dio.close()
	}
	for _, t := range ts {
		a, _ := json.Marshal(attrs{DType: t.DType, Shape: t.Shape})
		e := catalog.Entry{Path: t.Name, Type: catalog.EntryTensor, Size: t.Bytes, Offset: w.Offset(), Attrs: a}
		if t.Host != nil {
			_, err = w.Write(t.Host)
		} else {
			src, devCtx := t.Device, ctxs[t.Name]
			err = w.FillDevice(t.Bytes, src, func(dst []byte, off int64) error {
				return drv.CopyToHost(devCtx, dst, src+uintptr(off))
			})
		}
		if err != nil {
			w.Abort()
			return nil, fmt.Errorf("%s: %w", t.Name, err)
		}
		p.Manifest.Entries = append(p.Manifest.Entries, e)
	}
	res, err := w.Close()
	if err != nil {
		return nil, err
	}
	p.Manifest.Files = []catalog.DataFile{catalog.NewDataFile(dataFileName, res)}
	switch {
	case meta.IOPath != "":
	case dio != nil && res.DeviceChunks > 0:
		meta.IOPath = ioPathName(plan.cf)
		meta.Why = fmt.Sprintf("%d of %d chunks written by cuFileWrite straight from GPU memory (%s), each checksummed on the GPU; the other %d (spanning tensors, in host memory, or a short last chunk) through pinned chunk buffers",
			res.DeviceChunks, len(res.Chunks), plan.cf.ModeWhy, len(res.Chunks)-res.DeviceChunks)
		if plan.mode == IOCuFile && compressed(wo) {
			meta.Why += fmt.Sprintf("; compression (%s) applied to those others only: cuFile writes raw bytes", wo.Method)
		}
		meta.Why += dio.refusals()
	case dio != nil:
		meta.IOPath, meta.Why = "pinned", whyPinned+"; cuFile was ready, but no whole chunk lies inside one GPU tensor"
	case drv != nil:
		meta.IOPath, meta.Why = "pinned", whyPinned+"; cuFile not used: "+plan.whyNot
	default:
		meta.IOPath, meta.Why = "host", "every buffer was in host memory"
	}
	if p.Manifest.Meta, err = json.Marshal(meta); err != nil {
		return nil, err
	}
	return p.Commit()
}

// readToDevice reads chunks straight into GPU buffers through cuFile and
// verifies them there. Where the data file cannot be registered it reads
// nothing and returns false (the caller reads every chunk), or fails when
// cuFile was asked for.
func readToDevice(ctx context.Context, s *catalog.Store, m *catalog.Manifest, df catalog.DataFile, dio *cufileIO, direct []gdswriter.DeviceChunk, sizes map[uintptr]int64, mode string, o catalog.ReadOptions) (bool, error) {
	r, err := s.OpenData(m, df, o.NoDirect)
	if err != nil {
		return false, err
	}
	defer r.Close()
	f, err := r.OpenDevice(dio)
	if err != nil {
		if mode == IOCuFile {
			return false, fmt.Errorf("%w: the cufile I/O path was asked for: %v", ErrCuFileUnavailable, err)
		}
		return false, nil
	}
	defer f.Close()
	for base, n := range sizes {
		dio.register(base, n)
	}
	return true, r.ReadToDevice(ctx, f, direct, gdswriter.ReadOptions{Workers: o.Workers, Progress: o.Progress})
}

// compressed reports whether a save asks for compression ("" is none).
func compressed(wo gdswriter.WriterOptions) bool {
	return wo.Method != "" && wo.Method != gdswriter.MethodNone
}

// useCuFile registers the data file with cuFile, and the GPU buffers that
// hold whole chunks. Where the file cannot be registered it returns nil
// and why, or fails when cuFile was asked for.
func useCuFile(w *gdswriter.Writer, drv *cuda.Driver, ts []Tensor, ctxs map[string]cuda.Context, wo gdswriter.WriterOptions, plan ioPlan) (*cufileIO, string, error) {
	ctxOf := map[uintptr]cuda.Context{}
	for _, t := range ts {
		if t.Device != 0 {
			ctxOf[t.Device] = ctxs[t.Name]
		}
	}
	slots := wo.Workers
	if slots <= 0 {
		slots = gdswriter.DefaultWorkers()
	}
	dio := newCuFileIO(plan.cf, drv, plan.fileCtx, ctxOf, slots)
	if err := w.UseDevice(dio); err != nil {
		dio.close()
		if plan.mode == IOCuFile {
			return nil, "", fmt.Errorf("%w: the cufile I/O path was asked for: %v", ErrCuFileUnavailable, err)
		}
		return nil, err.Error(), nil
	}
	chunkSize := int64(wo.ChunkSize)
	if chunkSize == 0 {
		chunkSize = gdswriter.DefaultChunkSize
	}
	var off int64
	for _, t := range ts {
		if t.Device != 0 && holdsWholeChunk(off, t.Bytes, chunkSize) {
			dio.register(t.Device, t.Bytes)
		}
		off += t.Bytes
	}
	return dio, "", nil
}

// Describe lists the tensors a checkpoint holds (without buffers).
func Describe(m *catalog.Manifest) ([]Tensor, error) {
	if m.Kind != catalog.KindTensors {
		return nil, fmt.Errorf("%w: checkpoint %s is of kind %s, not tensors", catalog.ErrInvalid, m.ID, m.Kind)
	}
	var ts []Tensor
	for _, e := range m.Entries {
		if e.Type != catalog.EntryTensor {
			continue
		}
		var a attrs
		if err := json.Unmarshal(e.Attrs, &a); err != nil {
			return nil, fmt.Errorf("%w: tensor %s: %v", catalog.ErrBadManifest, e.Path, err)
		}
		ts = append(ts, Tensor{Name: e.Path, DType: a.DType, Shape: a.Shape, Bytes: e.Size})
	}
	return ts, nil
}

// LoadOptions configure Load.
type LoadOptions struct {
	Read catalog.ReadOptions
	// IO is the I/O path of GPU memory, as SaveOptions.IO: through cuFile,
	// raw chunks that lie inside one GPU buffer are read straight into it
	// by cuFileRead and verified there, on the GPU.
	IO string
}

// Load reads the checkpoint id into the buffers of into, matched by name:
// every tensor of the checkpoint must have a buffer of the same dtype and
// size (the first mismatch is named). Every chunk is verified: before any
// of its bytes reach a buffer, or, for chunks read by cuFile, in the GPU
// buffer they were read into (a chunk that fails there is an error naming
// it, ErrCorrupt, and its bytes stay in the buffer unverified). On error,
// the buffers hold a mix of old and new bytes.
func Load(ctx context.Context, s *catalog.Store, id string, into []Tensor, o LoadOptions) (*catalog.Manifest, error) {
	mode, err := ParseIO(o.IO)
	if err != nil {
		return nil, err
	}
	m, err := s.ReadManifest(id)
	if err != nil {
		return nil, err
	}
	saved, err := Describe(m)
	if err != nil {
		return nil, err
	}
	byName := map[string]Tensor{}
	for _, t := range into {
		byName[t.Name] = t
	}
	entries := map[string]catalog.Entry{}
	for _, e := range m.Entries {
		entries[e.Path] = e
	}
	for _, t := range into {
		if _, ok := entries[t.Name]; !ok {
			return nil, fmt.Errorf("%w: a buffer is given for %s, the checkpoint has no such tensor", ErrMismatch, t.Name)
		}
	}
	var drv *cuda.Driver
	var pinCtx cuda.Context
	type target struct {
		entry  catalog.Entry
		t      Tensor
		devCtx cuda.Context
	}
	byFile := map[int][]target{}
	for i, st := range saved {
		t, ok := byName[st.Name]
		switch {
		case !ok:
			return nil, fmt.Errorf("%w: the checkpoint has %s, no buffer was given for it", ErrMismatch, st.Name)
		case t.DType != st.DType || t.Bytes != st.Bytes:
			return nil, fmt.Errorf("%w: %s is %s of %d bytes in the checkpoint, the buffer is %s of %d bytes", ErrMismatch, st.Name, st.DType, st.Bytes, t.DType, t.Bytes)
		case t.Host != nil && int64(len(t.Host)) != t.Bytes:
			return nil, fmt.Errorf("%w: %s: host buffer has %d bytes, Bytes says %d", ErrMismatch, t.Name, len(t.Host), t.Bytes)
		case t.Host == nil && t.Device == 0 && t.Bytes > 0:
			return nil, fmt.Errorf("%w: %s: no buffer", ErrMismatch, t.Name)
		}
		var devCtx cuda.Context
		if t.Device != 0 {
			if drv == nil {
				if drv, err = cuda.LoadLibrary(); err != nil {
					return nil, err
				}
			}
			if devCtx, err = drv.PointerContext(t.Device); err != nil {
				return nil, fmt.Errorf("%s: %w", t.Name, err)
			}
			pinCtx = devCtx
		}
		e := entries[saved[i].Name]
		if e.Size > 0 {
			byFile[e.File] = append(byFile[e.File], target{entry: e, t: t, devCtx: devCtx})
		}
	}
	var dio *cufileIO
	if drv != nil {
		o.Read.Pin = pinner(drv, pinCtx)
		cf, _, err := cuFileFor(mode, false, drv)
		if err != nil {
			return nil, err
		}
		if cf != nil {
			ctxOf := map[uintptr]cuda.Context{}
			for _, targets := range byFile {
				for _, tg := range targets {
					if tg.t.Device != 0 {
						ctxOf[tg.t.Device] = tg.devCtx
					}
				}
			}
			workers := o.Read.Workers
			if workers <= 0 {
				workers = gdswriter.DefaultWorkers()
			}
			dio = newCuFileIO(cf, drv, pinCtx, ctxOf, workers)
			defer dio.close()
		}
	}
	for fi, df := range m.Files {
		targets := byFile[fi]
		sort.Slice(targets, func(i, j int) bool { return targets[i].entry.Offset < targets[j].entry.Offset })
		host := make([]int, 0, len(df.Chunks))
		var direct []gdswriter.DeviceChunk
		sizes := map[uintptr]int64{} // the GPU buffers the direct chunks go to
		for i, c := range df.Chunks {
			start := int64(i) * df.ChunkSize
			k := sort.Search(len(targets), func(k int) bool { return targets[k].entry.Offset+targets[k].entry.Size > start })
			if dio != nil && c.DeviceReadable() && k < len(targets) {
				tg := targets[k]
				if tg.t.Device != 0 && tg.entry.Offset <= start && start+c.Raw <= tg.entry.Offset+tg.entry.Size {
					span := gdswriter.DeviceSpan{Base: tg.t.Device, Offset: start - tg.entry.Offset, Len: c.Raw}
					direct = append(direct, gdswriter.DeviceChunk{Index: i, Chunk: c, Dst: span})
					sizes[tg.t.Device] = tg.t.Bytes
					continue
				}
			}
			host = append(host, i)
		}
		if len(direct) > 0 {
			read, err := readToDevice(ctx, s, m, df, dio, direct, sizes, mode, o.Read)
			if err != nil {
				return nil, err
			}
			if !read {
				host = nil // every chunk
			}
		}
		if host != nil && len(host) == 0 {
			continue
		}
		err := s.EachChunkOf(ctx, m, df, host, o.Read, func(i int, raw []byte) error {
			start := int64(i) * df.ChunkSize
			end := start + int64(len(raw))
			k := sort.Search(len(targets), func(k int) bool { return targets[k].entry.Offset+targets[k].entry.Size > start })
			for ; k < len(targets) && targets[k].entry.Offset < end; k++ {
				tg := targets[k]
				lo, hi := max(tg.entry.Offset, start), min(tg.entry.Offset+tg.entry.Size, end)
				b, off := raw[lo-start:hi-start], lo-tg.entry.Offset
				if tg.t.Host != nil {
					copy(tg.t.Host[off:], b)
				} else if err := drv.CopyToDevice(tg.devCtx, tg.t.Device+uintptr(off), b); err != nil {
					return fmt.Errorf("%s: %w", tg.t.Name, err)
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return m, nil
}
