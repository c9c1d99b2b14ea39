package catalog

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stasis-ckpt/stasis/gdswriter"
)

func TestOpenCreatesLayout(t *testing.T) {
	root := filepath.Join(t.TempDir(), "a", "b", "store")
	s, err := Open(root, Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if s.Root != root {
		t.Errorf("Root = %s, want %s", s.Root, root)
	}
	for _, d := range []string{"", checkpointsDir, stagingDir, trashDir} {
		st, err := os.Stat(filepath.Join(root, d))
		if err != nil {
			t.Fatal(err)
		}
		if !st.IsDir() || st.Mode().Perm() != 0o700 {
			t.Errorf("%s/%s: mode %v, want a directory with mode 0700", root, d, st.Mode())
		}
	}
	if st, err := os.Stat(filepath.Join(root, indexName)); err != nil || !st.Mode().IsRegular() {
		t.Fatalf("no index file: %v", err)
	}
	// Opening again keeps what is there.
	rec := mustCommit(t, s, "j", 1, 1000)
	s2, err := Open(root, Options{})
	if err != nil {
		t.Fatalf("second Open: %v", err)
	}
	if got := ids(mustList(t, s2)); !slices.Equal(got, []string{rec.ID}) {
		t.Errorf("reopened store lists %v, want %v", got, []string{rec.ID})
	}
	// A relative root is made absolute.
	t.Chdir(t.TempDir())
	s3, err := Open("rel", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !filepath.IsAbs(s3.Root) {
		t.Errorf("Root %q is not absolute", s3.Root)
	}
	// A root that is a file is refused.
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o600)
	if _, err := Open(file, Options{}); err == nil {
		t.Error("Open of a regular file as root succeeded")
	}
}

func TestBeginCommit(t *testing.T) {
	s := mustStore(t)
	data := testData(300<<10, 1)
	rec, err := commitData(s, KindTensors, "train/llama", 42, data)
	if err != nil {
		t.Fatalf("commit: %v", err)
	}
	if rec.Status != StatusComplete || rec.Job != "train/llama" || rec.Step != 42 || rec.Kind != KindTensors ||
		rec.Bytes != int64(len(data)) || rec.StoredBytes < rec.Bytes || rec.Tags["run"] != "test" {
		t.Errorf("record %+v", rec)
	}
	list := mustList(t, s)
	if len(list) != 1 || !reflect.DeepEqual(list[0], *rec) {
		t.Errorf("List = %+v, want [%+v]", list, *rec)
	}
	got, err := s.Get(rec.ID)
	if err != nil || !reflect.DeepEqual(got, *rec) {
		t.Errorf("Get = %+v, %v", got, err)
	}
	m, err := s.ReadManifest(rec.ID)
	if err != nil {
		t.Fatalf("ReadManifest: %v", err)
	}
	if m.ID != rec.ID || m.Bytes != rec.Bytes || m.StoredBytes != rec.StoredBytes || len(m.Files) != 1 || len(m.Entries) != 1 {
		t.Errorf("manifest %+v does not match record %+v", m, rec)
	}
	if st, err := os.Stat(filepath.Join(s.CheckpointDir(rec.ID), "data.0000")); err != nil || st.Size() != m.Files[0].Size {
		t.Errorf("data file: %v, %v", st, err)
	}
	wantEmpty(t, s)

	// The data reads back through the store, verified.
	var back []byte
	if err := s.StreamFile(context.Background(), m, m.Files[0], ReadOptions{Workers: 2}, func(_ int, raw []byte) error {
		back = append(back, raw...)
		return nil
	}); err != nil {
		t.Fatalf("StreamFile: %v", err)
	}
	if !bytes.Equal(back, data) {
		t.Error("StreamFile returned other bytes")
	}
	into := make([]byte, m.Files[0].RawSize)
	if err := s.ReadFileInto(context.Background(), m, m.Files[0], into, ReadOptions{Workers: 3}); err != nil {
		t.Fatalf("ReadFileInto: %v", err)
	}
	if !bytes.Equal(into, data) {
		t.Error("ReadFileInto returned other bytes")
	}
	if _, err := s.Verify(context.Background(), rec.ID, ReadOptions{}); err != nil {
		t.Errorf("Verify: %v", err)
	}
}

func TestCommitTwiceAndAbort(t *testing.T) {
	s := mustStore(t)
	p, err := s.Begin(KindFiles, "j", 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Commit(); err != nil {
		t.Fatalf("commit of an empty checkpoint: %v", err)
	}
	if _, err := p.Commit(); err == nil {
		t.Error("second Commit succeeded")
	}
	p.Abort() // no effect after Commit
	if _, err := s.Get(p.ID()); err != nil {
		t.Errorf("Abort after Commit removed the checkpoint: %v", err)
	}

	p2, err := s.Begin(KindTensors, "j", 2, map[string]string{"a": "b"})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(p2.Path("")); err != nil || !st.IsDir() {
		t.Fatalf("staging directory: %v", err)
	}
	os.WriteFile(p2.Path("data.0000"), make([]byte, 4096), 0o600)
	p2.Abort()
	p2.Abort()
	wantEmpty(t, s)
	if got := ids(mustList(t, s)); !slices.Equal(got, []string{p.ID()}) {
		t.Errorf("after Abort List = %v", got)
	}
	if _, err := p2.Commit(); err == nil {
		t.Error("Commit after Abort succeeded")
	}
	if _, err := os.Stat(s.CheckpointDir(p2.ID())); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("aborted checkpoint directory: %v", err)
	}
}

// A Commit that fails leaves neither a checkpoint nor a staging directory,
// even though Abort after it does nothing.
func TestFailedCommitLeavesNothing(t *testing.T) {
	s := mustStore(t)
	cases := []struct {
		name  string
		setup func(p *Pending)
	}{
		{"data file missing", func(p *Pending) {
			p.Manifest.Files = []DataFile{{Name: "data.0000", ChunkSize: 4096}}
		}},
		{"data file of the wrong size", func(p *Pending) {
			os.WriteFile(p.Path("data.0000"), make([]byte, 8192), 0o600)
			p.Manifest.Files = []DataFile{{Name: "data.0000", Size: 4096, RawSize: 10, ChunkSize: 4096,
				Chunks: []gdswriter.Chunk{{Offset: 0, Stored: 10, Raw: 10, Codec: gdswriter.CodecRaw}}}}
		}},
		{"invalid manifest", func(p *Pending) {
			p.Manifest.Entries = []Entry{{Path: "../escape", Type: EntryDir}}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := s.Begin(KindFiles, "j", 1, nil)
			if err != nil {
				t.Fatal(err)
			}
			tc.setup(p)
			if rec, err := p.Commit(); err == nil {
				t.Fatalf("Commit succeeded: %+v", rec)
			}
			p.Abort()
			wantEmpty(t, s)
			if n := dirNames(t, s.path(checkpointsDir)); len(n) > 0 {
				t.Errorf("checkpoints/ holds %v", n)
			}
			if l := mustList(t, s); len(l) > 0 {
				t.Errorf("List = %+v", l)
			}
		})
	}
}

func TestBeginRejects(t *testing.T) {
	s := mustStore(t)
	for _, tc := range []struct {
		kind Kind
		job  string
		tags map[string]string
	}{
		{"weights", "j", nil},
		{"", "j", nil},
		{KindFiles, "", nil},
		{KindFiles, " j", nil},
		{KindFiles, "j\n", nil},
		{KindFiles, "a\x00b", nil},
		{KindFiles, strings.Repeat("j", 201), nil},
		{KindFiles, "j", map[string]string{"": "v"}},
		{KindFiles, "j", map[string]string{"-k": "v"}},
		{KindFiles, "j", map[string]string{"k": "line\nbreak"}},
		{KindFiles, "j", map[string]string{"k": strings.Repeat("v", 257)}},
	} {
		if p, err := s.Begin(tc.kind, tc.job, 1, tc.tags); !errors.Is(err, ErrInvalid) {
			if p != nil {
				p.Abort()
			}
			t.Errorf("Begin(%q, %q, %v) = %v, want ErrInvalid", tc.kind, tc.job, tc.tags, err)
		}
	}
	wantEmpty(t, s)
}

func TestResolve(t *testing.T) {
	s := mustStore(t)
	a1, a2, b := testID("aaaaaaaa", 1), testID("aaaaaaaa", 2), testID("b", 3)
	for i, id := range []string{a1, a2, b} {
		plantManifest(t, s, Manifest{ID: id, Job: "j", Step: int64(i), Created: time.Unix(1000, 0).UTC()})
	}
	mustRebuild(t, s)
	for _, tc := range []struct {
		in   string
		want string
		err  error
	}{
		{a1, a1, nil},
		{a2, a2, nil},
		{"b", b, nil},
		{"  B0 ", b, nil},
		{strings.ToUpper(a1), a1, nil},
		{"aaaaaaaa-0000-4000-8000-000000000002", a2, nil},
		{"a", "", ErrAmbiguous},
		{"aaaaaaaa-0000-4000-8000-00000000000", "", ErrAmbiguous},
		{"c", "", ErrNotFound},
		{"", "", ErrNotFound},
		{"   ", "", ErrNotFound},
		{a1 + "0", "", ErrNotFound},
	} {
		rec, err := s.Resolve(tc.in)
		if tc.err != nil {
			if !errors.Is(err, tc.err) {
				t.Errorf("Resolve(%q) = %v, %v; want %v", tc.in, rec.ID, err, tc.err)
			}
			continue
		}
		if err != nil || rec.ID != tc.want {
			t.Errorf("Resolve(%q) = %v, %v; want %s", tc.in, rec.ID, err, tc.want)
		}
	}
	_, err := s.Resolve("a")
	if err == nil || !strings.Contains(err.Error(), a1) || !strings.Contains(err.Error(), a2) {
		t.Errorf("ambiguity error does not name the candidates: %v", err)
	}

	// A checkpoint being removed is no longer a candidate.
	markDeleting(t, s, a2)
	if rec, err := s.Resolve("a"); err != nil || rec.ID != a1 {
		t.Errorf("Resolve with one candidate being removed = %v, %v", rec.ID, err)
	}
	if _, err := s.Get(a2); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get of a checkpoint being removed: %v", err)
	}
	if _, err := s.Get(testID("f", 9)); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get of an unknown ID: %v", err)
	}
}

