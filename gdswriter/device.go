package gdswriter

import (
	"context"
	"errors"
	"fmt"
	"os"
)

// DeviceIO moves whole raw chunks between device memory and a data file
// without passing them through host memory: cuFile, implemented above this
// package (package tensors, over package cuda), which gdswriter only calls.
// Such a chunk is written as it lies in device memory (codec raw, no
// padding), and its checksum is computed where the bytes are.
type DeviceIO interface {
	// Open registers an open data file for device I/O.
	Open(f *os.File) (DeviceFile, error)
}

// DeviceFile is a data file registered for device I/O. WriteAt and ReadAt
// are called from several goroutines at once.
type DeviceFile interface {
	// WriteAt writes src.Len bytes of device memory into the file at off
	// and returns their CRC32C.
	WriteAt(src DeviceSpan, off int64) (crc uint32, err error)
	// ReadAt reads dst.Len bytes of the file at off into device memory and
	// returns the CRC32C of the bytes as they landed there.
	ReadAt(dst DeviceSpan, off int64) (crc uint32, err error)
	// Close deregisters the file; it stays open.
	Close() error
}

// DeviceSpan is Len bytes of device memory at Offset into the buffer that
// starts at Base (the buffer a caller registered, so that Base+Offset need
// not be looked up).
type DeviceSpan struct {
	Base   uintptr
	Offset int64
	Len    int64
}

// UseDevice registers the file with io so that FillDevice can write whole
// chunks straight from device memory. It must come before any write. On
// error the Writer goes on without it, every chunk through host memory.
func (w *Writer) UseDevice(io DeviceIO) error {
	if w.rawSize > 0 || w.done {
		return errors.New("gdswriter: UseDevice after writing")
	}
	df, err := io.Open(w.file.f)
	if err != nil {
		return err
	}
	w.dev = df
	return nil
}

// FillDevice adds n bytes of device memory at base to the stream. With a
// device registered (UseDevice), every whole chunk among them that starts
// on a chunk boundary of the stream is written by a worker straight from
// device memory; the rest goes through fill into chunk buffers, as Fill
// does. The device memory must not change until Close returns.
func (w *Writer) FillDevice(n int64, base uintptr, fill func(dst []byte, off int64) error) error {
	if w.dev == nil {
		return w.Fill(n, fill)
	}
	return w.fillChunks(n, fill, func(off int64) (writeJob, error) {
		if err := w.writable(); err != nil {
			return writeJob{}, err
		}
		return writeJob{device: &DeviceSpan{Base: base, Offset: off, Len: int64(w.opts.ChunkSize)}}, nil
	})
}

// writeDeviceChunk writes one whole chunk straight from device memory at
// a fresh extent of the file: raw, and a multiple of Alignment long, so
// without padding, its stored and decoded checksums are the same.
func (w *Writer) writeDeviceChunk(job writeJob) error {
	n := job.device.Len
	off := w.fileEnd.Add(n) - n
	w.file.reserve(off + n)
	crc, err := w.dev.WriteAt(*job.device, off)
	if err != nil {
		return fmt.Errorf("write %s: chunk %d: %w", w.path, job.index, err)
	}
	w.mu.Lock()
	for len(w.chunks) <= job.index {
		w.chunks = append(w.chunks, Chunk{})
	}
	w.chunks[job.index] = Chunk{Offset: off, Stored: n, Raw: n, Codec: CodecRaw, CRC: crc, RawCRC: crc}
	w.mu.Unlock()
	w.deviceChunks.Add(1)
	if w.opts.Progress != nil {
		w.opts.Progress(n)
	}
	return nil
}

// closeDevice deregisters the file from device I/O.
func (w *Writer) closeDevice() {
	if w.dev != nil {
		w.dev.Close()
		w.dev = nil
	}
}

// DeviceReadable reports whether the chunk can be read straight into
// device memory: raw and without padding, so that its stored checksum
// covers exactly the bytes that land there.
func (c Chunk) DeviceReadable() bool {
	return c.Codec == CodecRaw && c.Stored == c.Raw && c.Raw%Alignment == 0
}

// OpenDevice registers the reader's file with io for ReadToDevice; the
// caller closes the DeviceFile before the Reader.
func (r *Reader) OpenDevice(io DeviceIO) (DeviceFile, error) {
	return io.Open(r.file.f)
}

// DeviceChunk is a chunk to read straight into device memory.
type DeviceChunk struct {
	Index int // in the file's chunk table
	Chunk Chunk
	Dst   DeviceSpan // Dst.Len must equal Chunk.Raw
}

// ReadToDevice reads the chunks straight into device memory through df,
// several at once, and checks each against its stored checksums, computed
// where the bytes landed. The first failure stops the work: a ChunkError
// for a chunk whose checksum does not match, whose device memory then
// holds its unverified bytes.
func (r *Reader) ReadToDevice(ctx context.Context, df DeviceFile, chunks []DeviceChunk, o ReadOptions) error {
	for _, dc := range chunks {
		if !dc.Chunk.DeviceReadable() || dc.Dst.Len != dc.Chunk.Raw {
			return fmt.Errorf("gdswriter: chunk %d (%s, %d of %d bytes) cannot be read straight into %d bytes of device memory",
				dc.Index, dc.Chunk.Codec, dc.Chunk.Stored, dc.Chunk.Raw, dc.Dst.Len)
		}
	}
	workers := o.Workers
	if workers <= 0 {
		workers = DefaultWorkers()
	}
	return forBlocks(ctx, len(chunks), 1, workers, func(k, _ int) error {
		dc := chunks[k]
		crc, err := df.ReadAt(dc.Dst, dc.Chunk.Offset)
		if err != nil {
			return fmt.Errorf("read %s: chunk %d: %w", r.path, dc.Index, err)
		}
		if crc != dc.Chunk.CRC || crc != dc.Chunk.RawCRC {
			return &ChunkError{Path: r.path, Index: dc.Index, Offset: dc.Chunk.Offset,
				Reason: fmt.Sprintf("checksum mismatch (stored CRC32C %08x, read %08x, computed in device memory)", dc.Chunk.CRC, crc)}
		}
		if o.Progress != nil {
			o.Progress(dc.Chunk.Raw)
		}
		return nil
	})
}
