package cli_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stasis-ckpt/stasis/cli"
)

// editMeta rewrites the meta of checkpoint id's manifest with edit, and
// the manifest's hash with it, as a checkpoint made on another machine
// would read.
func editMeta(t *testing.T, home, id string, edit func(meta map[string]any)) {
	t.Helper()
	path := filepath.Join(home, "checkpoints", id, "manifest")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, body, _ := bytes.Cut(data, []byte("\n"))
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatal(err)
	}
	edit(m["meta"].(map[string]any))
	body, err = json.MarshalIndent(m, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	body = append(body, '\n')
	out := fmt.Appendf(nil, "stasis-manifest 1 sha256=%x\n", sha256.Sum256(body))
	if err := os.WriteFile(path, append(out, body...), 0o600); err != nil {
		t.Fatal(err)
	}
}

// expectMismatches checks a refused restore: exit 11, one "mismatch" line
// for each pattern in that order, the warnings given, and the summary last.
func expectMismatches(t *testing.T, r result, mismatches []string, warnings []string) {
	t.Helper()
	if r.code != cli.ExitMismatch {
		t.Fatalf("exit %d, want %d: %s", r.code, cli.ExitMismatch, r.stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	want := len(mismatches) + len(warnings) + 1
	if len(lines) != want {
		t.Fatalf("%d lines on stderr, want %d:\n%s", len(lines), want, r.stderr)
	}
	for i, p := range mismatches {
		if !regexp.MustCompile(`^stasis: mismatch: ` + p).MatchString(lines[i]) {
			t.Errorf("line %d %q does not match %q", i+1, lines[i], p)
		}
	}
	for i, p := range warnings {
		if l := lines[len(mismatches)+i]; !regexp.MustCompile(`^stasis: warning: ` + p).MatchString(l) {
			t.Errorf("line %q does not match %q", l, p)
		}
	}
	if last := lines[len(lines)-1]; !regexp.MustCompile(fmt.Sprintf(`^stasis: this machine does not match the checkpoint: %d mismatches with checkpoint [0-9a-f-]+ \(--force to restore anyway\)$`, len(mismatches))).MatchString(last) {
		t.Errorf("last line %q", last)
	}
}

// TestRestoreChecksTheMachine: a checkpoint records the files its tree
// maps and the mounts it uses; a restore names every difference, refuses
// with exit 11, and goes on with --force.
func TestRestoreChecksTheMachine(t *testing.T) {
	requireCRIU(t)
	home, tmp := t.TempDir(), t.TempDir()
	// The job runs a copy of the shell, which the test can take away.
	sh := filepath.Join(tmp, "bin", "sh")
	os.MkdirAll(filepath.Dir(sh), 0o755)
	if out, err := exec.Command("cp", "/bin/sh", sh).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	out := filepath.Join(tmp, "count")
	pid := startDetached(t, sh, "testdata/counter.sh", out)
	waitCounting(t, out, 5)
	id := checkpointPID(t, home, pid)
	waitGone(t, pid)

	var show struct {
		Meta struct {
			MappedFiles []struct {
				Path   string `json:"path"`
				Size   int64  `json:"size"`
				SHA256 string `json:"sha256"`
			} `json:"mapped_files"`
			Mounts []struct {
				MountPoint string `json:"mount_point"`
				FSType     string `json:"fs_type"`
			} `json:"mounts"`
		} `json:"meta"`
	}
	if err := jsonUnmarshal(mustRun(t, home, "show", "--json", id).stdout, &show); err != nil {
		t.Fatal(err)
	}
	var libc, loader string
	files := map[string]bool{}
	for _, f := range show.Meta.MappedFiles {
		files[f.Path] = true
		if len(f.SHA256) != 64 || f.Size <= 0 {
			t.Errorf("mapped file %+v", f)
		}
		switch base := filepath.Base(f.Path); {
		case strings.HasPrefix(base, "libc.so"):
			libc = f.Path
		case strings.HasPrefix(base, "ld-linux"):
			loader = f.Path
		}
	}
	if !files[sh] || libc == "" || loader == "" {
		t.Fatalf("the manifest lacks the shell, libc or the loader: %+v", show.Meta.MappedFiles)
	}
	if len(show.Meta.Mounts) == 0 || show.Meta.Mounts[0].MountPoint != "/" {
		t.Fatalf("mounts: %+v", show.Meta.Mounts)
	}
	// The job's stdio are /dev/null: devices do not count as mounts used.
	for _, m := range show.Meta.Mounts {
		if m.MountPoint == "/dev" || m.FSType == "devtmpfs" || m.FSType == "proc" {
			t.Errorf("mount %+v recorded for a device or a pseudo file system", m)
		}
	}

	// As if made on a machine with another libc, another loader, a
	// Python this one lacks, and another kernel.
	gone := filepath.Join(tmp, "gone", "python3")
	editMeta(t, home, id, func(meta map[string]any) {
		meta["kernel"] = "2.6.32-elsewhere"
		var kept []any
		for _, f := range meta["mapped_files"].([]any) {
			f := f.(map[string]any)
			switch f["path"] {
			case libc:
				f["sha256"] = strings.Repeat("0", 64)
			case loader:
				size, _ := f["size"].(json.Number).Int64()
				f["size"] = size + 1
			}
			kept = append(kept, f)
		}
		meta["mapped_files"] = append(kept, map[string]any{"path": gone, "size": 4096, "sha256": strings.Repeat("ab", 32)},
			// a memmap the job wrote since
			map[string]any{"path": out, "size": 1, "sha256": strings.Repeat("0", 64), "shared_writable": true})
		mounts := meta["mounts"].([]any)
		mounts[0].(map[string]any)["source"] = "/dev/elsewhere"
		mounts[0].(map[string]any)["fs_type"] = "overlay-elsewhere" // a container's / after a host's
		meta["mounts"] = append(mounts, map[string]any{"mount_point": "/data-gone", "fs_type": "nfs4", "source": "server:/export"},
			// as an older stasis recorded /dev/pts of a job with a terminal open, in a container that had it elsewhere
			map[string]any{"mount_point": "/dev/pts", "fs_type": "devtmpfs", "source": "udev"})
	})
	mismatches := []string{
		regexp.QuoteMeta(loader) + ` differs: \d+ bytes here, \d+ in the checkpoint`,
		regexp.QuoteMeta(libc) + ` differs: SHA-256 [0-9a-f]{12}\.\.\. here, 000000000000\.\.\. in the checkpoint`,
		regexp.QuoteMeta(gone) + ` is missing \(the tree ran or mapped it: 4096 bytes\)`,
		`mount /data-gone \(nfs4 from server:/export\) is not mounted here`,
	}
	if strings.Compare(libc, loader) < 0 {
		mismatches[0], mismatches[1] = mismatches[1], mismatches[0]
	}
	kernel := `kernel: the checkpoint was made on Linux 2\.6\.32-elsewhere, this machine runs `
	source := `mount / is mounted from \S+ here, from /dev/elsewhere in the checkpoint`
	fsType := `mount / is \S+ here, overlay-elsewhere in the checkpoint`
	memmap := regexp.QuoteMeta(out) + ` differs from the checkpoint's \(\d+ bytes here, 1 there\); the tree mapped it shared and writable`
	expectMismatches(t, run(t, home, "restore", id), mismatches, []string{kernel, memmap, fsType, source})
	if alive(pid) {
		t.Fatal("a refused restore ran CRIU")
	}

	atDump := len(counts(t, out))
	r := mustRun(t, home, "restore", "--force", id)
	for _, p := range append(mismatches, kernel, memmap, fsType, source) {
		if !regexp.MustCompile(`(?m)^stasis: warning: ` + p).MatchString(r.stderr) {
			t.Errorf("--force did not warn %q:\n%s", p, r.stderr)
		}
	}
	t.Cleanup(func() { killTree(pid) })
	consecutive(t, waitCounting(t, out, atDump+5))

	// For real: the job's executable is taken away.
	id = checkpointPID(t, home, pid)
	waitGone(t, pid)
	os.Rename(sh, sh+".away")
	expectMismatches(t, run(t, home, "restore", id), []string{regexp.QuoteMeta(sh) + ` is missing`}, nil)
	// Back, as a new file with the same bytes: its hash is taken again
	// and matches.
	if out, err := exec.Command("cp", sh+".away", sh).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	restorePID(t, home, id)
	waitCounting(t, out, len(counts(t, out))+5)
}
