package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/minio/minio-go/v7"
	"github.com/stasis-ckpt/stasis/cli"
	"github.com/stasis-ckpt/stasis/internal/s3test"
)

// The object-store tests run stasis against a real SeaweedFS (s3test),
// as two nodes would: two store homes, A and B, that share nothing but
// the remote.

// runS3 runs stasis with home as its store and srv's endpoint and
// credentials in its environment, plus env.
func runS3(t *testing.T, srv *s3test.Server, home string, env []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(stasisBin, args...)
	cmd.Env = append(append(append(os.Environ(), srv.Env()...), "STASIS_HOME="+home), env...)
	r := runCmd(t, cmd)
	if strings.Contains(r.stdout+r.stderr, s3test.SecretKey) {
		t.Fatalf("stasis %v printed the secret key: %s%s", args, r.stdout, r.stderr)
	}
	return r
}

func mustS3(t *testing.T, srv *s3test.Server, home string, args ...string) result {
	t.Helper()
	r := runS3(t, srv, home, nil, args...)
	if r.code != 0 {
		t.Fatalf("stasis %v: exit %d: %s", args, r.code, r.stderr)
	}
	return r
}

// sampleTree writes files worth a multipart upload: random bytes (which
// do not compress) past two 16 MiB parts, and some text.
func sampleTree(t *testing.T, mib int) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "model")
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	rnd := make([]byte, mib<<20)
	r := rand.New(rand.NewPCG(7, uint64(mib)))
	for i := 0; i+8 <= len(rnd); i += 8 {
		v := r.Uint64()
		for k := range 8 {
			rnd[i+k] = byte(v >> (8 * k))
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "weights.bin"), rnd, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sub", "notes.txt"), bytes.Repeat([]byte("step 1200 loss 0.25\n"), 5000), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func sameRemoteTree(t *testing.T, a, b string) {
	t.Helper()
	for _, rel := range []string{"weights.bin", "sub/notes.txt"} {
		x, err1 := os.ReadFile(filepath.Join(a, rel))
		y, err2 := os.ReadFile(filepath.Join(b, filepath.Base(a), rel)) // saved under its base name
		if err1 != nil || err2 != nil || !bytes.Equal(x, y) {
			t.Fatalf("%s differs after the round trip (%v, %v)", rel, err1, err2)
		}
	}
}

// remoteObjects lists the keys under prefix in the server's bucket.
func remoteObjects(t *testing.T, srv *s3test.Server, prefix string) []string {
	t.Helper()
	var keys []string
	for o := range srv.Client().ListObjects(context.Background(), srv.Bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if o.Err != nil {
			t.Fatal(o.Err)
		}
		keys = append(keys, o.Key)
	}
	return keys
}

func hasManifest(keys []string, id string) bool {
	for _, k := range keys {
		if strings.HasSuffix(k, "/checkpoints/"+id+"/manifest") {
			return true
		}
	}
	return false
}

