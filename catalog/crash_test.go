package catalog

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCrashPoints kills a child process at each step of the commit and
// remove protocols (crashPoint sends SIGKILL, as a power cut or kill -9
// would) and checks that gc brings the store back to exactly what is
// complete on disk, without touching an older checkpoint.
func TestCrashPoints(t *testing.T) {
	for _, tc := range []struct {
		point  string
		remove bool // crash while removing rather than committing
		// what the crashed checkpoint is after gc
		listed bool
	}{
		{point: "before-manifest"},
		{point: "before-rename"},
		{point: "before-index", listed: true},
		{point: "remove-marked", remove: true},
		{point: "remove-discarded", remove: true},
	} {
		t.Run(tc.point, func(t *testing.T) {
			s := mustStore(t)
			old := mustCommit(t, s, "crash", 1, 100<<10)

			var cmd = helperCmd("commit", s.Root, "STASIS_CRASH_AT="+tc.point)
			var victim string
			if tc.remove {
				victim = mustCommit(t, s, "crash", 2, 100<<10).ID
				cmd = helperCmd("remove", s.Root, "STASIS_CRASH_AT="+tc.point, helperIDEnv+"="+victim)
			}
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			if err == nil {
				t.Fatalf("child survived crash point %s (stdout %q)", tc.point, stdout.String())
			}
			wantKilled(t, err)
			if stdout.Len() > 0 {
				t.Errorf("child got past the crash point: %q", stdout.String())
			}

			rep, err := s.GC()
			if err != nil {
				t.Fatalf("GC: %v", err)
			}
			t.Logf("GC after crash at %s: %+v", tc.point, rep)
			recs := mustList(t, s)
			listed := ids(recs)
			slices.Sort(listed)
			if disk := completeOnDisk(t, s); !slices.Equal(listed, disk) {
				t.Errorf("index lists %v, complete on disk %v", listed, disk)
			}
			all, err := s.List(Filter{IncludeAll: true})
			if err != nil || len(all) != len(recs) {
				t.Errorf("records left in removal: %+v, %v", all, err)
			}
			for _, id := range listed {
				if _, err := s.Verify(context.Background(), id, ReadOptions{}); err != nil {
					t.Errorf("listed checkpoint %s: %v", id, err)
				}
			}
			wantEmpty(t, s)
			if !slices.Contains(listed, old.ID) {
				t.Errorf("older checkpoint %s no longer listed", old.ID)
			}
			want := 1
			if tc.listed {
				want = 2
			}
			if len(listed) != want {
				t.Errorf("%d checkpoints listed after the crash, want %d", len(listed), want)
			}
			switch {
			case tc.remove:
				if !slices.Equal(rep.RemovalsDone, []string{victim}) {
					t.Errorf("GC did not finish removing %s: %+v", victim, rep)
				}
				if _, err := os.Stat(s.CheckpointDir(victim)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("removed checkpoint still on disk: %v", err)
				}
			case tc.listed:
				if len(rep.Indexed) != 1 {
					t.Errorf("GC did not index the renamed checkpoint: %+v", rep)
				}
			default:
				if len(rep.StagingRemoved) != 1 {
					t.Errorf("GC did not remove the staged checkpoint: %+v", rep)
				}
			}
			// The store keeps working.
			mustCommit(t, s, "crash", 3, 1000)
			rep, err = s.GC()
			if err != nil {
				t.Fatal(err)
			}
			wantGC(t, rep, GCReport{})
		})
	}
}

