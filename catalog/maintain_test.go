package catalog

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

func TestGCDeadWriter(t *testing.T) {
	s := mustStore(t)
	old := mustCommit(t, s, "j", 1, 10000)
	cmd, id := startHelper(t, "begin-hold", s.Root)
	if _, err := os.Stat(filepath.Join(s.path(stagingDir), id)); err != nil {
		t.Fatalf("helper's staging directory: %v", err)
	}
	// While the writer lives, its checkpoint is busy.
	rep, err := s.GC()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rep.StagingBusy, []string{id}) || len(rep.StagingRemoved) != 0 {
		t.Errorf("GC with a live writer in another process: %+v", rep)
	}
	killHelper(t, cmd)
	rep, err = s.GC()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rep.StagingRemoved, []string{id}) || len(rep.StagingBusy) != 0 || rep.BytesReclaimed < 8192 {
		t.Errorf("GC after the writer died: %+v", rep)
	}
	wantEmpty(t, s)
	if _, err := s.Verify(context.Background(), old.ID, ReadOptions{}); err != nil {
		t.Errorf("older checkpoint: %v", err)
	}
}

func TestGCLiveWriter(t *testing.T) {
	s := mustStore(t)
	p, err := s.Begin(KindTensors, "j", 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(p.Path("data.0000"), make([]byte, 4096), 0o600)
	rep, err := s.GC()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rep.StagingBusy, []string{p.ID()}) || len(rep.StagingRemoved) != 0 {
		t.Errorf("GC with a live writer: %+v", rep)
	}
	if _, err := os.Stat(p.Path("data.0000")); err != nil {
		t.Errorf("GC touched a live writer's data: %v", err)
	}
	// The writer can still commit afterwards.
	if _, err := p.Commit(); err != nil {
		t.Fatalf("Commit after GC: %v", err)
	}
	wantEmpty(t, s)
}

