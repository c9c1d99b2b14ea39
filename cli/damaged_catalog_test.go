package cli_test

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stasis-ckpt/stasis/cli"
)

// copyStore copies a store's directory (cp -a) to a new one.
func copyStore(t *testing.T, from string) string {
	t.Helper()
	to := filepath.Join(t.TempDir(), "home")
	if out, err := exec.Command("cp", "-a", from, to).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	return to
}

// activeMeta is the offset of the meta page of catalog.db with the higher
// transaction ID (bbolt's meta: page header 16 bytes, then magic,
// version, page size, flags, root bucket (16), freelist, pgid, txid).
func activeMeta(t *testing.T, db []byte) int {
	t.Helper()
	txid := func(off int) uint64 { return binary.LittleEndian.Uint64(db[off+16+4+4+4+4+16+8+8:]) }
	pageSize := int(binary.LittleEndian.Uint32(db[16+8:]))
	if txid(pageSize) > txid(0) {
		return pageSize
	}
	return 0
}

// TestDamagedCatalogNeverCrashes damages a real catalog.db the ways the
// fault trials did (cut to 8 to 20 KiB, a bad byte in the active meta
// page or in a page's header or body) and runs `stasis ls` on each copy:
// it never crashes (no Go panic or fault, no exit 2), and exits either 16
// with one line saying the catalog was moved aside and rebuilt, or 0 with
// every checkpoint listed (or a warning naming those it could not list).
// The next ls lists every checkpoint. `catalog rebuild` recovers every
// damaged copy without reading the damaged file.
func TestDamagedCatalogNeverCrashes(t *testing.T) {
	home, tmp := t.TempDir(), t.TempDir()
	tree := writeTree(t, tmp, 1, 1000)
	var want []string
	for i := range 40 {
		want = append(want, save(t, home, fmt.Sprintf("job-with-a-long-name-%02d", i%7), i, "--tag", "note="+strings.Repeat("x", 200), tree))
	}
	slices.Sort(want)
	good, err := os.ReadFile(filepath.Join(home, "catalog.db"))
	if err != nil {
		t.Fatal(err)
	}
	pageSize := int(binary.LittleEndian.Uint32(good[16+8:]))
	meta := activeMeta(t, good)
	t.Logf("catalog.db: %d bytes, %d-byte pages, active meta at %d", len(good), pageSize, meta)

	type damage struct {
		name string
		do   func([]byte) []byte
	}
	var cases []damage
	for _, n := range []int{8 << 10, 12 << 10, 16 << 10, 20 << 10} {
		if n < len(good) {
			cases = append(cases, damage{fmt.Sprintf("cut to %d KiB", n>>10), func(b []byte) []byte { return b[:n] }})
		}
	}
	flip := func(off int) func([]byte) []byte {
		return func(b []byte) []byte { b[off] ^= 0x5a; return b }
	}
	for _, off := range []int{16 + 4, 16 + 8 + 4, 16 + 24, 16 + 40, 16 + 48} {
		cases = append(cases, damage{fmt.Sprintf("meta byte %d", off), flip(meta + off)})
	}
	for p := 2; p*pageSize < len(good); p++ {
		for _, off := range []int{0, 8, 10, 12, 16, 40} {
			cases = append(cases, damage{fmt.Sprintf("page %d byte %d", p, off), flip(p*pageSize + off)})
		}
	}
	crash := regexp.MustCompile(`panic|fatal error|goroutine |SIGBUS|SIGSEGV`)
	var rebuilt, unnoticed int
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := copyStore(t, home)
			if err := os.WriteFile(filepath.Join(h, "catalog.db"), c.do(slices.Clone(good)), 0o600); err != nil {
				t.Fatal(err)
			}
			r := run(t, h, "ls", "--json")
			if crash.MatchString(r.stderr) {
				t.Fatalf("ls crashed: exit %d: %s", r.code, r.stderr)
			}
			switch r.code {
			case cli.ExitDamaged:
				expectCode(t, r, cli.ExitDamaged, `the catalog is damaged: `+regexp.QuoteMeta(filepath.Join(h, "catalog.db"))+` \(.*\); moved it to `+regexp.QuoteMeta(filepath.Join(h, "catalog.db"))+`\.damaged-\S+ and rebuilt the catalog from the manifests \(40 checkpoints\): run the command again`)
				aside, _ := filepath.Glob(filepath.Join(h, "catalog.db.damaged-*"))
				if len(aside) != 1 {
					t.Fatalf("the damaged catalog was not kept aside: %v", aside)
				}
				rebuilt++
			case 0:
				var got []string
				var recs []record
				if err := jsonDecode([]byte(r.stdout), &recs); err != nil {
					t.Fatal(err)
				}
				for _, rec := range recs {
					got = append(got, rec.ID)
				}
				slices.Sort(got)
				if !slices.Equal(got, want) && !strings.Contains(r.stderr, "are not in the catalog and not listed here") {
					t.Fatalf("ls exited 0 listing %d of %d checkpoints, and said nothing: %s", len(got), len(want), r.stderr)
				}
				unnoticed++
			default:
				t.Fatalf("ls: exit %d: %s", r.code, r.stderr)
			}
			if got := list(t, h); len(got) != len(want) && !strings.Contains(run(t, h, "ls").stderr, "not in the catalog") {
				t.Fatalf("the ls after lists %d of %d", len(got), len(want))
			}

			// catalog rebuild of the damaged file, never read.
			h = copyStore(t, home)
			os.WriteFile(filepath.Join(h, "catalog.db"), c.do(slices.Clone(good)), 0o600)
			rb := run(t, h, "catalog", "rebuild")
			if rb.code != 0 || crash.MatchString(rb.stderr) || !strings.Contains(rb.stdout, "indexed 40 checkpoints") {
				t.Fatalf("catalog rebuild: exit %d: %s%s", rb.code, rb.stdout, rb.stderr)
			}
			if got := list(t, h); len(got) != len(want) {
				t.Fatalf("after catalog rebuild ls lists %d of %d", len(got), len(want))
			}
		})
	}
	t.Logf("%d damage cases: %d detected and rebuilt, %d harmless to ls", len(cases), rebuilt, unnoticed)
}