func TestRemotePushPullAcrossHomes(t *testing.T) {
	srv := s3test.Start(t)
	remoteURL := srv.Remote("cluster-a")
	nodeA, nodeB, nodeC := t.TempDir(), t.TempDir(), t.TempDir()
	src := sampleTree(t, 40)
	id := save(t, nodeA, "llama", 1200, "--compress", "auto", src)

	// Push: data, then the manifest; stdout has the ID.
	r := mustS3(t, srv, nodeA, "push", id, "--remote", remoteURL)
	if strings.TrimSpace(r.stdout) != id || !strings.Contains(r.stderr, "pushed "+id) {
		t.Fatalf("push printed %q / %q", r.stdout, r.stderr)
	}
	keys := remoteObjects(t, srv, "cluster-a/")
	if !hasManifest(keys, id) || len(keys) != 2 {
		t.Fatalf("after the push the remote holds %v; want data.0000 and manifest of %s", keys, id)
	}
	// Again: nothing to send, nothing overwritten.
	r = mustS3(t, srv, nodeA, "push", id, "--remote", remoteURL)
	if !strings.Contains(r.stderr, "already") {
		t.Fatalf("a second push: %q", r.stderr)
	}

	// Node B sees it on the remote only, pulls it, and loads it.
	r = mustS3(t, srv, nodeB, "ls", "--remote", "--remote-url", remoteURL, "--json")
	var rows []struct {
		ID    string `json:"id"`
		Where string `json:"where"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil || len(rows) != 1 || rows[0].ID != id || rows[0].Where != "remote" {
		t.Fatalf("ls --remote on node B: %s (%v)", r.stdout, err)
	}
	r = mustS3(t, srv, nodeB, "pull", id[:8], "--remote", remoteURL)
	if strings.TrimSpace(r.stdout) != id {
		t.Fatalf("pull printed %q", r.stdout)
	}
	mustS3(t, srv, nodeB, "verify", id)
	out := filepath.Join(t.TempDir(), "restored")
	mustS3(t, srv, nodeB, "load", id, "--to", out)
	sameRemoteTree(t, src, out)
	r = mustS3(t, srv, nodeB, "ls", "--remote", "--remote-url", remoteURL)
	if !strings.Contains(r.stdout, "local+remote") {
		t.Fatalf("ls --remote after the pull:\n%s", r.stdout)
	}
	// A second pull changes nothing.
	r = mustS3(t, srv, nodeB, "pull", id, "--remote", remoteURL)
	if !strings.Contains(r.stderr, "already") {
		t.Fatalf("a second pull: %q", r.stderr)
	}

	// Node C names the remote in config.toml only, and loads the
	// checkpoint by ID: it is pulled first.
	if err := os.WriteFile(filepath.Join(nodeC, "config.toml"), []byte("remote = \""+remoteURL+"\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out = filepath.Join(t.TempDir(), "restored-c")
	r = mustS3(t, srv, nodeC, "load", id, "--to", out)
	if !strings.Contains(r.stderr, "pulling it from") {
		t.Fatalf("load on node C did not say it pulled: %q", r.stderr)
	}
	sameRemoteTree(t, src, out)

	// Node D has no checkpoint of the job: --job J --latest takes the
	// remote's latest.
	nodeD := t.TempDir()
	out = filepath.Join(t.TempDir(), "restored-d")
	r = runS3(t, srv, nodeD, []string{"STASIS_REMOTE=" + remoteURL}, "load", "--job", "llama", "--latest", "--to", out)
	if r.code != 0 || !strings.Contains(r.stderr, id+" is not in this store") {
		t.Fatalf("load --job --latest on node D: exit %d: %s", r.code, r.stderr)
	}
	sameRemoteTree(t, src, out)

	// push --all sends what is missing only.
	id2 := save(t, nodeA, "llama", 1300, sampleTreeSmall(t))
	r = mustS3(t, srv, nodeA, "push", "--all", "--remote", remoteURL, "--json")
	var pushed []struct {
		ID      string `json:"id"`
		Already bool   `json:"already_there"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &pushed); err != nil || len(pushed) != 2 {
		t.Fatalf("push --all --json: %s (%v)", r.stdout, err)
	}
	for _, p := range pushed {
		if p.Already != (p.ID == id) {
			t.Fatalf("push --all: %+v (the first checkpoint was there, %s was not)", pushed, id2)
		}
	}
	// The manifests on the remote are the local ones, byte for byte.
	local, err := os.ReadFile(filepath.Join(nodeA, "checkpoints", id2, "manifest"))
	if err != nil {
		t.Fatal(err)
	}
	obj, err := srv.Client().GetObject(context.Background(), srv.Bucket, "cluster-a/checkpoints/"+id2+"/manifest", minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(obj); err != nil || !bytes.Equal(buf.Bytes(), local) {
		t.Fatalf("the remote manifest of %s is not the local one (%v)", id2, err)
	}
	if bytes.Contains(local, []byte(s3test.SecretKey)) || bytes.Contains(local, []byte(s3test.AccessKey)) {
		t.Fatal("a credential reached the manifest")
	}
}

func sampleTreeSmall(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "small")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "opt.txt"), bytes.Repeat([]byte("adam "), 1000), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// holdS3 starts stasis held at crash point point; release lets it go on
// and returns its result.
func holdS3(t *testing.T, srv *s3test.Server, home, point string, args ...string) (release func() result) {
	release, _ = holdS3Cmd(t, srv, home, point, args...)
	return release
}

