package catalog

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/stasis-ckpt/stasis/gdswriter"
)

// FormatVersion is the manifest format this package writes and reads.
const FormatVersion = 1

// manifestMagic starts the first line of every manifest file.
const manifestMagic = "stasis-manifest"

// maxManifestSize bounds what ParseManifest accepts (a checkpoint of 32 GiB
// in 4 MiB chunks needs about 1.5 MiB).
const maxManifestSize = 256 << 20

// Kind says what a checkpoint holds.
type Kind string

const (
	KindFiles   Kind = "files"   // files and directories saved by `stasis save`
	KindTensors Kind = "tensors" // named buffers saved by a training loop
	KindProcess Kind = "process" // a CRIU image of a process tree
)

func (k Kind) valid() bool {
	return k == KindFiles || k == KindTensors || k == KindProcess || k == KindJob
}

// Entry types.
const (
	EntryFile    = "file"
	EntryDir     = "dir"
	EntrySymlink = "symlink"
	EntryTensor  = "tensor"
)

// Manifest describes one checkpoint: who made it, which data files it has
// and how their chunks are encoded, and which entries (files, tensors) live
// where in those files' byte streams.
type Manifest struct {
	Format      int               `json:"format"`
	ID          string            `json:"id"`
	Kind        Kind              `json:"kind"`
	Job         string            `json:"job"`
	Step        int64             `json:"step"`
	Created     time.Time         `json:"created"`
	Host        string            `json:"host"`
	Tags        map[string]string `json:"tags,omitempty"`
	Bytes       int64             `json:"bytes"`        // logical bytes: the sum of the data files' raw sizes
	StoredBytes int64             `json:"stored_bytes"` // bytes on disk: the sum of the data files' sizes
	Files       []DataFile        `json:"files"`
	Entries     []Entry           `json:"entries"`
	// Meta holds what a kind records beyond the entries (CRIU version,
	// driver version, ...), as a JSON object.
	Meta json.RawMessage `json:"meta,omitempty"`
}

// DataFile is one data file of a checkpoint and its chunk table.
type DataFile struct {
	Name      string            `json:"name"`       // file name inside the checkpoint directory
	Size      int64             `json:"size"`       // bytes on disk
	RawSize   int64             `json:"raw_size"`   // bytes of the decoded stream
	ChunkSize int64             `json:"chunk_size"` // raw bytes per chunk
	Chunks    []gdswriter.Chunk `json:"chunks"`
}

// NewDataFile describes the data file name that a gdswriter.Writer wrote.
func NewDataFile(name string, res gdswriter.Result) DataFile {
	return DataFile{Name: name, Size: res.Size, RawSize: res.RawSize, ChunkSize: res.ChunkSize, Chunks: res.Chunks}
}

// Entry is one named object whose bytes (if any) are the range
// [Offset, Offset+Size) of data file File's decoded stream.
type Entry struct {
	Path   string          `json:"path"` // slash-separated and relative
	Type   string          `json:"type"`
	Mode   uint32          `json:"mode,omitempty"` // permission bits
	MTime  *time.Time      `json:"mtime,omitempty"`
	Size   int64           `json:"size"`
	File   int             `json:"file"`
	Offset int64           `json:"offset"`
	Link   string          `json:"link,omitempty"`  // symlink target
	Attrs  json.RawMessage `json:"attrs,omitempty"` // per-type attributes (a tensor's dtype and shape)
}

// hasData reports whether the entry's bytes live in a data file.
func (e Entry) hasData() bool { return e.Type == EntryFile || e.Type == EntryTensor }

