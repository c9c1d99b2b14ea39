package checkpoint

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stasis-ckpt/stasis/criu"
)

// TestConfirmCRIU: the version CRIU logged during the dump is the one the
// checkpoint records, whatever stasis went by, and a CRIU older than
// criu.MinVersion fails the dump (the post-dump step: CRIU then resumes the
// tree), its version corrected in the cache.
func TestConfirmCRIU(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "criu")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho 'Version: 4.1.1'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cache, work := filepath.Join(dir, "cache"), t.TempDir()
	o := criu.Options{Path: fake, Version: 40101}
	writeLog := func(version string) {
		t.Helper()
		text := "(00.000000) CRIU run id = 1\n(00.000050) Version: " + version + " (gitid 0)\n(00.000060) Running on x\n"
		if err := os.WriteFile(filepath.Join(work, criu.DumpLog), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	writeLog("4.2.1")
	var meta Meta
	if err := confirmCRIU(o, cache, work, &meta); err != nil || meta.CRIUVersion != "4.2.1" {
		t.Fatalf("CRIU 4.2.1 logged: %v, recorded %q", err, meta.CRIUVersion)
	}
	if _, v, err := criu.ResolveCached(fake, cache); err != nil || v != 40201 {
		t.Fatalf("the cache after 4.2.1 was logged: %d, %v", v, err)
	}

	writeLog("3.17.1")
	if err := confirmCRIU(o, cache, work, &meta); !errors.Is(err, criu.ErrTooOld) || meta.CRIUVersion != "3.17.1" {
		t.Fatalf("CRIU 3.17.1 logged: %v, recorded %q", err, meta.CRIUVersion)
	}

	// A log without a version line leaves the version stasis went by.
	if err := os.WriteFile(filepath.Join(work, criu.DumpLog), []byte("(00.000000) CRIU run id = 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := confirmCRIU(o, cache, work, &meta); err != nil || meta.CRIUVersion != "4.1.1" {
		t.Fatalf("no version logged: %v, recorded %q", err, meta.CRIUVersion)
	}
}