// TestResolveCommitted finds a one-character prefix shared by two of 17
// committed checkpoints: 17 IDs cannot all start with different hex digits.
func TestResolveCommitted(t *testing.T) {
	s := mustStore(t)
	byFirst := map[byte][]string{}
	for i := range 17 {
		p, err := s.Begin(KindFiles, "j", int64(i), nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Commit(); err != nil {
			t.Fatal(err)
		}
		byFirst[p.ID()[0]] = append(byFirst[p.ID()[0]], p.ID())
	}
	shared, unique := "", ""
	for c, ids := range byFirst {
		if len(ids) >= 2 {
			shared = string(c)
		}
	}
	if shared == "" {
		t.Fatal("no shared first character among 17 IDs")
	}
	if _, err := s.Resolve(shared); !errors.Is(err, ErrAmbiguous) {
		t.Errorf("Resolve(%q) shared by %v: %v", shared, byFirst[shared[0]], err)
	}
	for _, ids := range byFirst {
		for _, id := range ids {
			// The shortest prefix that only this ID has resolves to it.
			for n := 1; n <= len(id); n++ {
				if rec, err := s.Resolve(id[:n]); err == nil {
					if rec.ID != id {
						t.Errorf("Resolve(%q) = %s, want %s", id[:n], rec.ID, id)
					}
					unique = id[:n]
					break
				} else if !errors.Is(err, ErrAmbiguous) {
					t.Fatalf("Resolve(%q): %v", id[:n], err)
				}
			}
		}
	}
	if unique == "" {
		t.Error("no ID resolved")
	}
}

// markDeleting sets a record's status to deleting, as Remove does first.
func markDeleting(t testing.TB, s *Store, id string) {
	t.Helper()
	rec, err := s.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	rec.Status = StatusDeleting
	if err := s.putRecord(rec); err != nil {
		t.Fatal(err)
	}
}

func TestListAndLatest(t *testing.T) {
	s := mustStore(t)
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC)
	type ck struct {
		job     string
		step    int64
		created time.Time
	}
	cks := []ck{
		{"train", 5, t0},
		{"train", 7, t0},
		{"train", 7, t0.Add(time.Second)}, // newest of the highest step
		{"train", 3, t0.Add(2 * time.Second)},
		{"train", -1, t0.Add(3 * time.Second)},
		{"train x", 100, t0},
		{"b", 1, t0},
		{"a", 9, t0},
	}
	want := map[string][]string{}
	idOf := map[ck]string{}
	for i, c := range cks {
		id := testID("c", i)
		idOf[c] = id
		plantManifest(t, s, Manifest{ID: id, Job: c.job, Step: c.step, Created: c.created})
	}
	mustRebuild(t, s)
	order := slices.Clone(cks)
	slices.SortFunc(order, func(a, b ck) int {
		if c := strings.Compare(a.job, b.job); c != 0 {
			return c
		}
		if a.step != b.step {
			return int(a.step - b.step)
		}
		return a.created.Compare(b.created)
	})
	var all []string
	for _, c := range order {
		all = append(all, idOf[c])
		want[c.job] = append(want[c.job], idOf[c])
	}
	if got := ids(mustList(t, s)); !slices.Equal(got, all) {
		t.Errorf("List = %v\nwant %v", got, all)
	}
	for job, w := range want {
		recs, err := s.List(Filter{Job: job})
		if err != nil {
			t.Fatal(err)
		}
		if got := ids(recs); !slices.Equal(got, w) {
			t.Errorf("List(%q) = %v, want %v", job, got, w)
		}
	}
	latest, err := s.Latest("train")
	if err != nil || latest.ID != idOf[ck{"train", 7, t0.Add(time.Second)}] || !latest.Created.Equal(t0.Add(time.Second)) {
		t.Errorf("Latest(train) = %+v, %v", latest, err)
	}
	if _, err := s.Latest("tra"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Latest of a job prefix: %v", err)
	}
	// Records being removed are listed only on request.
	markDeleting(t, s, latest.ID)
	if l, _ := s.Latest("train"); l.ID != idOf[ck{"train", 7, t0}] {
		t.Errorf("Latest ignores a removal in progress: got %s", l.ID)
	}
	if n := len(mustList(t, s)); n != len(cks)-1 {
		t.Errorf("List shows %d records, want %d", n, len(cks)-1)
	}
	recs, err := s.List(Filter{IncludeAll: true})
	if err != nil || len(recs) != len(cks) {
		t.Errorf("List(IncludeAll) = %d records, %v", len(recs), err)
	}
}

