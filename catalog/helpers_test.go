package catalog

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stasis-ckpt/stasis/gdswriter"
	bolt "go.etcd.io/bbolt"
)

// The test binary doubles as the child process of the crash, busy and gc
// tests: with helperEnv set, TestMain runs that helper instead of the tests.
const (
	helperEnv      = "STASIS_CATALOG_TEST_HELPER"
	helperStoreEnv = "STASIS_CATALOG_TEST_STORE"
	helperIDEnv    = "STASIS_CATALOG_TEST_ID"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		if err := runHelper(mode); err != nil {
			fmt.Fprintf(os.Stderr, "helper %s: %v\n", mode, err)
			os.Exit(3)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func runHelper(mode string) error {
	root := os.Getenv(helperStoreEnv)
	switch mode {
	case "commit":
		s, err := Open(root, Options{})
		if err != nil {
			return err
		}
		rec, err := commitData(s, KindTensors, "crash", 2, testData(200<<10, 2))
		if err != nil {
			return err
		}
		fmt.Println(rec.ID)
		return nil
	case "remove":
		s, err := Open(root, Options{})
		if err != nil {
			return err
		}
		return s.Remove(os.Getenv(helperIDEnv))
	case "begin-hold":
		// A writer that has staged some data and then hangs until killed.
		s, err := Open(root, Options{})
		if err != nil {
			return err
		}
		p, err := s.Begin(KindTensors, "hold", 1, nil)
		if err != nil {
			return err
		}
		if err := os.WriteFile(p.Path("data.0000"), make([]byte, 8192), 0o600); err != nil {
			return err
		}
		fmt.Println(p.ID())
		_, err = io.Copy(io.Discard, os.Stdin)
		return err
	case "scratch-hold", "scratch-hold-ram":
		// A process with a scratch directory (in the store, or in RAM:
		// $STASIS_RAM_SCRATCH), killed before removing it.
		s, err := Open(root, Options{})
		if err != nil {
			return err
		}
		ram := int64(-1)
		if mode == "scratch-hold-ram" {
			ram = 0
		}
		sc, err := s.NewScratch("hold", ram)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(sc.Dir, "img"), make([]byte, 5000), 0o600); err != nil {
			return err
		}
		fmt.Println(sc.Dir)
		_, err = io.Copy(io.Discard, os.Stdin)
		return err
	case "import":
		// An import of the stream on stdin, killed part-way by the test.
		s, err := Open(root, Options{})
		if err != nil {
			return err
		}
		_, err = s.Import(context.Background(), os.Stdin, TransferOptions{})
		return err
	case "hold-db":
		// Another process holding the index open read-write, as a
		// long-running stasis would.
		db, err := bolt.Open(filepath.Join(root, indexName), 0o600, &bolt.Options{Timeout: 10 * time.Second})
		if err != nil {
			return err
		}
		defer db.Close()
		fmt.Println("ready")
		_, err = io.Copy(io.Discard, os.Stdin)
		return err
	}
	return fmt.Errorf("unknown helper mode %q", mode)
}

// helperCmd prepares a child run of this test binary in helper mode.
func helperCmd(mode, root string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, helperStoreEnv+"="+root)
	cmd.Env = append(cmd.Env, env...)
	return cmd
}

// startHelper starts a helper that prints one line when ready and then
// waits; it returns that line. The child is killed at cleanup at the latest.
func startHelper(t *testing.T, mode, root string) (*exec.Cmd, string) {
	t.Helper()
	cmd := helperCmd(mode, root)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("helper %s did not get ready: %v\n%s", mode, err, stderr.String())
	}
	return cmd, strings.TrimSpace(line)
}

// killHelper SIGKILLs a started helper and reaps it.
func killHelper(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	wantKilled(t, cmd.Wait())
}

// wantKilled checks that a child's wait error says it died of SIGKILL.
func wantKilled(t *testing.T, err error) {
	t.Helper()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("child was not killed: %v", err)
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v (stderr %q), want death by SIGKILL", err, ee.Stderr)
	}
}

