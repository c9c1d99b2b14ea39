package stasis

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stasis-ckpt/stasis/backend/s3"
	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/internal/s3test"
	"github.com/stasis-ckpt/stasis/remote"
)

// TestRemoteJobCheckpoint: a job checkpoint of three ranks saved on node
// A is pushed (parts first, the job manifest last), pulled on node B,
// where it is listed as one checkpoint, and each rank loads its part
// there.
func TestRemoteJobCheckpoint(t *testing.T) {
	srv := s3test.Start(t)
	for _, kv := range srv.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	b, err := s3.Open(s3.Config{URL: srv.Remote("jobs")})
	if err != nil {
		t.Fatal(err)
	}
	homeA, homeB := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	rec, err := saveParts(t, homeA, "big", 7, "run1", 3, []int{0, 1, 2}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a, err := catalog.Open(homeA, catalog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Push(ctx, a, b, rec.ID, remote.Options{}); err != nil {
		t.Fatal(err)
	}
	// The remote lists the job checkpoint, not its parts.
	ents, err := remote.List(ctx, b, false, nil)
	if err != nil || len(ents) != 1 || ents[0].ID != rec.ID || ents[0].Kind != catalog.KindJob {
		t.Fatalf("remote listing %+v (%v), want the job checkpoint alone", ents, err)
	}
	bs, err := catalog.Open(homeB, catalog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Pull(ctx, bs, b, rec.ID, remote.Options{}); err != nil {
		t.Fatal(err)
	}
	s, err := Open(Options{Home: homeB})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	recs, err := s.List("")
	if err != nil || len(recs) != 1 || recs[0].ID != rec.ID {
		t.Fatalf("node B lists %+v (%v), want only the job checkpoint", recs, err)
	}
	for r := range 3 {
		part, err := s.FindForRank("big", -1, r, 3)
		if err != nil {
			t.Fatal(err)
		}
		into := []Tensor{hostTensor("shard", make([]byte, 1<<20+r))}
		if _, err := s.Load(ctx, part.ID, into); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(into[0].Host, random(1<<20+r, 700+uint64(r))) {
			t.Errorf("rank %d loaded other data on node B", r)
		}
	}
}
