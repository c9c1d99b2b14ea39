package cli_test

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stasis-ckpt/stasis/cli"
)

// The checkpoints of store format 1 in testdata/format1 (made once by
// testdata/format1/make.sh, 2026-11-25, and kept as they are) must stay
// readable by every later stasis: imported, verified, and their contents
// as they were saved.

type formatWant struct {
	Files struct {
		ID     string            `json:"id"`
		SHA256 map[string]string `json:"sha256"`
	} `json:"files"`
	Tensors struct {
		ID string `json:"id"`
	} `json:"tensors"`
	Job struct {
		ID    string `json:"id"`
		Ranks int    `json:"ranks"`
	} `json:"job"`
	Process struct {
		ID string `json:"id"`
	} `json:"process"`
}

func TestFormat1Fixtures(t *testing.T) {
	var want formatWant
	data, err := os.ReadFile("testdata/format1/want.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &want); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(t.TempDir(), "store")
	for _, c := range []struct{ file, id string }{
		{"files.tar", want.Files.ID}, {"tensors.tar", want.Tensors.ID}, {"job.tar", want.Job.ID}, {"process.tar", want.Process.ID},
	} {
		if got := strings.TrimSpace(mustRun(t, home, "import", "testdata/format1/"+c.file).stdout); !strings.HasSuffix(got, c.id) {
			t.Fatalf("import %s printed %q, want %s", c.file, got, c.id)
		}
		mustRun(t, home, "verify", c.id)
	}
	if out := mustRun(t, home, "show", want.Job.ID).stdout; !strings.Contains(out, "rank 1:") {
		t.Errorf("show of the job checkpoint:\n%s", out)
	}

	to := filepath.Join(t.TempDir(), "out")
	mustRun(t, home, "load", want.Files.ID, "--to", to)
	for name, sum := range want.Files.SHA256 {
		b, err := os.ReadFile(filepath.Join(to, "tree", name))
		if err != nil {
			t.Fatal(err)
		}
		if got := sha256.Sum256(b); hex.EncodeToString(got[:]) != sum {
			t.Errorf("%s loaded with another content", name)
		}
	}
	if link, err := os.Readlink(filepath.Join(to, "tree", "link")); err != nil || link != "a.txt" {
		t.Errorf("link: %q, %v", link, err)
	}
	if st, err := os.Stat(filepath.Join(to, "tree", "empty")); err != nil || !st.IsDir() {
		t.Errorf("empty directory: %v", err)
	}

	// The tensors, through the Python package: the state save.py wrote.
	lib, err := filepath.Abs("../bin/libstasis.so")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(lib); err != nil {
		t.Skipf("the tensors' contents are checked through the Python package, which needs bin/libstasis.so (make builds it): %v", err)
	}
	if exec.Command("/usr/bin/python3", "-c", "import numpy").Run() != nil {
		t.Skip("the tensors' contents are checked with NumPy in /usr/bin/python3 (make installs it)")
	}
	check := `
import numpy as np, stasis
def want(r):
    return {"w": np.arange(4096, dtype=np.float32).reshape(64, 64) * (r + 1),
            "h": np.linspace(-1, 1, 1000).astype(np.float16), "n": np.arange(7, dtype=np.int64) - r,
            "meta": {"step": 3, "name": "fixture", "lr": 0.25}}
def same(a, b):
    assert a.keys() == b.keys(), (a.keys(), b.keys())
    for k in a:
        if isinstance(a[k], dict):
            assert a[k] == b[k], (k, a[k], b[k])
        else:
            assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k
same(stasis.load(job="fx-tensors"), want(0))
for r in range(2):
    same(stasis.load(job="fx-job", rank=r, world_size=2), want(r))
print("ok")
`
	py, _ := filepath.Abs("../python")
	cmd := exec.Command("/usr/bin/python3", "-c", check)
	cmd.Env = append(os.Environ(), "STASIS_HOME="+home, "STASIS_LIB="+lib, "PYTHONPATH="+py)
	if out, err := cmd.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("the tensors of format 1: %v\n%s", err, out)
	}
}

// TestNewerFormatRefused: a checkpoint of a format this stasis does not
// know yet is refused in one line naming both formats, with its own exit
// code, and nothing is listed.
func TestNewerFormatRefused(t *testing.T) {
	in, err := os.Open("testdata/format1/files.tar")
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	var out bytes.Buffer
	tr, tw := tar.NewReader(in), tar.NewWriter(&out)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(hdr.Name, "/manifest") {
			// A format 2 manifest: the header's version and the body's.
			_, body, _ := bytes.Cut(b, []byte("\n"))
			body = bytes.Replace(body, []byte(`"format": 1`), []byte(`"format": 2`), 1)
			sum := sha256.Sum256(body)
			b = append([]byte("stasis-manifest 2 sha256="+hex.EncodeToString(sum[:])+"\n"), body...)
			hdr.Size = int64(len(b))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	stream := filepath.Join(t.TempDir(), "format2.tar")
	if err := os.WriteFile(stream, out.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(t.TempDir(), "store")
	expectCode(t, run(t, home, "import", stream), cli.ExitNewer, `the manifest is of format 2, this stasis reads format 1 and older: use a newer stasis`)
	if r := mustRun(t, home, "ls", "--json"); strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("listed: %s", r.stdout)
	}
}