// mustStore opens a new store in a temporary directory.
func mustStore(t testing.TB) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "store"), Options{LockTimeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

// testData returns n deterministic pseudo-random bytes.
func testData(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 42))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// commitData commits a checkpoint with one data file holding data (64 KiB
// chunks) and one entry covering it.
func commitData(s *Store, kind Kind, job string, step int64, data []byte) (*Record, error) {
	p, err := s.Begin(kind, job, step, map[string]string{"run": "test"})
	if err != nil {
		return nil, err
	}
	w, err := gdswriter.Create(context.Background(), p.Path("data.0000"), gdswriter.WriterOptions{ChunkSize: 64 << 10, Workers: 2})
	if err != nil {
		p.Abort()
		return nil, err
	}
	if _, err := w.Write(data); err != nil {
		w.Abort()
		p.Abort()
		return nil, err
	}
	res, err := w.Close()
	if err != nil {
		p.Abort()
		return nil, err
	}
	p.Manifest.Files = []DataFile{{Name: "data.0000", Size: res.Size, RawSize: res.RawSize, ChunkSize: res.ChunkSize, Chunks: res.Chunks}}
	e := Entry{Path: "blob", Type: EntryFile, Mode: 0o600, Size: int64(len(data))}
	if kind == KindTensors {
		e.Type, e.Mode, e.Attrs = EntryTensor, 0, json.RawMessage(`{"dtype":"uint8","shape":[`+fmt.Sprint(len(data))+`]}`)
	}
	p.Manifest.Entries = []Entry{e}
	return p.Commit()
}

// mustCommit commits a checkpoint of size bytes for job at step.
func mustCommit(t testing.TB, s *Store, job string, step int64, size int) Record {
	t.Helper()
	rec, err := commitData(s, KindTensors, job, step, testData(size, uint64(step)))
	if err != nil {
		t.Fatalf("commit %s@%d: %v", job, step, err)
	}
	return *rec
}

// plantManifest writes a complete checkpoint directory holding only m's
// manifest (a checkpoint with no data files) without touching the index,
// so that tests can choose IDs, steps and creation times.
func plantManifest(t testing.TB, s *Store, m Manifest) {
	t.Helper()
	if m.Format == 0 {
		m.Format = FormatVersion
	}
	if m.Kind == "" {
		m.Kind = KindTensors
	}
	if m.Host == "" {
		m.Host = "testhost"
	}
	data, err := m.Marshal()
	if err != nil {
		t.Fatalf("marshal planted manifest: %v", err)
	}
	dir := s.CheckpointDir(m.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, manifestName), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// mustRebuild rebuilds the index and requires that nothing was damaged.
func mustRebuild(t testing.TB, s *Store) {
	t.Helper()
	rep, err := s.Rebuild()
	if err != nil || len(rep.Damaged) > 0 {
		t.Fatalf("Rebuild: %+v, %v", rep, err)
	}
}

// withHeader puts a correct header line in front of a manifest body.
func withHeader(body []byte) []byte {
	sum := sha256.Sum256(body)
	return append(fmt.Appendf(nil, "%s %d sha256=%x\n", manifestMagic, FormatVersion, sum), body...)
}

// ids returns the IDs of recs in order.
func ids(recs []Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.ID
	}
	return out
}

// dirNames lists the names in dir, sorted.
func dirNames(t testing.TB, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	return names
}

// wantEmpty requires that the store's staging/ and trash/ hold nothing.
func wantEmpty(t testing.TB, s *Store) {
	t.Helper()
	for _, d := range []string{stagingDir, trashDir} {
		if names := dirNames(t, s.path(d)); len(names) > 0 {
			t.Errorf("%s/ is not empty: %v", d, names)
		}
	}
}

// mustList lists the complete checkpoints of every job.
func mustList(t testing.TB, s *Store) []Record {
	t.Helper()
	recs, err := s.List(Filter{})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	return recs
}

// completeOnDisk returns the sorted IDs of the directories under
// checkpoints/ whose manifest reads and checks.
func completeOnDisk(t testing.TB, s *Store) []string {
	t.Helper()
	var out []string
	for _, name := range dirNames(t, s.path(checkpointsDir)) {
		if _, err := s.ReadManifest(name); err == nil {
			out = append(out, name)
		}
	}
	return out
}

// flipByte inverts one byte of a file.
func flipByte(t testing.TB, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// testID returns a lower-case UUID whose first characters are prefix.
func testID(prefix string, n int) string {
	id := fmt.Sprintf("%08x-0000-4000-8000-%012x", 0, n)
	return prefix + id[len(prefix):]
}
