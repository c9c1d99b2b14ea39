package cli_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stasis-ckpt/stasis/cli"
)

// exportTo writes checkpoint id of home into a file and returns its path.
func exportTo(t *testing.T, home, id string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), id+".tar")
	mustRun(t, home, "export", id, "-o", file)
	return file
}

// importFile imports file into home and returns the ID it printed last.
func importFile(t *testing.T, home, file string) string {
	t.Helper()
	r := mustRun(t, home, "import", file)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	return lines[len(lines)-1]
}

// shell runs a shell script with STASIS (the binary) and STASIS_HOME set.
func shell(t *testing.T, home, script string) result {
	t.Helper()
	return runWithHome(t, home, exec.Command("sh", "-c", script))
}

func TestExportImportFiles(t *testing.T) {
	a, b, tmp := t.TempDir(), t.TempDir(), t.TempDir()
	tree := writeTree(t, tmp, 5, 2<<20)
	id := save(t, a, "moved", 9, "--compress", "zstd", "--tag", "from=a", tree)

	// Through a pipe, as over ssh.
	r := shell(t, b, fmt.Sprintf(`STASIS_HOME=%s "$STASIS" export %s | "$STASIS" import -`, a, id))
	if r.code != 0 || strings.TrimSpace(r.stdout) != id {
		t.Fatalf("export | import: exit %d, stdout %q, stderr %s", r.code, r.stdout, r.stderr)
	}
	if recs := list(t, b); len(recs) != 1 || recs[0].ID != id || recs[0].Job != "moved" || recs[0].Step != 9 || recs[0].Kind != "files" {
		t.Fatalf("B lists %+v", recs)
	}
	mustRun(t, b, "verify", id)
	out := filepath.Join(tmp, "out")
	mustRun(t, b, "load", id, "--to", out)
	sameTree(t, tree, filepath.Join(out, "tree"))

	// Through a file; a second import of the same ID is refused.
	file := exportTo(t, a, id)
	if leftovers, _ := filepath.Glob(filepath.Join(filepath.Dir(file), ".*partial*")); len(leftovers) > 0 {
		t.Fatalf("export left %v", leftovers)
	}
	expectCode(t, run(t, b, "import", file), cli.ExitExists, `checkpoint ID already taken: `+id+` \(job moved, step 9\) is already in this store`)
	expectCode(t, run(t, b, "import", filepath.Join(tmp, "missing.tar")), cli.ExitNotFound, `no such file`)
	expectCode(t, run(t, b, "import"), cli.ExitUsage, `one FILE`)
	// An export to a terminal is refused (script(1) gives it one).
	if _, err := exec.LookPath("script"); err == nil {
		cmd := exec.Command("script", "-qec", fmt.Sprintf("%s export %s; echo rc=$?", stasisBin, id), "/dev/null")
		cmd.Env = append(os.Environ(), "STASIS_HOME="+a)
		got, _ := cmd.CombinedOutput()
		if !strings.Contains(string(got), "stdout is a terminal") || !strings.Contains(string(got), fmt.Sprintf("rc=%d", cli.ExitUsage)) {
			t.Errorf("export to a terminal: %q", got)
		}
	}
}

// forge builds a stream with GNU tar from dir, where the test laid out
// what it wants, naming members as given (-P keeps / and ..).
func forge(t *testing.T, dir string, members ...string) []byte {
	t.Helper()
	cmd := exec.Command("tar", append([]string{"-C", dir, "-P", "-cf", "-", "--format=gnu"}, members...)...)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tar: %v: %s", err, errb.String())
	}
	return out
}

