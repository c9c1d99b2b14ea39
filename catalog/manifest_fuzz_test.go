package catalog

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzParseManifest feeds arbitrary bytes to ParseManifest. It must never
// panic, every refusal must wrap ErrBadManifest, and every manifest it
// accepts must marshal and parse back to an equal value. Each input is
// tried as it is and again with a correct header in front of its body, so
// that the fuzzer gets past the checksum to the JSON decoder and Validate.
// The seed corpus is in testdata/fuzz/FuzzParseManifest.
func FuzzParseManifest(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzCheckManifest(t, data)
		body := data
		if header, rest, ok := bytes.Cut(data, []byte("\n")); ok && bytes.HasPrefix(header, []byte(manifestMagic)) {
			body = rest
		}
		fuzzCheckManifest(t, withHeader(body))
	})
}

func fuzzCheckManifest(t *testing.T, data []byte) {
	m, err := ParseManifest(data)
	if err != nil {
		if !errors.Is(err, ErrBadManifest) {
			t.Fatalf("ParseManifest error does not wrap ErrBadManifest: %v", err)
		}
		if m != nil {
			t.Fatalf("ParseManifest returned a manifest with an error")
		}
		return
	}
	if err := m.Validate(); err != nil {
		t.Fatalf("accepted manifest does not validate: %v", err)
	}
	checkRoundTrip(t, m)
}
