package catalog

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stasis-ckpt/stasis/gdswriter"
)

// filesManifest is a valid manifest of kind files: a directory, two files
// and an empty one packed into one data file of two chunks, and a symlink.
func filesManifest() *Manifest {
	mt := time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.UTC)
	return &Manifest{
		Format:      FormatVersion,
		ID:          "0b1e2c3d-4e5f-4a6b-8c7d-8e9fa0b1c2d3",
		Kind:        KindFiles,
		Job:         "proj/run-1",
		Step:        1200,
		Created:     time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC),
		Host:        "node-7",
		Tags:        map[string]string{"branch": "main", "lr": "3e-4"},
		Bytes:       8292,
		StoredBytes: 12288,
		Files: []DataFile{{
			Name: "data.0000", Size: 12288, RawSize: 8292, ChunkSize: 8192,
			Chunks: []gdswriter.Chunk{
				{Offset: 4096, Stored: 8192, Raw: 8192, Codec: gdswriter.CodecRaw, CRC: 1, RawCRC: 2},
				{Offset: 0, Stored: 60, Raw: 100, Codec: gdswriter.CodecZstd, CRC: 3, RawCRC: 4},
			},
		}},
		Entries: []Entry{
			{Path: "proj", Type: EntryDir, Mode: 0o755, MTime: &mt},
			{Path: "proj/a.txt", Type: EntryFile, Mode: 0o644, MTime: &mt, Size: 8000},
			{Path: "proj/b.bin", Type: EntryFile, Mode: 0o600, MTime: &mt, Size: 292, Offset: 8000},
			{Path: "proj/empty", Type: EntryFile, Mode: 0o644, MTime: &mt, Offset: 8292},
			{Path: "proj/link", Type: EntrySymlink, Link: "../elsewhere/a.txt"},
		},
		Meta: json.RawMessage(`{"saved_by":"test"}`),
	}
}

// tensorsManifest is a valid manifest of kind tensors with attributes.
func tensorsManifest() *Manifest {
	return &Manifest{
		Format:      FormatVersion,
		ID:          "ffffffff-0000-4000-8000-000000000001",
		Kind:        KindTensors,
		Job:         "llama",
		Step:        -3,
		Created:     time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC),
		Host:        "gpu-0",
		Bytes:       4096 + 10,
		StoredBytes: 8192,
		Files: []DataFile{{
			Name: "rank0.data", Size: 8192, RawSize: 4106, ChunkSize: 4096,
			Chunks: []gdswriter.Chunk{
				{Offset: 0, Stored: 4096, Raw: 4096, Codec: gdswriter.CodecPlanes2},
				{Offset: 4096, Stored: 10, Raw: 10, Codec: gdswriter.CodecRaw},
			},
		}},
		Entries: []Entry{
			{Path: "model/embed.weight", Type: EntryTensor, Size: 4096, Attrs: json.RawMessage(`{"dtype":"bf16","shape":[32,64]}`)},
			{Path: "optimizer/step", Type: EntryTensor, Size: 10, Offset: 4096, Attrs: json.RawMessage(`{"dtype":"u8","shape":[10]}`)},
		},
		Meta: json.RawMessage(`{"world_size":1,"driver":"570.1"}`),
	}
}

// normManifest makes a parsed manifest comparable: JSON kept raw (meta,
// attrs) is re-indented by Marshal, an empty tag map is left out by it, and
// times keep their instant but not their location pointer.
func normManifest(t testing.TB, m *Manifest) *Manifest {
	t.Helper()
	c := *m
	if len(c.Tags) == 0 {
		c.Tags = nil
	}
	c.Created = c.Created.UTC()
	c.Meta = canonJSON(t, c.Meta)
	c.Entries = make([]Entry, len(m.Entries))
	for i, e := range m.Entries {
		if e.MTime != nil {
			mt := e.MTime.UTC()
			e.MTime = &mt
		}
		e.Attrs = canonJSON(t, e.Attrs)
		c.Entries[i] = e
	}
	return &c
}

// canonJSON re-encodes a JSON value in one canonical form (numbers kept as
// written, object keys sorted, no space).
func canonJSON(t testing.TB, raw json.RawMessage) json.RawMessage {
	t.Helper()
	if len(raw) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("raw JSON %q does not decode: %v", raw, err)
	}
	out, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("raw JSON %q does not encode: %v", raw, err)
	}
	return out
}