// TestImportRefusesBadStreams feeds the CLI streams it must refuse: each
// gets its exit code and a one-line error, nothing is listed, what was
// listed still verifies, and gc finds nothing to clean.
func TestImportRefusesBadStreams(t *testing.T) {
	a, b, tmp := t.TempDir(), t.TempDir(), t.TempDir()
	tree := writeTree(t, tmp, 3, 300_000)
	id := save(t, a, "src", 1, "--compress", "none", tree)
	kept := save(t, b, "kept", 1, tree)
	stream, err := os.ReadFile(exportTo(t, a, id))
	if err != nil {
		t.Fatal(err)
	}
	manifest, _ := os.ReadFile(filepath.Join(a, "checkpoints", id, "manifest"))
	dataStart := 512 + (len(manifest)+511)/512*512 + 512 // manifest header and bytes, data header

	// Forged with GNU tar: the checkpoint's own files, and links.
	forged := filepath.Join(tmp, "forged")
	os.MkdirAll(filepath.Join(forged, id), 0o700)
	exec.Command("cp", "-a", filepath.Join(a, "checkpoints", id)+"/.", filepath.Join(forged, id)).Run()
	os.MkdirAll(filepath.Join(forged, "links", id), 0o700)
	os.Symlink("/etc/passwd", filepath.Join(forged, "links", id, "data.0000"))
	os.WriteFile(filepath.Join(forged, "links", id, "manifest"), manifest, 0o600)
	// data.0000 a hard link to manifest: tar stores it as a link entry.
	os.MkdirAll(filepath.Join(forged, "hard", id), 0o700)
	os.WriteFile(filepath.Join(forged, "hard", id, "manifest"), manifest, 0o600)
	os.Link(filepath.Join(forged, "hard", id, "manifest"), filepath.Join(forged, "hard", id, "data.0000"))

	flip := func(off int) []byte {
		b := bytes.Clone(stream)
		b[off] ^= 0x20
		return b
	}
	garbage := bytes.Repeat([]byte("not a tar stream at all\n"), 100)
	cases := []struct {
		name    string
		stream  []byte
		code    int
		pattern string
	}{
		{"absolute path", forge(t, forged, filepath.Join(forged, id, "manifest")), cli.ExitBadStream, `has an absolute path`},
		{"dot-dot", forge(t, forged, id+"/../"+id+"/manifest"), cli.ExitBadStream, `climbs out of its directory`},
		{"symlink", forge(t, filepath.Join(forged, "links"), id+"/manifest", id+"/data.0000"), cli.ExitBadStream, `entry 1 .* is a link`},
		{"hard link", forge(t, filepath.Join(forged, "hard"), id+"/manifest", id+"/data.0000"), cli.ExitBadStream, `entry 1 .* is a link`},
		{"extra entry", forge(t, forged, id+"/manifest", id+"/data.0000", "links/"+id+"/manifest"), cli.ExitBadStream, `more follows the last data file`},
		{"directory", forge(t, forged, id), cli.ExitBadStream, `is a directory`},
		{"size mismatch", forge(t, filepath.Join(forged, "links"), "--dereference", id+"/manifest", id+"/data.0000"), cli.ExitBadStream, `holds \d+ bytes; the manifest says`},
		{"flipped chunk", flip(dataStart + 5000), cli.ExitCorrupt, `data\.0000 \(import stream\): chunk 0 at offset 0: checksum mismatch`},
		{"flipped manifest", flip(512 + len(manifest) - 30), cli.ExitCorrupt, `invalid manifest: checksum mismatch`},
		{"truncated in the manifest", stream[:700], cli.ExitBadStream, `truncated in the manifest`},
		{"truncated in the data", stream[:dataStart+100_000], cli.ExitBadStream, `truncated in data file data\.0000`},
		{"truncated before the end marker", stream[:len(stream)-700], cli.ExitBadStream, `truncated before the end-of-archive marker`},
		{"garbage", garbage, cli.ExitBadStream, `not a tar header`},
		{"empty", nil, cli.ExitBadStream, `the stream is empty`},
		{"already present", nil, cli.ExitExists, `already in this store`},
	}
	wantListed := list(t, b)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			file := filepath.Join(tmp, strings.ReplaceAll(c.name, " ", "-")+".tar")
			if c.name == "already present" {
				file = exportTo(t, b, kept)
			} else if err := os.WriteFile(file, c.stream, 0o600); err != nil {
				t.Fatal(err)
			}
			expectCode(t, run(t, b, "import", file), c.code, c.pattern)
			if got := list(t, b); fmt.Sprint(got) != fmt.Sprint(wantListed) {
				t.Fatalf("after a refused import B lists %+v", got)
			}
			if staged := entriesIn(t, filepath.Join(b, "staging")); len(staged) != 0 {
				t.Fatalf("a refused import left %v in staging", staged)
			}
		})
	}
	mustRun(t, b, "verify", kept)
	var rep map[string]any
	if err := json.Unmarshal([]byte(mustRun(t, b, "gc", "--json").stdout), &rep); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"staging_removed", "trash_removed", "indexed", "lost", "damaged"} {
		if rep[k] != nil {
			t.Errorf("gc after the refused imports: %s = %v", k, rep[k])
		}
	}
	if got := entriesIn(t, filepath.Join(b, "checkpoints")); len(got) != 1 || got[0] != kept {
		t.Errorf("checkpoints/ holds %v", got)
	}
}

// TestProcessCheckpointOnAnotherNode checkpoints a counter with store A,
// exports it, and imports and restores it with store B in a mount
// namespace of its own where A is covered by an empty tmpfs: the restore
// can use nothing of A. The counter goes on from where it stopped.
func TestProcessCheckpointOnAnotherNode(t *testing.T) {
	requireCRIU(t)
	a, b := t.TempDir(), t.TempDir()
	pid, id, out, atDump := checkpointedCounter(t, a, "--job", "moving", "--step", "3")
	file := exportTo(t, a, id)

	script := fmt.Sprintf(`set -e
mount -t tmpfs -o size=1m stasis-hides-a %s
test -z "$(ls -A %s)"
"$STASIS" import %s >/dev/null
"$STASIS" restore %s`, a, a, file, id)
	r := shell(t, b, "exec unshare --mount --propagation private sh -c '"+script+"'")
	if r.code != 0 {
		t.Fatalf("import and restore in a new mount namespace: exit %d: %s", r.code, r.stderr)
	}
	restored := restoredPID(t, r)
	if restored != pid {
		t.Errorf("restored as PID %d, was %d", restored, pid)
	}
	consecutive(t, waitCounting(t, out, atDump+10))
	if recs := list(t, b); len(recs) != 1 || recs[0].ID != id || recs[0].Kind != "process" || recs[0].Step != 3 {
		t.Fatalf("B lists %+v", recs)
	}
	mustRun(t, b, "verify", id)
}
