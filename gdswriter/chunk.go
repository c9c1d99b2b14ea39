package gdswriter

import (
	"cmp"
	"errors"
	"fmt"
	"hash/crc32"
	"runtime"
	"slices"
)

// DefaultChunkSize is the raw size of a chunk unless a caller asks otherwise:
// large enough for efficient direct I/O and compression, small enough that
// many chunks are in flight at once.
const DefaultChunkSize = 4 << 20

// DefaultWorkers is how many goroutines move chunks when a caller does not
// say: one per CPU, and at least four, so that a few direct I/O requests are
// in flight at once even on a small machine (a worker waiting for the disk
// uses no CPU).
func DefaultWorkers() int { return max(runtime.GOMAXPROCS(0), 4) }

// MaxChunkSize bounds the chunk size a data file may declare, so that a
// hostile or broken manifest cannot make a reader allocate without limit.
const MaxChunkSize = 256 << 20

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Chunk describes one stored chunk of a data file.
type Chunk struct {
	// Offset is where the chunk's extent starts in the data file; a
	// multiple of Alignment.
	Offset int64 `json:"off"`
	// Stored is the length of the encoded bytes. The extent on disk is
	// Stored rounded up to Alignment; the padding is zeros.
	Stored int64 `json:"len"`
	// Raw is the length after decoding.
	Raw int64 `json:"raw"`
	// Codec says how the chunk was encoded.
	Codec Codec `json:"codec"`
	// CRC is the CRC32C of the whole extent, padding included, so that
	// every byte of a data file is covered by a checksum.
	CRC uint32 `json:"crc"`
	// RawCRC is the CRC32C of the decoded bytes: an end-to-end check that
	// also catches a codec that decodes wrongly.
	RawCRC uint32 `json:"raw_crc"`
}

// Extent is the number of bytes the chunk occupies in the data file.
func (c Chunk) Extent() int64 { return alignUp(c.Stored) }

// ErrCorrupt is wrapped by every error that reports stored data that does not
// match its checksums or cannot be decoded.
var ErrCorrupt = errors.New("checkpoint data is corrupted")

// ChunkError reports a chunk that failed its checks.
type ChunkError struct {
	Path   string // the data file
	Index  int    // the chunk's index in the file's chunk table
	Offset int64  // the chunk's offset in the data file
	Reason string
}

func (e *ChunkError) Error() string {
	return fmt.Sprintf("%s: chunk %d at offset %d: %s", e.Path, e.Index, e.Offset, e.Reason)
}

func (e *ChunkError) Unwrap() error { return ErrCorrupt }

// ValidateChunks checks a chunk table against the data file it describes: the
// sizes a reader will allocate are bounded, every extent is aligned and lies
// inside the file, no two extents overlap and together they cover the whole file, every chunk but the last holds
// exactly chunkSize raw bytes, and the raw sizes add up to rawSize. It is
// what stands between a manifest read from disk and the allocations made to
// read it.
func ValidateChunks(chunks []Chunk, chunkSize, fileSize, rawSize int64) error {
	if chunkSize <= 0 || chunkSize > MaxChunkSize || chunkSize%Alignment != 0 {
		return fmt.Errorf("chunk size %d is not a positive multiple of %d up to %d", chunkSize, Alignment, MaxChunkSize)
	}
	if fileSize < 0 || rawSize < 0 {
		return fmt.Errorf("negative size")
	}
	var total, covered int64
	extents := make([][2]int64, 0, len(chunks))
	for i, c := range chunks {
		if _, err := ParseCodec(string(c.Codec)); err != nil {
			return fmt.Errorf("chunk %d: %w", i, err)
		}
		if c.Raw <= 0 || c.Raw > chunkSize {
			return fmt.Errorf("chunk %d: raw size %d outside 1..%d", i, c.Raw, chunkSize)
		}
		if i < len(chunks)-1 && c.Raw != chunkSize {
			return fmt.Errorf("chunk %d: raw size %d, but only the last chunk may be shorter than %d", i, c.Raw, chunkSize)
		}
		if c.Stored <= 0 || c.Stored > chunkSize {
			return fmt.Errorf("chunk %d: stored size %d outside 1..%d", i, c.Stored, chunkSize)
		}
		if c.Codec == CodecRaw && c.Stored != c.Raw {
			return fmt.Errorf("chunk %d: raw chunk with stored size %d != raw size %d", i, c.Stored, c.Raw)
		}
		if c.Offset < 0 || c.Offset%Alignment != 0 || c.Offset > fileSize-c.Extent() {
			return fmt.Errorf("chunk %d: extent at %d+%d is unaligned or outside the file (%d bytes)", i, c.Offset, c.Extent(), fileSize)
		}
		total += c.Raw
		covered += c.Extent()
		extents = append(extents, [2]int64{c.Offset, c.Offset + c.Extent()})
	}
	if total != rawSize {
		return fmt.Errorf("chunks hold %d raw bytes, file declares %d", total, rawSize)
	}
	if covered != fileSize {
		return fmt.Errorf("chunk extents cover %d bytes of a %d-byte file", covered, fileSize)
	}
	slices.SortFunc(extents, func(a, b [2]int64) int { return cmp.Compare(a[0], b[0]) })
	for i := 1; i < len(extents); i++ {
		if extents[i][0] < extents[i-1][1] {
			return fmt.Errorf("chunk extents overlap at offset %d", extents[i][0])
		}
	}
	return nil
}