// holdAt starts cmd held at point (STASIS_HOLD_AT) and returns once it is
// there, with the function that lets it go on.
func holdAt(t *testing.T, cmd *exec.Cmd, point string) (release func()) {
	t.Helper()
	fifo := filepath.Join(t.TempDir(), "hold")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(cmd.Env, "STASIS_HOLD_AT="+point+":"+fifo)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	opened := make(chan *os.File, 1)
	go func() {
		w, _ := os.OpenFile(fifo, os.O_WRONLY, 0) // returns once the child reads it
		opened <- w
	}()
	select {
	case w := <-opened:
		t.Cleanup(func() { w.Close() })
		return func() {
			w.Close()
			if err := <-exited; err != nil {
				t.Logf("held child: %v", err)
			}
		}
	case err := <-exited:
		if r, err := os.OpenFile(fifo, os.O_RDONLY|unix.O_NONBLOCK, 0); err == nil {
			r.Close() // lets the opener above go
		}
		t.Fatalf("child ended before reaching %s: %v", point, err)
		return nil
	}
}

// TestGCLeavesCommitToWriter holds a writer between the rename into
// checkpoints/ and the index update, with its staging lock held: gc must
// leave the checkpoint to it, and the commit then lists it. Rebuild,
// which never reads the catalog it replaces and so cannot keep a record
// from it, lists it (the record the writer then puts again).
func TestGCLeavesCommitToWriter(t *testing.T) {
	s := mustStore(t)
	cmd := helperCmd("commit", s.Root)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	release := holdAt(t, cmd, "before-index")
	onDisk := dirNames(t, s.path(checkpointsDir))
	if len(onDisk) != 1 {
		t.Fatalf("checkpoints/ holds %v, want the held commit", onDisk)
	}
	id := onDisk[0]
	rep, err := s.GC()
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Indexed) != 0 || !slices.Equal(rep.StagingBusy, []string{id}) {
		t.Errorf("gc during a commit: %+v, want %s left to its writer", rep, id)
	}
	if recs := mustList(t, s); len(recs) != 0 {
		t.Errorf("listed by gc during the commit: %v", ids(recs))
	}
	mustRebuild(t, s)
	if got := ids(mustList(t, s)); !slices.Equal(got, []string{id}) {
		t.Errorf("Rebuild during the commit listed %v, want %s", got, id)
	}
	release()
	if got := strings.TrimSpace(stdout.String()); got != id {
		t.Fatalf("commit printed %q, want %s (stderr %q)", got, id, stderr.String())
	}
	if got := ids(mustList(t, s)); !slices.Equal(got, []string{id}) {
		t.Fatalf("listed %v after the commit, want %s", got, id)
	}
	if _, err := s.Verify(context.Background(), id, ReadOptions{}); err != nil {
		t.Fatal(err)
	}
	rep, err = s.GC()
	if err != nil {
		t.Fatal(err)
	}
	wantGC(t, rep, GCReport{})
}

// TestImportKeepsListedDirectory: a record for the imported ID appears
// while the import is between its rename and its index update (as an
// indexer unaware of staging locks would put it). The import fails, but
// the directory that record points to stays.
func TestImportKeepsListedDirectory(t *testing.T) {
	a, b := mustStore(t), mustStore(t)
	rec := mustCommit(t, a, "race", 1, 300<<10)
	streamFile := filepath.Join(t.TempDir(), "stream.tar")
	if err := os.WriteFile(streamFile, exportBytes(t, a, rec.ID), 0o600); err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(streamFile)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	cmd := helperCmd("import", b.Root)
	var stderr bytes.Buffer
	cmd.Stdin, cmd.Stderr = in, &stderr
	release := holdAt(t, cmd, "before-index")
	m, err := b.ReadManifest(rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	// Another record than the import's own (which a rebuild would put,
	// and the import would take as its listing).
	other := recordOf(m)
	other.Step++
	if err := b.putRecord(other); err != nil {
		t.Fatal(err)
	}
	release()
	if !strings.Contains(stderr.String(), "appeared meanwhile") {
		t.Errorf("import with a record appearing: %q", stderr.String())
	}
	if _, err := b.Verify(context.Background(), rec.ID, ReadOptions{}); err != nil {
		t.Fatalf("the listed checkpoint lost its directory: %v", err)
	}
	rep, err := b.GC()
	if err != nil {
		t.Fatal(err)
	}
	wantGC(t, rep, GCReport{})
}
