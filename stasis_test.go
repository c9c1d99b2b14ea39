package stasis

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/cuda/cudatest"
)

// Device buffers are tested with the stand-in driver
// (cuda/testdata/fakecuda), whose device pointers are host addresses; the
// real driver is exercised on the GPU machine (python/tests/test_torch.py).

var fakeDir string // the stand-in's state directory; "" when it could not be built

func TestMain(m *testing.M) {
	var cleanup func()
	fakeDir, cleanup = cudatest.Use()
	code := m.Run()
	cleanup()
	os.Exit(code)
}

func openStore(t *testing.T) *Store {
	t.Helper()
	s, err := Open(Options{Home: filepath.Join(t.TempDir(), "store")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func random(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

var (
	mapped    = cudatest.DeviceMemory
	devicePtr = cudatest.Pointer
)

func hostTensor(name string, b []byte) Tensor {
	return Tensor{Name: name, DType: "uint8", Shape: []int64{int64(len(b))}, Host: b, Bytes: int64(len(b))}
}

func emptyLike(ts []Tensor) []Tensor {
	out := make([]Tensor, len(ts))
	for i, t := range ts {
		out[i] = t
		out[i].Device, out[i].Host = 0, make([]byte, t.Bytes)
	}
	return out
}

func TestBlockingSaveFindDescribeLoad(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	var recs []Record
	for step := int64(1); step <= 3; step++ {
		c := s.Begin("train", step)
		if err := c.Add(hostTensor("w", random(5<<20, uint64(step)))); err != nil {
			t.Fatal(err)
		}
		if err := c.SetState([]byte(fmt.Sprintf(`{"step":%d}`, step))); err != nil {
			t.Fatal(err)
		}
		rec, err := c.Commit(ctx)
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, rec)
	}
	if latest, err := s.Find("train", -1); err != nil || latest.ID != recs[2].ID {
		t.Fatalf("latest: %v %v", latest.ID, err)
	}
	if two, err := s.Find("train", 2); err != nil || two.ID != recs[1].ID {
		t.Fatalf("step 2: %v %v", two.ID, err)
	}
	if _, err := s.Find("train", 9); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("step 9: %v", err)
	}
	if list, err := s.List("train"); err != nil || len(list) != 3 {
		t.Fatalf("list: %d %v", len(list), err)
	}
	info, err := s.Describe(recs[1].ID[:8])
	if err != nil {
		t.Fatal(err)
	}
	var state bytes.Buffer
	json.Compact(&state, info.State)
	if state.String() != `{"step":2}` || len(info.Tensors) != 1 || info.Tensors[0].Bytes != 5<<20 || info.IOPath != "host" {
		t.Fatalf("describe: %+v", info)
	}
	into := emptyLike(info.Tensors)
	if _, err := s.Load(ctx, recs[1].ID, into); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(into[0].Host, random(5<<20, 2)) {
		t.Fatal("step 2 loaded different bytes")
	}
	wrong := []Tensor{hostTensor("w", make([]byte, 5))}
	if _, err := s.Load(ctx, recs[1].ID, wrong); !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "w is uint8 of 5242880 bytes in the checkpoint") {
		t.Fatalf("load into a wrong size: %v", err)
	}
}

// TestAsyncSnapshot changes every buffer as soon as CommitAsync returns:
// the checkpoint holds the bytes as they were when it was called.
func TestAsyncSnapshot(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	host := random(9<<20, 1)
	want := map[string][]byte{"host": bytes.Clone(host)}
	ts := []Tensor{hostTensor("host", host)}
	var dev []byte
	if fakeDir != "" {
		dev = mapped(t, 7<<20+3)
		copy(dev, random(len(dev), 2))
		want["dev"] = bytes.Clone(dev)
		ts = append(ts, Tensor{Name: "dev", DType: "uint8", Shape: []int64{int64(len(dev))}, Device: devicePtr(dev), Bytes: int64(len(dev))})
	}
	c := s.Begin("async", 10)
	for _, tn := range ts {
		if err := c.Add(tn); err != nil {
			t.Fatal(err)
		}
	}
	save, err := c.CommitAsync(ctx, AsyncOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range host {
		host[i] ^= 0xff
	}
	for i := range dev {
		dev[i] ^= 0xff
	}
	rec, err := save.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if !save.Done() || rec.Step != 10 || rec.Job != "async" {
		t.Fatalf("after Wait: done %v, record %+v", save.Done(), rec)
	}
	info, err := s.Describe(rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if info.IOPath != "snapshot" {
		t.Fatalf("io path %q", info.IOPath)
	}
	into := emptyLike(info.Tensors)
	if _, err := s.Load(ctx, rec.ID, into); err != nil {
		t.Fatal(err)
	}
	for _, tn := range into {
		if !bytes.Equal(tn.Host, want[tn.Name]) {
			t.Errorf("%s: the checkpoint does not hold the bytes of the moment CommitAsync was called", tn.Name)
		}
	}
	if fakeDir == "" {
		t.Log("device buffers not tested: the stand-in driver could not be built (no gcc)")
	}
}

// TestSecondSaveWaits starts a save while one is in flight: by default it
// waits, with FailIfBusy it is refused, and both checkpoints end complete.
func TestSecondSaveWaits(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	big := random(64<<20, 3)
	first := s.Begin("busy", 1)
	first.Add(hostTensor("w", big))
	s1, err := first.CommitAsync(ctx, AsyncOptions{})
	if err != nil {
		t.Fatal(err)
	}
	refused := s.Begin("busy", 2)
	refused.Add(hostTensor("w", big[:1<<20]))
	if _, err := refused.CommitAsync(ctx, AsyncOptions{FailIfBusy: true}); err != nil {
		if !errors.Is(err, ErrSaveInFlight) {
			t.Fatalf("FailIfBusy: %v", err)
		}
		if err := refused.check(); err != nil {
			t.Fatalf("a checkpoint refused as busy can no longer be committed: %v", err)
		}
	} else {
		t.Log("the first save finished before the second began: FailIfBusy not exercised")
	}
	second := s.Begin("busy", 3)
	second.Add(hostTensor("w", big[:1<<20]))
	s2, err := second.CommitAsync(ctx, AsyncOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !s1.Done() {
		t.Fatal("the second save did not wait for the first")
	}
	if _, err := s2.Wait(); err != nil {
		t.Fatal(err)
	}
	if _, err := second.Commit(ctx); err == nil {
		t.Fatal("a checkpoint was committed twice")
	}
	if list, _ := s.List("busy"); len(list) != 2 || list[0].Step != 1 || list[1].Step != 3 {
		t.Fatalf("listed %+v", list)
	}
}

// TestAsyncDeviceErrorListsNothing makes a device-to-host copy of the
// snapshot fail: CommitAsync returns the error and nothing is listed.
func TestAsyncDeviceErrorListsNothing(t *testing.T) {
	if fakeDir == "" {
		t.Skip("the stand-in driver could not be built (no gcc)")
	}
	os.WriteFile(filepath.Join(fakeDir, "fail-dtoh"), []byte("1"), 0o600) // the next copy fails
	defer os.Remove(filepath.Join(fakeDir, "fail-dtoh"))
	s := openStore(t)
	dev := mapped(t, 200<<20)
	c := s.Begin("fail", 1)
	c.Add(Tensor{Name: "w", DType: "fp32", Shape: []int64{50 << 20}, Device: devicePtr(dev), Bytes: int64(len(dev))})
	if _, err := c.CommitAsync(context.Background(), AsyncOptions{}); err == nil || !strings.Contains(err.Error(), "w: cuMemcpyDtoH") {
		t.Fatalf("snapshot with a failing copy: %v", err)
	}
	if list, _ := s.List(""); len(list) != 0 {
		t.Fatalf("listed %+v", list)
	}
}

func TestBadInput(t *testing.T) {
	s := openStore(t)
	c := s.Begin("bad", 1)
	if err := c.Add(Tensor{Name: "w", DType: "fp32", Shape: []int64{3}, Host: make([]byte, 8), Bytes: 8}); !errors.Is(err, ErrMismatch) {
		t.Fatalf("size not matching shape: %v", err)
	}
	if err := c.Add(hostTensor("../w", []byte{1})); !errors.Is(err, ErrMismatch) {
		t.Fatalf("a name with ..: %v", err)
	}
	c.Add(hostTensor("w", []byte{1}))
	if err := c.Add(hostTensor("w", []byte{2})); !errors.Is(err, ErrMismatch) {
		t.Fatalf("a duplicate name: %v", err)
	}
	if err := c.SetState([]byte("{")); !errors.Is(err, catalog.ErrInvalid) {
		t.Fatalf("bad state JSON: %v", err)
	}
	if _, err := s.Begin(" spaced ", 1).Commit(context.Background()); !errors.Is(err, catalog.ErrInvalid) {
		t.Fatalf("a bad job name: %v", err)
	}
	if _, err := Open(Options{Home: t.TempDir(), Compress: "lz77"}); !errors.Is(err, catalog.ErrInvalid) {
		t.Fatalf("an unknown codec: %v", err)
	}
}

// TestSnapshotMemoryPinnedOnce prepares the snapshot memory and saves GPU
// memory three times: it is pinned once (in the background, by Prepare)
// and unpinned once, by Close.
func TestSnapshotMemoryPinnedOnce(t *testing.T) {
	if fakeDir == "" {
		t.Skip("the stand-in driver could not be built (no gcc)")
	}
	log := filepath.Join(fakeDir, "calls.log")
	os.Remove(log)
	s, err := Open(Options{Home: filepath.Join(t.TempDir(), "store")})
	if err != nil {
		t.Fatal(err)
	}
	dev := mapped(t, 3<<20)
	if err := s.Prepare([]Tensor{{Name: "w", DType: "uint8", Shape: []int64{3 << 20}, Device: devicePtr(dev), Bytes: 3 << 20}}); err != nil {
		t.Fatal(err)
	}
	for step := int64(1); step <= 3; step++ {
		c := s.Begin("pin", step)
		c.Add(Tensor{Name: "w", DType: "uint8", Shape: []int64{3 << 20}, Device: devicePtr(dev), Bytes: 3 << 20})
		v, err := c.CommitAsync(context.Background(), AsyncOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := v.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if count := cudatest.Calls(fakeDir); count["register"] != 1 || count["unregister"] != 1 {
		calls, _ := os.ReadFile(log)
		t.Fatalf("pinned %d times, unpinned %d times:\n%s", count["register"], count["unregister"], calls)
	}
}

// TestRefusedBeforeAnythingIsWritten: calls that cannot give a readable
// checkpoint are refused with ErrInvalid, and nothing is listed.
func TestRefusedBeforeAnythingIsWritten(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	if _, err := s.Begin("neg", -1).Commit(ctx); !errors.Is(err, catalog.ErrInvalid) {
		t.Fatalf("a negative step: %v", err)
	}
	if _, err := s.Find("", -1); !errors.Is(err, catalog.ErrInvalid) {
		t.Fatalf("Find with no job: %v", err)
	}
	big := s.Begin("big", 1)
	if err := big.SetState(append(append([]byte("["), bytes.Repeat([]byte("1,"), maxState/2)...), '1', ']')); !errors.Is(err, catalog.ErrInvalid) {
		t.Fatalf("a state description over the limit: %v", err)
	}
	if err := big.SetCompress("lz77"); !errors.Is(err, catalog.ErrInvalid) {
		t.Fatalf("an unknown codec: %v", err)
	}
	if list, _ := s.List(""); len(list) != 0 {
		t.Fatalf("listed %+v", list)
	}
}

// TestFindPassesOverOtherKinds: the latest checkpoint of a job may be a
// process checkpoint (stasis run's fallback); Find returns the latest
// tensors one.
func TestFindPassesOverOtherKinds(t *testing.T) {
	s := openStore(t)
	c := s.Begin("mixed", 1)
	c.Add(hostTensor("w", []byte{1, 2, 3}))
	rec, err := c.Commit(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cat, err := catalog.Open(s.Home(), catalog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := cat.Begin(catalog.KindProcess, "mixed", 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Find("mixed", -1); err != nil || got.ID != rec.ID {
		t.Fatalf("Find returned %+v, %v; want the tensors checkpoint %s", got, err, rec.ID)
	}
}

// TestClosedStoreCommitsNothing: a checkpoint begun before Close is refused
// afterwards, and the snapshot memory is not allocated again.
func TestClosedStoreCommitsNothing(t *testing.T) {
	s, err := Open(Options{Home: filepath.Join(t.TempDir(), "store")})
	if err != nil {
		t.Fatal(err)
	}
	c := s.Begin("closed", 1)
	c.Add(hostTensor("w", []byte{1}))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CommitAsync(context.Background(), AsyncOptions{}); !errors.Is(err, catalog.ErrInvalid) {
		t.Fatalf("commit after Close: %v", err)
	}
	if s.arena.buf != nil {
		t.Fatal("snapshot memory allocated after Close")
	}
	if err := s.Close(); !errors.Is(err, catalog.ErrInvalid) {
		t.Fatalf("Close twice: %v", err)
	}
}

// TestCuFilePath commits GPU buffers through cuFile (the stand-in
// libcufile) and loads them back through it and through the pinned path;
// Describe says which path the bytes took, and why.
func TestCuFilePath(t *testing.T) {
	if fakeDir == "" {
		t.Skip("the stand-in driver could not be built (no gcc)")
	}
	s := openStore(t)
	src := mapped(t, 9<<20)
	copy(src, random(len(src), 21))
	w := Tensor{Name: "w", DType: "uint8", Shape: []int64{9 << 20}, Device: devicePtr(src), Bytes: 9 << 20}
	c := s.Begin("cufile", 1)
	c.Add(w)
	if err := c.SetIO("gds"); !errors.Is(err, catalog.ErrInvalid) {
		t.Fatalf("SetIO(gds): %v", err)
	}
	c.SetCompress("none")
	if err := c.SetIO("cufile"); err != nil {
		t.Fatal(err)
	}
	rec, err := c.Commit(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Describe(rec.ID)
	if err != nil || info.IOPath != "cufile-compat" || !strings.HasPrefix(info.IOWhy, "2 of 3 chunks written by cuFileWrite") {
		t.Fatalf("Describe: %+v, %v", info, err)
	}
	for _, io := range []string{"cufile", "pinned"} {
		dst := mapped(t, 9<<20)
		into := []Tensor{w}
		into[0].Device = devicePtr(dst)
		if _, err := s.LoadWith(context.Background(), rec.ID, into, LoadOptions{IO: io}); err != nil || !bytes.Equal(dst, src) {
			t.Fatalf("load through %s: %v", io, err)
		}
	}
	if _, err := Open(Options{Home: s.Home(), IO: "direct"}); !errors.Is(err, catalog.ErrInvalid) {
		t.Fatalf("Open with IO direct: %v", err)
	}
}