// holdS3Cmd is holdS3 that also returns the held process.
func holdS3Cmd(t *testing.T, srv *s3test.Server, home, point string, args ...string) (release func() result, cmd *exec.Cmd) {
	t.Helper()
	cmd = exec.Command(stasisBin, args...)
	cmd.Env = append(append(os.Environ(), srv.Env()...), "STASIS_HOME="+home)
	return startHeld(t, cmd, point).release, cmd
}

func TestRemoteFaults(t *testing.T) {
	srv := s3test.Start(t)
	remoteURL := srv.Remote("faults")
	nodeA, nodeB := t.TempDir(), t.TempDir()
	src := sampleTree(t, 48)
	id := save(t, nodeA, "gpt", 7, "--compress", "none", src)

	t.Run("wrong credentials", func(t *testing.T) {
		r := runS3(t, srv, nodeA, []string{"AWS_SECRET_ACCESS_KEY=not-the-secret-42"}, "push", id, "--remote", remoteURL)
		expectCode(t, r, cli.ExitAuth, `refused the credentials`)
		if strings.Contains(r.stderr, "not-the-secret-42") {
			t.Fatalf("the error shows the secret: %s", r.stderr)
		}
		r = runS3(t, srv, nodeA, []string{"AWS_ACCESS_KEY_ID=", "AWS_SECRET_ACCESS_KEY=", "AWS_SHARED_CREDENTIALS_FILE=/nonexistent"}, "push", id, "--remote", remoteURL)
		expectCode(t, r, cli.ExitAuth, `no S3 credentials`)
		if keys := remoteObjects(t, srv, "faults/"); len(keys) != 0 {
			t.Fatalf("refused pushes left %v", keys)
		}
	})

	t.Run("missing bucket", func(t *testing.T) {
		r := runS3(t, srv, nodeA, nil, "push", id, "--remote", "s3+http://no-such-bucket/x")
		expectCode(t, r, cli.ExitNoBucket, `no-such-bucket does not exist`)
		r = runS3(t, srv, nodeB, nil, "pull", id, "--remote", "s3+http://no-such-bucket/x")
		expectCode(t, r, cli.ExitNoBucket, `no-such-bucket`)
	})

	t.Run("plain HTTP only when asked", func(t *testing.T) {
		r := runS3(t, srv, nodeA, nil, "push", id, "--remote", "s3://"+srv.Bucket+"/faults")
		expectCode(t, r, cli.ExitUsage, `plain HTTP`)
	})

	t.Run("another manifest under the ID", func(t *testing.T) {
		id3 := save(t, nodeA, "gpt", 9, sampleTreeSmall(t))
		key := "faults/checkpoints/" + id3 + "/manifest"
		other := []byte("stasis-manifest 1 sha256=0000\n{}\n")
		if _, err := srv.Client().PutObject(context.Background(), srv.Bucket, key, bytes.NewReader(other), int64(len(other)), minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
		r := runS3(t, srv, nodeA, nil, "push", id3, "--remote", remoteURL)
		expectCode(t, r, cli.ExitExists, `differs from this store's; nothing was overwritten`)
		obj, err := srv.Client().GetObject(context.Background(), srv.Bucket, key, minio.GetObjectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if _, err := buf.ReadFrom(obj); err != nil || !bytes.Equal(buf.Bytes(), other) {
			t.Fatalf("the manifest there was overwritten (%v)", err)
		}
		if err := srv.Client().RemoveObject(context.Background(), srv.Bucket, key, minio.RemoveObjectOptions{}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("server killed mid-upload", func(t *testing.T) {
		release := holdS3(t, srv, nodeA, "push-mid-data", "push", id, "--remote", remoteURL)
		srv.Kill()
		r := release()
		expectCode(t, r, cli.ExitUnreachable, `cannot be reached`)
		srv.Restart()
		if keys := remoteObjects(t, srv, "faults/"); hasManifest(keys, id) {
			t.Fatalf("an interrupted push left a manifest: %v", keys)
		}
		r = runS3(t, srv, nodeB, nil, "pull", id, "--remote", remoteURL)
		expectCode(t, r, cli.ExitNotFound, `not on`)
		mustS3(t, srv, nodeA, "verify", id) // the local copy is intact
		mustS3(t, srv, nodeA, "push", id, "--remote", remoteURL)
		if keys := remoteObjects(t, srv, "faults/"); !hasManifest(keys, id) {
			t.Fatalf("the retried push left %v", keys)
		}
	})

	t.Run("stasis killed mid-upload, gc --remote", func(t *testing.T) {
		id2 := save(t, nodeA, "gpt", 8, "--compress", "none", src)
		r := runS3(t, srv, nodeA, []string{"STASIS_CRASH_AT=push-mid-data"}, "push", id2, "--remote", remoteURL)
		if r.code != 128+9 && r.code != -1 {
			t.Fatalf("push was not killed: exit %d %s", r.code, r.stderr)
		}
		uploads := 0
		for u := range srv.Client().ListIncompleteUploads(context.Background(), srv.Bucket, "faults/", true) {
			if u.Err == nil {
				uploads++
			}
		}
		if uploads == 0 {
			t.Fatal("no interrupted multipart upload to clean")
		}
		// Within the grace, gc leaves it (a push may be under way).
		r = mustS3(t, srv, nodeA, "gc", "--remote", "--remote-url", remoteURL, "--json")
		var rep struct {
			Aborted []string `json:"uploads_aborted"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || len(rep.Aborted) != 0 {
			t.Fatalf("gc within the grace: %s (%v)", r.stdout, err)
		}
		r = mustS3(t, srv, nodeA, "gc", "--remote", "--remote-url", remoteURL, "--grace", "0s", "--json")
		if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || len(rep.Aborted) == 0 {
			t.Fatalf("gc --grace 0s: %s (%v)", r.stdout, err)
		}
		left := 0
		for u := range srv.Client().ListIncompleteUploads(context.Background(), srv.Bucket, "faults/", true) {
			if u.Err == nil {
				left++
			}
		}
		if left != 0 {
			t.Fatalf("%d multipart uploads left after gc", left)
		}
		if keys := remoteObjects(t, srv, "faults/"); !hasManifest(keys, id) {
			t.Fatalf("gc removed a complete checkpoint: %v", keys)
		}
		mustS3(t, srv, nodeA, "push", id2, "--remote", remoteURL)
	})

	t.Run("server down during pull", func(t *testing.T) {
		release := holdS3(t, srv, nodeB, "pull-mid-data", "pull", id, "--remote", remoteURL)
		srv.Kill()
		r := release()
		expectCode(t, r, cli.ExitUnreachable, `cannot be reached`)
		if r := mustS3(t, srv, nodeB, "ls", "--json"); strings.TrimSpace(r.stdout) != "[]" {
			t.Fatalf("a failed pull listed %s", r.stdout)
		}
		if ents, _ := os.ReadDir(filepath.Join(nodeB, "staging")); len(ents) != 0 {
			t.Fatalf("a failed pull left %d entries in staging/", len(ents))
		}
		r = runS3(t, srv, nodeB, nil, "pull", id, "--remote", remoteURL)
		expectCode(t, r, cli.ExitUnreachable, `cannot be reached`)
		srv.Restart()
		mustS3(t, srv, nodeB, "pull", id, "--remote", remoteURL)
		mustS3(t, srv, nodeB, "verify", id)
		mustS3(t, srv, nodeB, "rm", id)
	})

	t.Run("SIGTERM during a pull", func(t *testing.T) {
		release, cmd := holdS3Cmd(t, srv, nodeB, "pull-mid-data", "pull", id, "--remote", remoteURL)
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		r := release()
		if r.code != cli.ExitInterrupted {
			t.Fatalf("exit %d, want %d: %s", r.code, cli.ExitInterrupted, r.stderr)
		}
		if r := mustS3(t, srv, nodeB, "ls", "--json"); strings.TrimSpace(r.stdout) != "[]" {
			t.Fatalf("an interrupted pull listed %s", r.stdout)
		}
		if ents, _ := os.ReadDir(filepath.Join(nodeB, "staging")); len(ents) != 0 {
			t.Fatalf("an interrupted pull left %d entries in staging/", len(ents))
		}
	})

	t.Run("object corrupted on the server", func(t *testing.T) {
		key := "faults/checkpoints/" + id + "/data.0000"
		ctx := context.Background()
		obj, err := srv.Client().GetObject(ctx, srv.Bucket, key, minio.GetObjectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if _, err := buf.ReadFrom(obj); err != nil {
			t.Fatal(err)
		}
		data := buf.Bytes()
		data[len(data)/2] ^= 0x40
		if _, err := srv.Client().PutObject(ctx, srv.Bucket, key, bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
		r := runS3(t, srv, nodeB, nil, "pull", id, "--remote", remoteURL)
		expectCode(t, r, cli.ExitCorrupt, `chunk`)
		if r := mustS3(t, srv, nodeB, "ls", "--json"); strings.TrimSpace(r.stdout) != "[]" {
			t.Fatalf("a refused pull listed %s", r.stdout)
		}
		// A push from node A mends the object (not marked as this
		// manifest's any more); the pull then completes.
		mustS3(t, srv, nodeA, "push", id, "--remote", remoteURL)
		mustS3(t, srv, nodeB, "pull", id, "--remote", remoteURL)
		out := filepath.Join(t.TempDir(), "restored")
		mustS3(t, srv, nodeB, "load", id, "--to", out)
		sameRemoteTree(t, src, out)
	})
}

// TestRemoteProcessRestoreOnNodeB: a process checkpoint taken on node A
// is pushed; node B, which names the remote in its config.toml only,
// restores it by ID (pulling it first), and the counter goes on from
// where it stopped.
func TestRemoteProcessRestoreOnNodeB(t *testing.T) {
	requireCRIU(t)
	srv := s3test.Start(t)
	remoteURL := srv.Remote("procs")
	nodeA, nodeB := t.TempDir(), t.TempDir()
	_, id, out, atDump := checkpointedCounter(t, nodeA, "--job", "counter", "--step", "3")
	mustS3(t, srv, nodeA, "push", id, "--remote", remoteURL)
	if err := os.WriteFile(filepath.Join(nodeB, "config.toml"), []byte("remote = \""+remoteURL+"\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := mustS3(t, srv, nodeB, "restore", id)
	if !strings.Contains(r.stderr, "pulling it from") {
		t.Fatalf("restore on node B did not say it pulled: %q", r.stderr)
	}
	restoredPID(t, r)
	consecutive(t, waitCounting(t, out, atDump+10))
}

// TestRemoteServerFull: an engine with no room left for data (SeaweedFS
// told to keep more free space than the disk has: its volumes go
// read-only) fails the push with one line, exit 20, no manifest object
// on the remote, the local copy intact; once it has room again, the
// same push completes.
func TestRemoteServerFull(t *testing.T) {
	srv := s3test.Start(t, "-volume.minFreeSpace=1000000GiB")
	remoteURL := srv.Remote("full")
	nodeA := t.TempDir()
	id := save(t, nodeA, "gpt", 1, sampleTreeSmall(t))
	r := runS3(t, srv, nodeA, nil, "push", id, "--remote", remoteURL)
	expectCode(t, r, cli.ExitUnreachable, `the engine answered 5\d\d`)
	if keys := remoteObjects(t, srv, "full/"); hasManifest(keys, id) {
		t.Fatalf("a failed push left a manifest: %v", keys)
	}
	mustS3(t, srv, nodeA, "verify", id)
	srv.Kill()
	srv.Args = nil
	srv.Restart()
	mustS3(t, srv, nodeA, "push", id, "--remote", remoteURL)
	if keys := remoteObjects(t, srv, "full/"); !hasManifest(keys, id) {
		t.Fatalf("the retried push left %v", keys)
	}
}