// checkRoundTrip requires that m marshals, parses back to the same value,
// and marshals again to the same bytes.
func checkRoundTrip(t testing.TB, m *Manifest) []byte {
	t.Helper()
	data, err := m.Marshal()
	if err != nil {
		t.Fatalf("Marshal: %v", err)
	}
	back, err := ParseManifest(data)
	if err != nil {
		t.Fatalf("ParseManifest(Marshal(m)): %v\n%s", err, data)
	}
	if a, b := normManifest(t, m), normManifest(t, back); !reflect.DeepEqual(a, b) {
		t.Fatalf("round trip changed the manifest\nbefore %+v\nafter  %+v", a, b)
	}
	again, err := back.Marshal()
	if err != nil {
		t.Fatalf("Marshal of the parsed manifest: %v", err)
	}
	if !bytes.Equal(again, data) {
		t.Fatalf("Marshal is not stable:\n%s\n---\n%s", data, again)
	}
	return data
}

func TestManifestRoundTrip(t *testing.T) {
	for _, m := range []*Manifest{filesManifest(), tensorsManifest(), {
		Format: FormatVersion, ID: "12345678-1234-4234-8234-123456789abc", Kind: KindProcess,
		Job: "j", Created: time.Unix(0, 0).UTC(), Host: "h",
	}} {
		data := checkRoundTrip(t, m)
		if !bytes.HasPrefix(data, []byte(manifestMagic+" 1 sha256=")) {
			t.Errorf("header: %q", data[:min(len(data), 90)])
		}
	}
	// Timestamps in another zone keep their instant.
	m := filesManifest()
	m.Created = time.Date(2025, 1, 2, 3, 4, 5, 6, time.FixedZone("X", 5*3600+1800))
	data := checkRoundTrip(t, m)
	back, _ := ParseManifest(data)
	if !back.Created.Equal(m.Created) {
		t.Errorf("created %v came back as %v", m.Created, back.Created)
	}
}

func TestManifestDamage(t *testing.T) {
	data, err := filesManifest().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	// Every byte matters: the header's syntax, version and checksum, and
	// every byte of the body under the checksum.
	for i := range data {
		for _, x := range []byte{0xff, 0x01} {
			bad := bytes.Clone(data)
			bad[i] ^= x
			if _, err := ParseManifest(bad); !errors.Is(err, ErrBadManifest) {
				t.Fatalf("byte %d ^ %#x (%q): ParseManifest = %v, want ErrBadManifest", i, x, data[i], err)
			}
		}
	}
	header, body, _ := bytes.Cut(data, []byte("\n"))
	for name, bad := range map[string][]byte{
		"empty":                 nil,
		"header only":           header,
		"header and newline":    append(bytes.Clone(header), '\n'),
		"no header":             body,
		"truncated body":        data[:len(data)-10],
		"appended byte":         append(bytes.Clone(data), ' '),
		"version 2":             bytes.Replace(data, []byte(" 1 sha256"), []byte(" 2 sha256"), 1),
		"short checksum":        bytes.Replace(data, header, header[:len(header)-2], 1),
		"other magic":           bytes.Replace(data, []byte(manifestMagic), []byte("stasis-manifesto"), 1),
		"valid JSON, no header": []byte(`{"format":1}`),
	} {
		if _, err := ParseManifest(bad); !errors.Is(err, ErrBadManifest) {
			t.Errorf("%s: ParseManifest = %v, want ErrBadManifest", name, err)
		}
	}
}

// TestManifestBodyChecks feeds bodies with a correct checksum, so that the
// JSON decoder and Validate are what must refuse them.
func TestManifestBodyChecks(t *testing.T) {
	body, err := json.MarshalIndent(filesManifest(), "", " ")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseManifest(withHeader(body)); err != nil {
		t.Fatalf("valid body refused: %v", err)
	}
	for name, bad := range map[string]string{
		"unknown top-level field": strings.Replace(string(body), "{", `{"extra": 1,`, 1),
		"unknown entry field":     strings.Replace(string(body), `"path": "proj/a.txt",`, `"path": "proj/a.txt", "owner": "root",`, 1),
		"unknown chunk field":     strings.Replace(string(body), `"raw_crc": 2`, `"raw_crc": 2, "sha": "x"`, 1),
		"unknown data file field": strings.Replace(string(body), `"name": "data.0000",`, `"name": "data.0000", "path": "/x",`, 1),
		"trailing JSON":           string(body) + "{}",
		"trailing garbage":        string(body) + "]",
		"not an object":           "[1, 2]",
		"empty body":              "",
		"wrong type":              strings.Replace(string(body), `"step": 1200`, `"step": "1200"`, 1),
		"truncated JSON":          string(body[:len(body)/2]),
	} {
		if bad == string(body) {
			t.Fatalf("%s: the replacement did not apply", name)
		}
		_, err := ParseManifest(withHeader([]byte(bad)))
		if !errors.Is(err, ErrBadManifest) {
			t.Errorf("%s: ParseManifest = %v, want ErrBadManifest", name, err)
		}
	}
}