var (
	dataFileName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	tagKey       = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$`)
)

// ValidateJob checks a job name: 1 to 200 printable characters, no spaces
// at either end.
func ValidateJob(job string) error {
	if job == "" || len(job) > 200 || !utf8.ValidString(job) || strings.TrimSpace(job) != job {
		return fmt.Errorf("%w: job name %q must be 1 to 200 characters with no leading or trailing space", ErrInvalid, job)
	}
	for _, r := range job {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%w: job name %q has a control character", ErrInvalid, job)
		}
	}
	return nil
}

// ValidateTags checks tag keys (letters, digits, '.', '_', '/', '-'; up to 63)
// and values (up to 256 printable characters).
func ValidateTags(tags map[string]string) error {
	for k, v := range tags {
		if !tagKey.MatchString(k) {
			return fmt.Errorf("%w: tag key %q: use letters, digits, '.', '_', '/', '-' (up to 63)", ErrInvalid, k)
		}
		if len(v) > 256 || !utf8.ValidString(v) || strings.ContainsFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return fmt.Errorf("%w: tag %s: value must be up to 256 printable characters", ErrInvalid, k)
		}
	}
	return nil
}

// ValidEntryPath reports whether p may name an entry: relative,
// slash-separated, clean, without "..", and not empty. Loading never writes
// outside its target directory because of it.
func ValidEntryPath(p string) bool {
	if p == "" || p == "." || len(p) > 4096 || !utf8.ValidString(p) || strings.ContainsRune(p, 0) {
		return false
	}
	if strings.HasPrefix(p, "/") || path.Clean(p) != p {
		return false
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return false
		}
	}
	return true
}

// Validate checks everything a reader relies on: identity fields, kinds,
// names, chunk tables (through gdswriter.ValidateChunks), entry ranges and
// totals.
func (m *Manifest) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadManifest, fmt.Sprintf(format, args...))
	}
	if m.Format != FormatVersion {
		return bad("format %d, this stasis reads format %d", m.Format, FormatVersion)
	}
	if _, err := uuid.Parse(m.ID); err != nil || len(m.ID) != 36 || strings.ToLower(m.ID) != m.ID {
		return bad("id %q is not a lower-case UUID", m.ID)
	}
	if !m.Kind.valid() {
		return bad("unknown kind %q", m.Kind)
	}
	if err := ValidateJob(m.Job); err != nil {
		return bad("%v", err)
	}
	if err := ValidateTags(m.Tags); err != nil {
		return bad("%v", err)
	}
	if len(m.Meta) > 0 && (!json.Valid(m.Meta) || bytes.TrimSpace(m.Meta)[0] != '{') {
		return bad("meta is not a JSON object")
	}
	if m.Kind == KindJob {
		if err := validateJobManifest(m); err != nil {
			return err
		}
	}
	var raw, stored int64
	names := make(map[string]bool, len(m.Files))
	for i, f := range m.Files {
		if !dataFileName.MatchString(f.Name) || f.Name == manifestName || names[f.Name] {
			return bad("data file %d has an invalid or repeated name %q", i, f.Name)
		}
		names[f.Name] = true
		if err := gdswriter.ValidateChunks(f.Chunks, f.ChunkSize, f.Size, f.RawSize); err != nil {
			return bad("data file %s: %v", f.Name, err)
		}
		raw += f.RawSize
		stored += f.Size
	}
	if raw != m.Bytes || stored != m.StoredBytes {
		return bad("totals bytes=%d stored_bytes=%d do not match the data files (%d, %d)", m.Bytes, m.StoredBytes, raw, stored)
	}
	types := make(map[string]string, len(m.Entries))
	for i, e := range m.Entries {
		if !ValidEntryPath(e.Path) || types[e.Path] != "" {
			return bad("entry %d has an invalid or repeated path %q", i, e.Path)
		}
		types[e.Path] = e.Type
		if len(e.Attrs) > 0 && !json.Valid(e.Attrs) {
			return bad("entry %s: attrs are not JSON", e.Path)
		}
		switch e.Type {
		case EntryFile, EntryTensor:
			if e.File < 0 || e.File >= len(m.Files) {
				return bad("entry %s: data file %d does not exist", e.Path, e.File)
			}
			if e.Size < 0 || e.Offset < 0 || e.Offset > m.Files[e.File].RawSize-e.Size {
				return bad("entry %s: range %d+%d lies outside data file %s", e.Path, e.Offset, e.Size, m.Files[e.File].Name)
			}
		case EntryDir, EntrySymlink:
			if e.Size != 0 || e.Offset != 0 || e.File != 0 {
				return bad("entry %s: a %s holds no data", e.Path, e.Type)
			}
			if e.Type == EntrySymlink && (e.Link == "" || strings.ContainsRune(e.Link, 0)) {
				return bad("entry %s: symlink without a target", e.Path)
			}
		default:
			return bad("entry %s: unknown type %q", e.Path, e.Type)
		}
		if e.Mode&^0o7777 != 0 {
			return bad("entry %s: mode %o has bits beyond permissions", e.Path, e.Mode)
		}
	}
	// An entry below a symlink entry would be written through the link,
	// outside the directory the checkpoint is loaded into.
	for _, e := range m.Entries {
		for dir := path.Dir(e.Path); dir != "."; dir = path.Dir(dir) {
			if types[dir] == EntrySymlink {
				return bad("entry %s lies below symlink %s", e.Path, dir)
			}
		}
	}
	return nil
}

// Marshal encodes a valid manifest in its file form: a header line with the
// SHA-256 of the JSON body, then the body.
func (m *Manifest) Marshal() ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	body, err := json.MarshalIndent(m, "", " ")
	if err != nil {
		return nil, err
	}
	body = append(body, '\n')
	sum := sha256.Sum256(body)
	out := fmt.Appendf(nil, "%s %d sha256=%s\n", manifestMagic, FormatVersion, hex.EncodeToString(sum[:]))
	out = append(out, body...)
	if len(out) > maxManifestSize {
		// Refused here, so that no checkpoint is listed that no reader takes.
		return nil, fmt.Errorf("%w: the manifest would be %d bytes, more than the %d a reader accepts", ErrInvalid, len(out), maxManifestSize)
	}
	return out, nil
}

// ParseManifest decodes and validates a manifest file. Every failure wraps
// ErrBadManifest.
func ParseManifest(data []byte) (*Manifest, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadManifest, fmt.Sprintf(format, args...))
	}
	if len(data) > maxManifestSize {
		return nil, bad("%d bytes, more than the %d allowed", len(data), maxManifestSize)
	}
	header, body, ok := bytes.Cut(data, []byte("\n"))
	if !ok {
		return nil, bad("no header line")
	}
	var version int
	var sumHex string
	if n, err := fmt.Sscanf(string(header), manifestMagic+" %d sha256=%s", &version, &sumHex); err != nil || n != 2 {
		return nil, bad("header %q is not %q", truncate(header, 80), manifestMagic+" N sha256=HEX")
	}
	if version > FormatVersion {
		// It wraps ErrBadManifest too (this stasis cannot read it), but
		// says what it is: callers tell it apart first.
		return nil, fmt.Errorf("%w (%w): the manifest is of format %d, this stasis reads format %d and older: use a newer stasis", ErrNewerFormat, ErrBadManifest, version, FormatVersion)
	}
	if version != FormatVersion {
		return nil, bad("format %d, this stasis reads format %d", version, FormatVersion)
	}
	want, err := hex.DecodeString(sumHex)
	if err != nil || len(want) != sha256.Size {
		return nil, bad("header checksum %q is not a SHA-256", truncate([]byte(sumHex), 80))
	}
	if got := sha256.Sum256(body); !bytes.Equal(got[:], want) {
		return nil, bad("checksum mismatch: the manifest was changed or damaged")
	}
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, bad("%v", err)
	}
	if len(bytes.TrimLeft(body[dec.InputOffset():], " \t\r\n")) > 0 {
		return nil, bad("trailing data after the JSON body")
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}
