package stasis

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stasis-ckpt/stasis/catalog"
)

// saveParts saves the parts of ranks (each through its own Store, as each
// rank's process has its own) of job at step in attempt, concurrently; the
// coordinator's (rank 0) result is returned.
func saveParts(t *testing.T, home, job string, step int64, attempt string, world int, ranks []int, timeout time.Duration) (Record, error) {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var coord Record
	var coordErr error
	for _, r := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := Open(Options{Home: home})
			if err != nil {
				t.Error(err)
				return
			}
			defer s.Close()
			c := s.Begin(job, step)
			if err := c.Add(hostTensor("shard", random(1<<20+r, uint64(step*100)+uint64(r)))); err != nil {
				t.Error(err)
				return
			}
			if err := c.SetPart(PartOptions{Rank: r, WorldSize: world, Attempt: attempt, Timeout: timeout}); err != nil {
				t.Error(err)
				return
			}
			rec, err := c.Commit(context.Background())
			if r == 0 {
				mu.Lock()
				coord, coordErr = rec, err
				mu.Unlock()
			} else if err != nil {
				t.Errorf("rank %d: %v", r, err)
			}
		}()
	}
	wg.Wait()
	return coord, coordErr
}

// TestJobCheckpoint: three ranks save their parts; the job checkpoint is
// listed once, as one checkpoint, and each rank loads its own part back.
func TestJobCheckpoint(t *testing.T) {
	home := filepath.Join(t.TempDir(), "store")
	rec, err := saveParts(t, home, "big", 7, "run1", 3, []int{0, 1, 2}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Kind != catalog.KindJob || rec.Step != 7 {
		t.Fatalf("the coordinator got %+v, want the job checkpoint", rec)
	}
	s, err := Open(Options{Home: home})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	recs, err := s.List("")
	if err != nil || len(recs) != 1 || recs[0].ID != rec.ID {
		t.Fatalf("listed %+v (%v), want only the job checkpoint", recs, err)
	}
	var want int64
	for r := range 3 {
		want += int64(1<<20 + r)
		part, err := s.FindForRank("big", -1, r, 3)
		if err != nil {
			t.Fatal(err)
		}
		into := []Tensor{hostTensor("shard", make([]byte, 1<<20+r))}
		if _, err := s.Load(context.Background(), part.ID, into); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(into[0].Host, random(1<<20+r, 700+uint64(r))) {
			t.Errorf("rank %d loaded another rank's data", r)
		}
	}
	if recs[0].Bytes != want {
		t.Errorf("the job checkpoint counts %d bytes, its parts hold %d", recs[0].Bytes, want)
	}
	for _, c := range []struct {
		rank, world int
		err         error
		what        string
	}{
		{-1, 0, catalog.ErrInvalid, "no rank"},
		{3, 0, catalog.ErrInvalid, "a rank beyond the world"},
		{1, 2, ErrMismatch, "another world size"},
	} {
		if _, err := s.FindForRank("big", -1, c.rank, c.world); !errors.Is(err, c.err) {
			t.Errorf("%s: %v, want %v", c.what, err, c.err)
		}
	}
}

// TestJobCheckpointIncomplete: a rank that never saves leaves nothing
// listed; its peers' parts are removed by gc once a later attempt
// completes the step, whose job checkpoint names only its own parts.
func TestJobCheckpointIncomplete(t *testing.T) {
	home := filepath.Join(t.TempDir(), "store")
	_, err := saveParts(t, home, "big", 5, "run1", 3, []int{0, 2}, 300*time.Millisecond)
	if !errors.Is(err, catalog.ErrIncomplete) || !bytes.Contains([]byte(err.Error()), []byte("rank(s) 1 did not")) {
		t.Fatalf("rank 1 missing: %v, want ErrIncomplete naming it", err)
	}
	s, err := Open(Options{Home: home})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if recs, _ := s.List(""); len(recs) != 0 {
		t.Fatalf("an incomplete job checkpoint is listed: %+v", recs)
	}
	if _, err := s.FindForRank("big", -1, 0, 3); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("found %v", err)
	}
	// gc leaves fresh parts alone: their job checkpoint may be on its way.
	rep, err := s.cat.GC()
	if err != nil || len(rep.PartsRemoved) != 0 {
		t.Fatalf("gc removed %v (%v)", rep.PartsRemoved, err)
	}
	rec, err := saveParts(t, home, "big", 5, "run2", 3, []int{0, 1, 2}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	m, jm, err := s.cat.JobParts(rec.ID)
	if err != nil || m.Step != 5 || jm.Attempt != "run2" {
		t.Fatalf("%v %+v", err, jm)
	}
	parts, _ := s.cat.List(catalog.Filter{Parts: true})
	if len(parts) != 1+3+2 {
		t.Fatalf("%d records, want the job checkpoint and 5 parts", len(parts))
	}
	rep, err = s.cat.GC()
	if err != nil || len(rep.PartsRemoved) != 2 {
		t.Fatalf("gc removed %v (%v), want run1's two parts", rep.PartsRemoved, err)
	}
	for _, id := range rep.PartsRemoved {
		for _, p := range jm.Parts {
			if p.ID == id {
				t.Fatalf("gc removed part %s of the complete job checkpoint", id)
			}
		}
	}
	// Removing the job checkpoint removes its parts.
	if err := s.cat.Remove(rec.ID); err != nil {
		t.Fatal(err)
	}
	if parts, _ := s.cat.List(catalog.Filter{Parts: true}); len(parts) != 0 {
		t.Fatalf("left after rm: %+v", parts)
	}
}

// TestJobCheckpointWorldMismatch: a rank saving for another world size
// fails the job checkpoint.
func TestJobCheckpointWorldMismatch(t *testing.T) {
	home := filepath.Join(t.TempDir(), "store")
	if _, err := saveParts(t, home, "big", 1, "a", 4, []int{1}, time.Minute); err != nil {
		t.Fatal(err)
	}
	_, err := saveParts(t, home, "big", 1, "a", 2, []int{0}, 2*time.Second)
	if !errors.Is(err, catalog.ErrInvalid) || !bytes.Contains([]byte(err.Error()), []byte("world of 4 ranks")) {
		t.Fatalf("%v", err)
	}
	s := openStoreAt(t, home)
	if recs, _ := s.List(""); len(recs) != 0 {
		t.Fatalf("listed %+v", recs)
	}
	for _, c := range []struct{ rank, world int }{{2, 2}, {-1, 2}, {0, 0}} {
		if err := s.Begin("j", 1).SetPart(PartOptions{Rank: c.rank, WorldSize: c.world, Attempt: "a"}); !errors.Is(err, catalog.ErrInvalid) {
			t.Errorf("rank %d of %d: %v", c.rank, c.world, err)
		}
	}
	if err := s.Begin("j", 1).SetPart(PartOptions{WorldSize: 2, Attempt: "bad attempt"}); !errors.Is(err, catalog.ErrInvalid) {
		t.Errorf("attempt with a space: %v", err)
	}
	c := s.Begin("j", 1)
	c.Tag("stasis.rank", "0")
	if _, err := c.Commit(context.Background()); !errors.Is(err, catalog.ErrInvalid) {
		t.Errorf("a reserved tag: %v", err)
	}
}

func openStoreAt(t *testing.T, home string) *Store {
	t.Helper()
	s, err := Open(Options{Home: home})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