func TestManifestValidate(t *testing.T) {
	cases := map[string]func(m *Manifest){
		"format 0":                  func(m *Manifest) { m.Format = 0 },
		"format 2":                  func(m *Manifest) { m.Format = 2 },
		"id not a UUID":             func(m *Manifest) { m.ID = "not-a-uuid" },
		"id upper case":             func(m *Manifest) { m.ID = strings.ToUpper(m.ID) },
		"id without dashes":         func(m *Manifest) { m.ID = strings.ReplaceAll(m.ID, "-", "") },
		"id as URN":                 func(m *Manifest) { m.ID = "urn:uuid:" + m.ID },
		"id in braces":              func(m *Manifest) { m.ID = "{" + m.ID + "}" },
		"id empty":                  func(m *Manifest) { m.ID = "" },
		"kind unknown":              func(m *Manifest) { m.Kind = "weights" },
		"kind empty":                func(m *Manifest) { m.Kind = "" },
		"job empty":                 func(m *Manifest) { m.Job = "" },
		"job with leading space":    func(m *Manifest) { m.Job = " j" },
		"job with a newline":        func(m *Manifest) { m.Job = "a\nb" },
		"job too long":              func(m *Manifest) { m.Job = strings.Repeat("x", 201) },
		"job not UTF-8":             func(m *Manifest) { m.Job = "a\xffb" },
		"tag key invalid":           func(m *Manifest) { m.Tags = map[string]string{"a b": "c"} },
		"tag value with control":    func(m *Manifest) { m.Tags = map[string]string{"k": "\x01"} },
		"meta not an object":        func(m *Manifest) { m.Meta = json.RawMessage(`[1]`) },
		"meta null":                 func(m *Manifest) { m.Meta = json.RawMessage(`null`) },
		"meta not JSON":             func(m *Manifest) { m.Meta = json.RawMessage(`{`) },
		"data file named manifest":  func(m *Manifest) { m.Files[0].Name = "manifest" },
		"data file with a slash":    func(m *Manifest) { m.Files[0].Name = "../data" },
		"data file name empty":      func(m *Manifest) { m.Files[0].Name = "" },
		"data file named twice":     func(m *Manifest) { m.Files = append(m.Files, m.Files[0]); m.Bytes *= 2; m.StoredBytes *= 2 },
		"bad chunk table":           func(m *Manifest) { m.Files[0].ChunkSize = 5000 },
		"chunk past the file":       func(m *Manifest) { m.Files[0].Chunks[1].Offset = 12288 },
		"bytes total wrong":         func(m *Manifest) { m.Bytes++ },
		"stored total wrong":        func(m *Manifest) { m.StoredBytes-- },
		"entry path ../x":           func(m *Manifest) { m.Entries[1].Path = "../x" },
		"entry path a/../../x":      func(m *Manifest) { m.Entries[1].Path = "proj/../../x" },
		"entry path ..":             func(m *Manifest) { m.Entries[1].Path = ".." },
		"entry path /abs":           func(m *Manifest) { m.Entries[1].Path = "/abs" },
		"entry path a//b":           func(m *Manifest) { m.Entries[1].Path = "proj//a.txt" },
		"entry path a/./b":          func(m *Manifest) { m.Entries[1].Path = "proj/./a.txt" },
		"entry path trailing slash": func(m *Manifest) { m.Entries[0].Path = "proj/" },
		"entry path empty":          func(m *Manifest) { m.Entries[1].Path = "" },
		"entry path dot":            func(m *Manifest) { m.Entries[1].Path = "." },
		"entry path with NUL":       func(m *Manifest) { m.Entries[1].Path = "proj/a\x00" },
		"entry path not UTF-8":      func(m *Manifest) { m.Entries[1].Path = "proj/\xff" },
		"entry path too long":       func(m *Manifest) { m.Entries[1].Path = strings.Repeat("a", 4097) },
		"entry path duplicate":      func(m *Manifest) { m.Entries[2].Path = m.Entries[1].Path },
		"entry past the data":       func(m *Manifest) { m.Entries[2].Size = 293 },
		"entry offset past the data": func(m *Manifest) {
			m.Entries[3].Offset = 8293
		},
		"entry negative size":      func(m *Manifest) { m.Entries[2].Size = -1 },
		"entry negative offset":    func(m *Manifest) { m.Entries[1].Offset = -1 },
		"entry huge size":          func(m *Manifest) { m.Entries[1].Size = 1<<63 - 1 },
		"entry in a missing file":  func(m *Manifest) { m.Entries[1].File = 1 },
		"entry in file -1":         func(m *Manifest) { m.Entries[1].File = -1 },
		"dir with data":            func(m *Manifest) { m.Entries[0].Size = 1 },
		"dir with an offset":       func(m *Manifest) { m.Entries[0].Offset = 1 },
		"symlink in a data file":   func(m *Manifest) { m.Entries[4].File = 1 },
		"symlink without a target": func(m *Manifest) { m.Entries[4].Link = "" },
		"symlink target with NUL":  func(m *Manifest) { m.Entries[4].Link = "a\x00b" },
		"entry type unknown":       func(m *Manifest) { m.Entries[1].Type = "fifo" },
		"entry mode beyond perms":  func(m *Manifest) { m.Entries[1].Mode = 0o10644 },
		"entry attrs not JSON":     func(m *Manifest) { m.Entries[1].Attrs = json.RawMessage(`{"a":`) },
		"entry below a symlink":    func(m *Manifest) { m.Entries[2].Path = "proj/link/b.bin" },
		"dir below a symlink":      func(m *Manifest) { m.Entries = append(m.Entries, Entry{Path: "proj/link/d", Type: EntryDir}) },
		"symlink below a symlink": func(m *Manifest) {
			m.Entries = append(m.Entries, Entry{Path: "proj/link/x/l", Type: EntrySymlink, Link: "/"})
		},
	}
	for name, mutate := range cases {
		m := filesManifest()
		mutate(m)
		err := m.Validate()
		if !errors.Is(err, ErrBadManifest) {
			t.Errorf("%s: Validate = %v, want ErrBadManifest", name, err)
			continue
		}
		if _, err := m.Marshal(); !errors.Is(err, ErrBadManifest) {
			t.Errorf("%s: Marshal = %v, want ErrBadManifest", name, err)
		}
		// The same manifest with a valid checksum is refused on reading
		// (JSON cannot carry invalid UTF-8, which Marshal would replace).
		if body, err := json.Marshal(m); err == nil && !strings.Contains(name, "UTF-8") {
			if _, err := ParseManifest(withHeader(body)); !errors.Is(err, ErrBadManifest) {
				t.Errorf("%s: ParseManifest = %v, want ErrBadManifest", name, err)
			}
		}
	}
	// Things that are fine.
	for name, mutate := range map[string]func(m *Manifest){
		"no tags":                 func(m *Manifest) { m.Tags = nil },
		"no meta":                 func(m *Manifest) { m.Meta = nil },
		"no entries":              func(m *Manifest) { m.Entries = nil },
		"no files nor entries":    func(m *Manifest) { m.Files, m.Entries, m.Bytes, m.StoredBytes = nil, nil, 0, 0 },
		"symlink to anywhere":     func(m *Manifest) { m.Entries[4].Link = "/etc/passwd" },
		"sibling of a symlink":    func(m *Manifest) { m.Entries[2].Path = "proj/linked" },
		"file without a dir":      func(m *Manifest) { m.Entries[1].Path = "top.txt" },
		"unicode path":            func(m *Manifest) { m.Entries[1].Path = "proj/résumé ✓.txt" },
		"dotfile":                 func(m *Manifest) { m.Entries[1].Path = "proj/.hidden" },
		"entry ending at the end": func(m *Manifest) { m.Entries[2].Size = 292 },
		"setuid mode":             func(m *Manifest) { m.Entries[1].Mode = 0o4755 },
	} {
		m := filesManifest()
		mutate(m)
		if err := m.Validate(); err != nil {
			t.Errorf("%s: Validate = %v", name, err)
			continue
		}
		checkRoundTrip(t, m)
	}
}