func TestGCRepairsIndex(t *testing.T) {
	s := mustStore(t)
	keep := mustCommit(t, s, "j", 1, 3000)
	unindexed := mustCommit(t, s, "j", 2, 3000)
	lost := mustCommit(t, s, "j", 3, 3000)
	deleting := mustCommit(t, s, "j", 4, 3000)

	// A checkpoint the index does not know.
	if err := s.update(func(tx *bolt.Tx) error { return deleteRecordTx(tx, unindexed) }); err != nil {
		t.Fatal(err)
	}
	// A record whose directory is gone.
	if err := os.RemoveAll(s.CheckpointDir(lost.ID)); err != nil {
		t.Fatal(err)
	}
	// A removal that stopped after marking the record.
	markDeleting(t, s, deleting.ID)
	// A directory with a damaged manifest, and leftovers in trash/ and
	// staging/ (a lock file whose directory is gone).
	damaged := testID("dd", 1)
	os.Mkdir(s.CheckpointDir(damaged), 0o700)
	os.WriteFile(filepath.Join(s.CheckpointDir(damaged), manifestName), []byte("garbage\n"), 0o600)
	os.MkdirAll(filepath.Join(s.path(trashDir), "leftover", "sub"), 0o700)
	os.WriteFile(filepath.Join(s.path(trashDir), "leftover", "sub", "f"), make([]byte, 5000), 0o600)
	os.WriteFile(filepath.Join(s.path(stagingDir), testID("ee", 1)+lockSuffix), nil, 0o600)

	rep, err := s.GC()
	if err != nil {
		t.Fatalf("GC: %v", err)
	}
	want := GCReport{
		TrashRemoved:   []string{"leftover"},
		RemovalsDone:   []string{deleting.ID},
		Indexed:        []string{unindexed.ID},
		Lost:           []string{lost.ID},
		Damaged:        []string{damaged},
		BytesReclaimed: 5000,
	}
	wantGC(t, rep, want)
	if got := ids(mustList(t, s)); !slices.Equal(got, []string{keep.ID, unindexed.ID}) {
		t.Errorf("List after GC = %v, want %v", got, []string{keep.ID, unindexed.ID})
	}
	if _, err := os.Stat(s.CheckpointDir(deleting.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("finished removal left its directory: %v", err)
	}
	wantEmpty(t, s)
	for _, id := range []string{keep.ID, unindexed.ID} {
		if _, err := s.Verify(context.Background(), id, ReadOptions{}); err != nil {
			t.Errorf("Verify %s: %v", id, err)
		}
	}
	// A second GC finds nothing new but the damaged directory.
	rep, err = s.GC()
	if err != nil {
		t.Fatal(err)
	}
	wantGC(t, rep, GCReport{Damaged: []string{damaged}})
}

func TestRebuild(t *testing.T) {
	s := mustStore(t)
	for i := range 3 {
		mustCommit(t, s, "a", int64(i), 1000*i)
	}
	mustCommit(t, s, "b", 7, 100)
	before := mustList(t, s)

	if err := os.Remove(s.path(indexName)); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(s.Root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if l := mustList(t, s2); len(l) != 0 {
		t.Fatalf("fresh index lists %v", ids(l))
	}
	rep, err := s2.Rebuild()
	if err != nil || rep.Indexed != 4 || len(rep.Damaged) != 0 {
		t.Fatalf("Rebuild = %+v, %v", rep, err)
	}
	if after := mustList(t, s2); !reflect.DeepEqual(after, before) {
		t.Errorf("rebuilt List differs\nbefore %+v\nafter  %+v", before, after)
	}

	// A damaged manifest and a stray directory are reported, not indexed;
	// the rest is.
	flipByte(t, filepath.Join(s.CheckpointDir(before[1].ID), manifestName), 300)
	os.Mkdir(filepath.Join(s.path(checkpointsDir), "stray"), 0o700)
	rep, err = s2.Rebuild()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(rep.Damaged)
	if rep.Indexed != 3 || !slices.Equal(rep.Damaged, []string{before[1].ID, "stray"}) {
		t.Errorf("Rebuild with damage = %+v", rep)
	}
	want := slices.Delete(slices.Clone(before), 1, 2)
	if after := mustList(t, s2); !reflect.DeepEqual(after, want) {
		t.Errorf("List after Rebuild with damage = %v, want %v", ids(after), ids(want))
	}
}

func TestBusy(t *testing.T) {
	s := mustStore(t)
	old := mustCommit(t, s, "j", 1, 1000)
	busy, err := Open(s.Root, Options{LockTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	cmd, line := startHelper(t, "hold-db", s.Root)
	if line != "ready" {
		t.Fatalf("helper said %q", line)
	}
	wantBusy := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, ErrBusy) {
			t.Errorf("%s while another process holds the index: %v, want ErrBusy", what, err)
		}
	}
	_, err = busy.List(Filter{})
	wantBusy("List", err)
	_, err = busy.Resolve(old.ID[:4])
	wantBusy("Resolve", err)
	wantBusy("Remove", busy.Remove(old.ID))
	_, err = busy.GC()
	wantBusy("GC", err)
	_, err = Open(s.Root, Options{LockTimeout: 200 * time.Millisecond})
	wantBusy("Open", err)
	// A commit that cannot be listed is taken back.
	p, err := busy.Begin(KindFiles, "j", 2, nil)
	if err != nil {
		t.Fatalf("Begin needs no index: %v", err)
	}
	_, err = p.Commit()
	wantBusy("Commit", err)
	if _, err := os.Stat(busy.CheckpointDir(p.ID())); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("unlisted commit left its directory: %v", err)
	}

	killHelper(t, cmd)
	if got := ids(mustList(t, busy)); !slices.Equal(got, []string{old.ID}) {
		t.Errorf("List after the holder died = %v", got)
	}
	mustCommit(t, busy, "j", 3, 1000)
	if _, err := busy.Verify(context.Background(), old.ID, ReadOptions{}); err != nil {
		t.Errorf("Verify: %v", err)
	}
	wantEmpty(t, busy)
}

// wantGC compares a GC report with what a test expects. GC also sweeps the
// machine-wide RAM scratch bases (/dev/shm, /run/stasis/ram), where other processes may have
// left abandoned scratch directories: those, and their bytes, are not the
// test's to predict.
func wantGC(t *testing.T, got, want GCReport) {
	t.Helper()
	if len(got.ScratchRemoved) > 0 && len(want.ScratchRemoved) == 0 {
		t.Logf("GC also removed scratch directories not made by this test: %v", got.ScratchRemoved)
		got.ScratchRemoved, got.BytesReclaimed = nil, want.BytesReclaimed
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("GC report\n got %+v\nwant %+v", got, want)
	}
}

func TestGCScratch(t *testing.T) {
	s := mustStore(t)
	live, err := s.NewScratch("live", -1)
	if err != nil {
		t.Fatal(err)
	}
	if live.InRAM() || filepath.Dir(live.Dir) != s.path(scratchDir) {
		t.Fatalf("scratch with ramBytes -1 is at %s", live.Dir)
	}
	os.WriteFile(filepath.Join(live.Dir, "img"), make([]byte, 3000), 0o600)
	// Not ours: no lock file, or not a stasis- name.
	unlocked := filepath.Join(s.path(scratchDir), scratchPrefix+"unlocked")
	other := filepath.Join(s.path(scratchDir), "other")
	os.Mkdir(unlocked, 0o700)
	os.Mkdir(other, 0o700)
	os.WriteFile(filepath.Join(other, scratchLock), nil, 0o600)

	cmd, dead := startHelper(t, "scratch-hold", s.Root)
	killHelper(t, cmd)

	rep, err := s.GC()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(rep.ScratchRemoved, dead) || slices.Contains(rep.ScratchRemoved, live.Dir) {
		t.Errorf("GC removed scratch %v; want %s removed and %s kept", rep.ScratchRemoved, dead, live.Dir)
	}
	if rep.BytesReclaimed < 5000 {
		t.Errorf("GC reclaimed %d bytes, the dead scratch held 5000", rep.BytesReclaimed)
	}
	if _, err := os.Stat(dead); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dead process's scratch: %v", err)
	}
	for _, d := range []string{live.Dir, unlocked, other} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("GC removed %s: %v", d, err)
		}
	}
	if err := live.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(live.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Remove left %s: %v", live.Dir, err)
	}
}