func TestRemove(t *testing.T) {
	s := mustStore(t)
	keep := mustCommit(t, s, "j", 1, 5000)
	gone := mustCommit(t, s, "j", 2, 70000)
	if err := s.Remove(gone.ID); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if _, err := os.Stat(s.CheckpointDir(gone.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("removed checkpoint directory: %v", err)
	}
	if _, err := s.Get(gone.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after Remove: %v", err)
	}
	recs, err := s.List(Filter{IncludeAll: true})
	if err != nil || !slices.Equal(ids(recs), []string{keep.ID}) {
		t.Errorf("List after Remove = %v, %v", ids(recs), err)
	}
	if err := s.Remove(gone.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("second Remove: %v", err)
	}
	wantEmpty(t, s)
	if _, err := s.Verify(context.Background(), keep.ID, ReadOptions{}); err != nil {
		t.Errorf("the other checkpoint: %v", err)
	}
}

func TestPrune(t *testing.T) {
	s := mustStore(t)
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	// Steps created out of order; step 6 twice, the later one newer.
	steps := []int64{3, 6, 1, 5, 2, 4, 6}
	stepOf := map[string]int64{}
	var newest6 string
	for i, st := range steps {
		id := testID("d", i)
		stepOf[id] = st
		plantManifest(t, s, Manifest{ID: id, Job: "p", Step: st, Created: t0.Add(time.Duration(i) * time.Minute)})
		if st == 6 {
			newest6 = id
		}
	}
	other := testID("e", 99)
	plantManifest(t, s, Manifest{ID: other, Job: "q", Step: 1, Created: t0})
	mustRebuild(t, s)

	if _, err := s.Prune("p", -1); !errors.Is(err, ErrInvalid) {
		t.Errorf("Prune with keep -1: %v", err)
	}
	if removed, err := s.Prune("p", 100); err != nil || len(removed) != 0 {
		t.Errorf("Prune keeping more than there are removed %v, %v", ids(removed), err)
	}
	removed, err := s.Prune("p", 3)
	if err != nil {
		t.Fatalf("Prune: %v", err)
	}
	var removedSteps []int64
	for _, r := range removed {
		removedSteps = append(removedSteps, r.Step)
		if _, err := os.Stat(s.CheckpointDir(r.ID)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("pruned %s still on disk: %v", r.ID, err)
		}
	}
	if !slices.Equal(removedSteps, []int64{4, 3, 2, 1}) {
		t.Errorf("Prune(keep 3) removed steps %v, want [4 3 2 1]", removedSteps)
	}
	recs, _ := s.List(Filter{Job: "p"})
	var kept []int64
	for _, r := range recs {
		kept = append(kept, stepOf[r.ID])
	}
	if !slices.Equal(kept, []int64{5, 6, 6}) {
		t.Errorf("kept steps %v, want [5 6 6]", kept)
	}
	// keep 1 keeps the newer of the two step-6 checkpoints.
	if _, err := s.Prune("p", 1); err != nil {
		t.Fatal(err)
	}
	if recs, _ := s.List(Filter{Job: "p"}); !slices.Equal(ids(recs), []string{newest6}) {
		t.Errorf("Prune(keep 1) kept %v, want %s", ids(recs), newest6)
	}
	if removed, err := s.Prune("p", 0); err != nil || !slices.Equal(ids(removed), []string{newest6}) {
		t.Errorf("Prune(keep 0) = %v, %v", ids(removed), err)
	}
	if recs, _ := s.List(Filter{Job: "p"}); len(recs) != 0 {
		t.Errorf("after Prune(keep 0) job p has %v", ids(recs))
	}
	if got := ids(mustList(t, s)); !slices.Equal(got, []string{other}) {
		t.Errorf("other job after pruning: %v", got)
	}
	wantEmpty(t, s)
}

func TestVerifyDetectsDamage(t *testing.T) {
	s := mustStore(t)
	rec := mustCommit(t, s, "j", 1, 5*64<<10+1000)
	m, err := s.Verify(context.Background(), rec.ID, ReadOptions{Workers: 2})
	if err != nil {
		t.Fatalf("Verify of an intact checkpoint: %v", err)
	}
	data := filepath.Join(s.CheckpointDir(rec.ID), "data.0000")
	orig, err := os.ReadFile(data)
	if err != nil {
		t.Fatal(err)
	}
	restore := func() {
		t.Helper()
		if err := os.WriteFile(data, orig, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	c := m.Files[0].Chunks[3]
	flipByte(t, data, c.Offset+c.Stored/3)
	_, err = s.Verify(context.Background(), rec.ID, ReadOptions{})
	var ce *gdswriter.ChunkError
	if !errors.Is(err, gdswriter.ErrCorrupt) || !errors.As(err, &ce) || ce.Index != 3 || ce.Path != data {
		t.Errorf("Verify after a flipped byte in chunk 3: %v", err)
	}
	if err == nil || !strings.Contains(err.Error(), data) || !strings.Contains(err.Error(), "chunk 3") {
		t.Errorf("error %q does not name the file and chunk", err)
	}
	err = s.ReadFileInto(context.Background(), m, m.Files[0], make([]byte, m.Files[0].RawSize), ReadOptions{})
	if !errors.Is(err, gdswriter.ErrCorrupt) || !errors.As(err, &ce) || ce.Index != 3 || ce.Path != data {
		t.Errorf("ReadFileInto after a flipped byte in chunk 3: %v", err)
	}
	restore()

	for _, size := range []int64{int64(len(orig)) + 1, int64(len(orig)) - 4096} {
		if err := os.Truncate(data, size); err != nil {
			t.Fatal(err)
		}
		_, err = s.Verify(context.Background(), rec.ID, ReadOptions{})
		if !errors.Is(err, gdswriter.ErrCorrupt) || !strings.Contains(err.Error(), "bytes, the manifest says") {
			t.Errorf("Verify of a %d-byte data file (want %d): %v", size, len(orig), err)
		}
		err = s.ReadFileInto(context.Background(), m, m.Files[0], make([]byte, m.Files[0].RawSize), ReadOptions{})
		if !errors.Is(err, gdswriter.ErrCorrupt) {
			t.Errorf("ReadFileInto of a %d-byte data file (want %d): %v", size, len(orig), err)
		}
		restore()
	}
	os.Remove(data)
	if _, err := s.Verify(context.Background(), rec.ID, ReadOptions{}); !errors.Is(err, gdswriter.ErrCorrupt) {
		t.Errorf("Verify with the data file missing: %v", err)
	}
	restore()
	if _, err := s.Verify(context.Background(), rec.ID, ReadOptions{NoDirect: true}); err != nil {
		t.Errorf("Verify after restoring: %v", err)
	}

	// A damaged manifest.
	mf := filepath.Join(s.CheckpointDir(rec.ID), manifestName)
	flipByte(t, mf, 200)
	if _, err := s.Verify(context.Background(), rec.ID, ReadOptions{}); !errors.Is(err, ErrBadManifest) {
		t.Errorf("Verify with a damaged manifest: %v", err)
	}
	if _, err := s.Verify(context.Background(), testID("f", 1), ReadOptions{}); !errors.Is(err, ErrNotFound) {
		t.Errorf("Verify of an unknown ID: %v", err)
	}
}

func TestReadManifest(t *testing.T) {
	s := mustStore(t)
	rec := mustCommit(t, s, "j", 1, 100)
	if _, err := s.ReadManifest("not-an-id"); !errors.Is(err, ErrNotFound) {
		t.Errorf("ReadManifest(not-an-id): %v", err)
	}
	if _, err := s.ReadManifest("../../etc"); !errors.Is(err, ErrNotFound) {
		t.Errorf("ReadManifest(../../etc): %v", err)
	}
	if _, err := s.ReadManifest(testID("f", 1)); !errors.Is(err, ErrNotFound) {
		t.Errorf("ReadManifest of an unknown ID: %v", err)
	}
	// A manifest copied under another ID's directory is refused.
	other := testID("f", 2)
	os.Mkdir(s.CheckpointDir(other), 0o700)
	b, _ := os.ReadFile(filepath.Join(s.CheckpointDir(rec.ID), manifestName))
	os.WriteFile(filepath.Join(s.CheckpointDir(other), manifestName), b, 0o600)
	if _, err := s.ReadManifest(other); !errors.Is(err, ErrBadManifest) {
		t.Errorf("ReadManifest of a manifest naming another checkpoint: %v", err)
	}
}