func TestValidEntryPath(t *testing.T) {
	for p, want := range map[string]bool{
		"a": true, "a/b": true, "a/b.c/d": true, ".a": true, "a..b": true, "...": true, "a/...": true,
		"": false, ".": false, "..": false, "../a": false, "a/..": false, "a/../b": false, "/a": false,
		"a/": false, "a//b": false, "./a": false, "a/./b": false, "a\x00": false,
	} {
		if got := ValidEntryPath(p); got != want {
			t.Errorf("ValidEntryPath(%q) = %v, want %v", p, got, want)
		}
	}
}

// TestManifestTooLargeToRead: a manifest no reader would take (over 256
// MiB) is refused when it is written, so no checkpoint is listed that
// cannot be opened.
func TestManifestTooLargeToRead(t *testing.T) {
	m := &Manifest{Format: FormatVersion, ID: "12345678-1234-4234-8234-123456789abc", Kind: KindTensors,
		Job: "j", Created: time.Unix(0, 0).UTC(), Host: "h"}
	element := `"` + strings.Repeat("x", 1000) + `",`
	m.Meta = json.RawMessage(`{"state":[` + strings.Repeat(element, maxManifestSize/1000) + `0]}`)
	if _, err := m.Marshal(); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "a reader accepts") {
		t.Fatalf("Marshal of a manifest too large to read: %v", err)
	}
}
