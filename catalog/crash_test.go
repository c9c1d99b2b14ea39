package catalog

import (
	"bytes"
	"context"
	"errors"
	"os"
	"slices"
	"testing"
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
