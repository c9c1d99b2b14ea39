package cli_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stasis-ckpt/stasis"
	"github.com/stasis-ckpt/stasis/cli"
)

// saveJob saves a job checkpoint of world ranks of job at step through the
// library, one Store per rank as each rank's process has its own, and
// returns the job checkpoint's ID.
func saveJob(t *testing.T, home, job string, step int64, world int) string {
	t.Helper()
	ids := make(chan string, world)
	errs := make(chan error, world)
	for r := range world {
		go func() {
			s, err := stasis.Open(stasis.Options{Home: home})
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			c := s.Begin(job, step)
			b := []byte(strings.Repeat(string(rune('a'+r)), 100000))
			if err := c.Add(stasis.Tensor{Name: "shard", DType: "uint8", Shape: []int64{int64(len(b))}, Host: b, Bytes: int64(len(b))}); err != nil {
				errs <- err
				return
			}
			if err := c.SetPart(stasis.PartOptions{Rank: r, WorldSize: world, Attempt: "attempt-1", Timeout: time.Minute}); err != nil {
				errs <- err
				return
			}
			rec, err := c.Commit(context.Background())
			if r == 0 {
				ids <- rec.ID
			}
			errs <- err
		}()
	}
	for range world {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	return <-ids
}

// TestJobCheckpointCommands: a job checkpoint of three ranks is one line of
// ls, shows its ranks, verifies every part, refuses export in one line,
// and rm takes its parts along.
func TestJobCheckpointCommands(t *testing.T) {
	home := filepath.Join(t.TempDir(), "store")
	id := saveJob(t, home, "big", 3, 3)
	r := mustRun(t, home, "ls")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], id[:8]) || !strings.Contains(lines[1], "job (3 ranks)") {
		t.Fatalf("ls:\n%s", r.stdout)
	}
	show := mustRun(t, home, "show", id).stdout
	for rank := range 3 {
		if !strings.Contains(show, "rank "+string(rune('0'+rank))+":") {
			t.Errorf("show names no rank %d:\n%s", rank, show)
		}
	}
	var js struct {
		Meta struct {
			Job struct {
				WorldSize int `json:"world_size"`
				Parts     []struct {
					ID string `json:"id"`
				} `json:"parts"`
			} `json:"job"`
		} `json:"meta"`
		Bytes int64 `json:"bytes"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, home, "show", "--json", id).stdout), &js); err != nil || js.Meta.Job.WorldSize != 3 || len(js.Meta.Job.Parts) != 3 || js.Bytes != 300000 {
		t.Fatalf("show --json: %+v (%v)", js, err)
	}
	if out := mustRun(t, home, "verify", id).stdout; !strings.Contains(out, "ok (3 ranks, 3 files") {
		t.Errorf("verify: %s", out)
	}
	// Exported as one stream (the job manifest, then every part), imported
	// elsewhere as one checkpoint; a part alone is not exported, and a
	// stream cut after a part lists nothing.
	stream := filepath.Join(t.TempDir(), "job.tar")
	mustRun(t, home, "export", id, "-o", stream)
	other := filepath.Join(t.TempDir(), "other")
	if got := strings.TrimSpace(mustRun(t, other, "import", stream).stdout); !strings.HasSuffix(got, id) {
		t.Fatalf("import printed %q, want %s", got, id)
	}
	if out := mustRun(t, other, "verify", id).stdout; !strings.Contains(out, "ok (3 ranks, 3 files") {
		t.Errorf("verify of the import: %s", out)
	}
	if r := mustRun(t, other, "ls", "--json"); strings.Count(r.stdout, `"id"`) != 1 {
		t.Errorf("the import lists %s", r.stdout)
	}
	expectCode(t, run(t, home, "export", js.Meta.Job.Parts[0].ID, "-o", filepath.Join(t.TempDir(), "part.tar")), cli.ExitUsage, `one rank's part of a job checkpoint: export the job checkpoint`)
	whole, err := os.ReadFile(stream)
	if err != nil {
		t.Fatal(err)
	}
	cut := filepath.Join(t.TempDir(), "cut.tar")
	if err := os.WriteFile(cut, whole[:len(whole)*2/3], 0o600); err != nil {
		t.Fatal(err)
	}
	third := filepath.Join(t.TempDir(), "third")
	expectCode(t, run(t, third, "import", cut), cli.ExitBadStream, `rank \d.s part: not a valid stasis export stream`)
	if r := mustRun(t, third, "ls", "--json"); strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("a cut job stream lists %s", r.stdout)
	}

	// A part damaged: verify names it.
	part := js.Meta.Job.Parts[1].ID
	data := filepath.Join(home, "checkpoints", part, "data.0000")
	b, err := os.ReadFile(data)
	if err != nil {
		t.Fatal(err)
	}
	b[100] ^= 0xff
	if err := os.WriteFile(data, b, 0o600); err != nil {
		t.Fatal(err)
	}
	expectCode(t, run(t, home, "verify", id), cli.ExitCorrupt, part)

	mustRun(t, home, "rm", id)
	if left := entriesIn(t, filepath.Join(home, "checkpoints")); len(left) != 0 {
		t.Fatalf("rm left %v", left)
	}
}
