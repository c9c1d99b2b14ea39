package cli_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stasis-ckpt/stasis/cli"
)

// These tests run the real stasis binary, as a scheduler or a user would:
// real processes, real signals, real file systems.

var stasisBin string

func TestMain(m *testing.M) {
	if bin := os.Getenv("STASIS_TEST_BINARY"); bin != "" {
		// The tests against another build of stasis (an older one, to
		// see a new test fail there).
		stasisBin = bin
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "stasis-e2e-bin-")
	if err != nil {
		panic(err)
	}
	stasisBin = filepath.Join(dir, "stasis")
	// With the failpoints of internal/failpoint, which tests switch on
	// through $STASIS_FAILPOINTS.
	build := exec.Command("go", "build", "-tags", "stasis_failpoints", "-o", stasisBin, "github.com/stasis-ckpt/stasis/cmd/stasis")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building stasis:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type result struct {
	code           int
	stdout, stderr string
}

// run runs stasis with home as its store.
func run(t *testing.T, home string, args ...string) result {
	t.Helper()
	return runWithHome(t, home, exec.Command(stasisBin, args...))
}

// runWithHome runs cmd with STASIS_HOME=home and STASIS naming the
// binary (for shell scripts), and returns its exit code and output.
func runWithHome(t *testing.T, home string, cmd *exec.Cmd) result {
	t.Helper()
	cmd.Env = append(os.Environ(), "STASIS="+stasisBin, "STASIS_HOME="+home)
	return runCmd(t, cmd)
}

// runCmd runs cmd as it is set up and returns its exit code and output.
func runCmd(t *testing.T, cmd *exec.Cmd) result {
	t.Helper()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run %v: %v", cmd.Args, err)
	}
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

func mustRun(t *testing.T, home string, args ...string) result {
	t.Helper()
	r := run(t, home, args...)
	if r.code != 0 {
		t.Fatalf("stasis %v: exit %d: %s", args, r.code, r.stderr)
	}
	return r
}

func expectCode(t *testing.T, r result, want int, stderrPattern string) {
	t.Helper()
	if r.code != want {
		t.Fatalf("exit code %d, want %d; stderr: %s", r.code, want, r.stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "stasis: ") {
		t.Fatalf("want a one-line error, got %q", r.stderr)
	}
	if !regexp.MustCompile(stderrPattern).MatchString(r.stderr) {
		t.Fatalf("stderr %q does not match %q", r.stderr, stderrPattern)
	}
}

var uuidLine = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// save saves paths and returns the ID, checking that it is the last line of
// stdout.
func save(t *testing.T, home, job string, step int, args ...string) string {
	t.Helper()
	r := mustRun(t, home, append([]string{"save", "--job", job, "--step", fmt.Sprint(step)}, args...)...)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	id := lines[len(lines)-1]
	if !uuidLine.MatchString(id) {
		t.Fatalf("last line of save's output is %q, not an ID", id)
	}
	return id
}

type record struct {
	ID          string `json:"id"`
	Job         string `json:"job"`
	Step        int64  `json:"step"`
	Kind        string `json:"kind"`
	Status      string `json:"status"`
	Bytes       int64  `json:"bytes"`
	StoredBytes int64  `json:"stored_bytes"`
}

func list(t *testing.T, home string, args ...string) []record {
	t.Helper()
	r := mustRun(t, home, append([]string{"ls", "--json"}, args...)...)
	var recs []record
	if err := json.Unmarshal([]byte(r.stdout), &recs); err != nil {
		t.Fatalf("ls --json: %v: %s", err, r.stdout)
	}
	return recs
}

// writeTree makes a small tree of files with random content and returns its
// root.
func writeTree(t *testing.T, dir string, files int, size int) string {
	t.Helper()
	root := filepath.Join(dir, "tree")
	rng := rand.New(rand.NewPCG(uint64(files), uint64(size)))
	for i := 0; i < files; i++ {
		p := filepath.Join(root, fmt.Sprintf("d%d", i%3), fmt.Sprintf("f%d.bin", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, size+i)
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func sameTree(t *testing.T, a, b string) {
	t.Helper()
	out, err := exec.Command("diff", "-r", "--no-dereference", a, b).CombinedOutput()
	if err != nil {
		t.Fatalf("trees differ: %v\n%s", err, out)
	}
}

func entriesIn(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func TestSaveLoadShowAndJSON(t *testing.T) {
	home, tmp := t.TempDir(), t.TempDir()
	tree := writeTree(t, tmp, 7, 300_000)
	id := save(t, home, "train", 100, "--compress", "zstd", "--tag", "run=a", tree)

	var show map[string]any
	r := mustRun(t, home, "show", "--json", id[:8])
	if err := json.Unmarshal([]byte(r.stdout), &show); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"id", "job", "step", "kind", "status", "bytes", "stored_bytes"} {
		if _, ok := show[key]; !ok {
			t.Errorf("show --json lacks %q", key)
		}
	}
	if show["id"] != id || show["job"] != "train" || show["step"] != float64(100) || show["kind"] != "files" || show["status"] != "complete" {
		t.Errorf("show --json: %v", show)
	}

	out := filepath.Join(tmp, "out")
	mustRun(t, home, "load", id, "--to", out)
	sameTree(t, tree, filepath.Join(out, "tree"))

	mustRun(t, home, "verify", "--job", "train", "--latest")
	recs := list(t, home, "--job", "train")
	if len(recs) != 1 || recs[0].ID != id || recs[0].Bytes != 7*300_000+21 {
		t.Fatalf("ls: %+v", recs)
	}
}

func TestExitCodes(t *testing.T) {
	home, tmp := t.TempDir(), t.TempDir()
	file := filepath.Join(tmp, "f")
	os.WriteFile(file, []byte("data"), 0o644)

	expectCode(t, run(t, home, "show", "0123"), cli.ExitNotFound, `no checkpoint ID starts with "0123"`)
	expectCode(t, run(t, home, "load", "--job", "nojob", "--latest", "--to", filepath.Join(tmp, "o")), cli.ExitNotFound, `job "nojob" has no complete checkpoint`)
	expectCode(t, run(t, home, "save", "--job", "j", "--step", "1", filepath.Join(tmp, "missing")), cli.ExitNotFound, `missing: no such file or directory`)
	expectCode(t, run(t, home, "save", "--job", "j", file), cli.ExitUsage, `Required flag "step"`)
	expectCode(t, run(t, home, "save", "--job", "j", "--step", "1", "--compress", "lz4", file), cli.ExitUsage, `unknown compression method "lz4"`)
	expectCode(t, run(t, home, "save", "--job", " bad", "--step", "1", file), cli.ExitUsage, `job name`)
	expectCode(t, run(t, home, "frobnicate"), cli.ExitUsage, `no command "frobnicate"`)
	expectCode(t, run(t, home, "ls", "--bogus"), cli.ExitUsage, `flag provided but not defined`)
	expectCode(t, run(t, home, "prune", "--job", "j", "--keep-last", "-1"), cli.ExitUsage, `keep-last`)
	fifo := filepath.Join(tmp, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	expectCode(t, run(t, home, "save", "--job", "j", "--step", "1", fifo), cli.ExitUsage, `named pipe cannot be saved`)

	// Seventeen IDs: two of them share a first hex digit.
	seen := map[byte]string{}
	var shared string
	for i := 0; shared == "" && i < 17; i++ {
		id := save(t, home, "j", i, file)
		if _, dup := seen[id[0]]; dup {
			shared = id[:1]
		}
		seen[id[0]] = id
	}
	expectCode(t, run(t, home, "show", shared), cli.ExitAmbiguous, `matches 2 checkpoints`)

	target := filepath.Join(tmp, "nonempty")
	os.MkdirAll(target, 0o755)
	os.WriteFile(filepath.Join(target, "keep"), []byte("mine"), 0o644)
	expectCode(t, run(t, home, "load", "--job", "j", "--latest", "--to", target), cli.ExitUsage, `not empty`)
	if got, _ := os.ReadFile(filepath.Join(target, "keep")); string(got) != "mine" {
		t.Fatal("a refused load touched the target")
	}
	if len(list(t, home)) != len(seen)+1 && len(list(t, home)) != len(seen) {
		t.Fatalf("ls lists %d checkpoints", len(list(t, home)))
	}
}

func TestPruneRmAndGC(t *testing.T) {
	home, tmp := t.TempDir(), t.TempDir()
	file := filepath.Join(tmp, "f")
	os.WriteFile(file, []byte("x"), 0o644)
	ids := map[int]string{}
	for _, step := range []int{30, 10, 50, 20, 40} {
		ids[step] = save(t, home, "p", step, file)
	}
	other := save(t, home, "q", 1, file)
	mustRun(t, home, "prune", "--job", "p", "--keep-last", "2")
	recs := list(t, home, "--job", "p")
	if len(recs) != 2 || recs[0].Step != 40 || recs[1].Step != 50 {
		t.Fatalf("after prune: %+v", recs)
	}
	mustRun(t, home, "rm", ids[40])
	if recs := list(t, home); len(recs) != 2 || recs[0].ID != ids[50] || recs[1].ID != other {
		t.Fatalf("after rm: %+v", recs)
	}
	expectCode(t, run(t, home, "rm", ids[40]), cli.ExitNotFound, `no checkpoint ID`)
	for _, step := range []int{10, 20, 30, 40} {
		if _, err := os.Stat(filepath.Join(home, "checkpoints", ids[step])); !os.IsNotExist(err) {
			t.Errorf("checkpoint of step %d still on disk", step)
		}
	}
	r := mustRun(t, home, "gc", "--json")
	var rep map[string]any
	json.Unmarshal([]byte(r.stdout), &rep)
	if rep["staging_removed"] != nil || rep["lost"] != nil {
		t.Fatalf("gc on a clean store did something: %s", r.stdout)
	}
}

// TestCorruptionIsNamed flips one byte at several places of every stored
// file and expects verify and load to fail with the file (and for data, the
// chunk) named, and to succeed again once the byte is restored.
func TestCorruptionIsNamed(t *testing.T) {
	home, tmp := t.TempDir(), t.TempDir()
	tree := writeTree(t, tmp, 3, 3<<20) // about 9 MiB: three 4 MiB chunks
	id := save(t, home, "c", 1, "--compress", "auto", tree)
	dir := filepath.Join(home, "checkpoints", id)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, name := range entriesIn(t, dir) {
		path := filepath.Join(dir, name)
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		offsets := []int{0, len(data) - 1, rng.IntN(len(data)), rng.IntN(len(data))}
		for _, off := range offsets {
			flipped := bytes.Clone(data)
			flipped[off] ^= 0x10
			os.WriteFile(path, flipped, 0o600)
			pattern := regexp.QuoteMeta(name)
			if name != "manifest" {
				pattern += `: chunk \d+ at offset \d+`
			}
			expectCode(t, run(t, home, "verify", id), cli.ExitCorrupt, pattern)
			out := filepath.Join(tmp, fmt.Sprintf("out-%s-%d", name, off))
			expectCode(t, run(t, home, "load", id, "--to", out), cli.ExitCorrupt, pattern)
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Fatalf("failed load left %s", out)
			}
			if leftovers, _ := filepath.Glob(filepath.Join(tmp, ".out-*")); len(leftovers) > 0 {
				t.Fatalf("failed load left %v", leftovers)
			}
			os.WriteFile(path, data, 0o600)
		}
	}
	mustRun(t, home, "verify", id)
}

func TestCatalogBusy(t *testing.T) {
	home, tmp := t.TempDir(), t.TempDir()
	file := filepath.Join(tmp, "f")
	os.WriteFile(file, []byte("x"), 0o644)
	id := save(t, home, "b", 1, file)
	// bbolt takes an flock on the catalog file; so does flock(1).
	holder := exec.Command("flock", filepath.Join(home, "catalog.db"), "sleep", "30")
	holder.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := holder.Start(); err != nil {
		t.Skipf("flock(1) unavailable: %v", err)
	}
	killHolder := func() { syscall.Kill(-holder.Process.Pid, syscall.SIGKILL) }
	defer killHolder()
	time.Sleep(200 * time.Millisecond)
	expectCode(t, run(t, home, "--lock-timeout", "300ms", "save", "--job", "b", "--step", "2", file), cli.ExitBusy, `catalog is locked by another process`)
	expectCode(t, run(t, home, "--lock-timeout", "300ms", "rm", id), cli.ExitBusy, `locked`)
	killHolder()
	holder.Wait()
	if recs := list(t, home); len(recs) != 1 || recs[0].ID != id {
		t.Fatalf("after a busy save: %+v", recs)
	}
	if staged := entriesIn(t, filepath.Join(home, "staging")); len(staged) != 0 {
		t.Fatalf("a busy save left %v in staging", staged)
	}
	mustRun(t, home, "verify", id)
}

// TestDiskFull saves into a store on a small file system: the save fails
// with the no-space exit code, the partial checkpoint is removed and the
// older checkpoint still verifies. Both a tmpfs (no O_DIRECT) and an ext4 on
// a loop device (O_DIRECT) are tried.
func TestDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a small file system needs root")
	}
	tmp := t.TempDir()
	small := writeTree(t, filepath.Join(tmp, "small"), 1, 100_000)
	big := writeTree(t, filepath.Join(tmp, "big"), 3, 5<<20)
	for _, fs := range []string{"tmpfs", "ext4"} {
		t.Run(fs, func(t *testing.T) {
			mnt := filepath.Join(tmp, "mnt-"+fs)
			os.MkdirAll(mnt, 0o700)
			switch fs {
			case "tmpfs":
				if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", mnt).CombinedOutput(); err != nil {
					t.Skipf("cannot mount tmpfs: %v %s", err, out)
				}
			case "ext4":
				img := filepath.Join(tmp, "fs.img")
				if out, err := exec.Command("truncate", "-s", "12M", img).CombinedOutput(); err != nil {
					t.Fatalf("%v %s", err, out)
				}
				if out, err := exec.Command("mkfs.ext4", "-q", "-F", img).CombinedOutput(); err != nil {
					t.Skipf("mkfs.ext4 unavailable: %v %s", err, out)
				}
				if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
					t.Skipf("cannot mount a loop device: %v %s", err, out)
				}
			}
			defer exec.Command("umount", "-l", mnt).Run()
			home := filepath.Join(mnt, "store")
			old := save(t, home, "full", 1, "--compress", "none", small)
			r := run(t, home, "save", "--job", "full", "--step", "2", "--compress", "none", big)
			expectCode(t, r, cli.ExitNoSpace, `no space left on device`)
			if recs := list(t, home); len(recs) != 1 || recs[0].ID != old {
				t.Fatalf("after a failed save: %+v", recs)
			}
			if staged := entriesIn(t, filepath.Join(home, "staging")); len(staged) != 0 {
				t.Fatalf("the failed save left %v in staging", staged)
			}
			mustRun(t, home, "verify", old)
			out := filepath.Join(tmp, "out-"+fs)
			mustRun(t, home, "load", old, "--to", out)
			sameTree(t, small, filepath.Join(out, "tree"))
		})
	}
}

// TestInterruptCleansUp sends SIGINT during a save: exit 130, nothing listed,
// nothing left in staging.
func TestInterruptCleansUp(t *testing.T) {
	home, tmp := t.TempDir(), t.TempDir()
	tree := writeTree(t, tmp, 4, 40<<20)
	cmd := exec.Command(stasisBin, "save", "--job", "i", "--step", "1", "--compress", "zstd", tree)
	cmd.Env = append(os.Environ(), "STASIS_HOME="+home)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitForStaging(t, home)
	cmd.Process.Signal(os.Interrupt)
	err := cmd.Wait()
	ee, ok := err.(*exec.ExitError)
	if !ok {
		t.Skipf("the save finished before the signal arrived (%v)", err)
	}
	if ee.ExitCode() != cli.ExitInterrupted {
		t.Fatalf("exit %d after SIGINT, want %d: %s", ee.ExitCode(), cli.ExitInterrupted, errb.String())
	}
	if recs := list(t, home); len(recs) != 0 {
		t.Fatalf("an interrupted save is listed: %+v", recs)
	}
	if staged := entriesIn(t, filepath.Join(home, "staging")); len(staged) != 0 {
		t.Fatalf("an interrupted save left %v", staged)
	}
}

func waitForStaging(t *testing.T, home string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if es, err := os.ReadDir(filepath.Join(home, "staging")); err == nil && len(es) > 0 {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatal("the save never started staging")
}

// TestKill9ThenGC kills saves with SIGKILL at random moments, runs gc, and
// checks the invariant: whatever is listed verifies and loads, nothing
// partial is left, and the checkpoint saved first is intact throughout.
func TestKill9ThenGC(t *testing.T) {
	home, tmp := t.TempDir(), t.TempDir()
	tree := writeTree(t, tmp, 5, 6<<20)
	first := save(t, home, "k", 0, tree)

	// How long one save takes here, to spread the kills over it.
	start := time.Now()
	extra := save(t, home, "k", 1, tree)
	full := time.Since(start)
	mustRun(t, home, "rm", extra)

	rng := rand.New(rand.NewPCG(7, 9))
	const rounds = 12
	for i := 0; i < rounds; i++ {
		cmd := exec.Command(stasisBin, "save", "--job", "k", "--step", fmt.Sprint(i+2), "--compress", "auto", tree)
		cmd.Env = append(os.Environ(), "STASIS_HOME="+home)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(rng.Int64N(int64(full) * 11 / 10)))
		cmd.Process.Kill()
		cmd.Wait()
	}
	mustRun(t, home, "gc")
	if staged := entriesIn(t, filepath.Join(home, "staging")); len(staged) != 0 {
		t.Fatalf("gc left %v in staging", staged)
	}
	if trash := entriesIn(t, filepath.Join(home, "trash")); len(trash) != 0 {
		t.Fatalf("gc left %v in trash", trash)
	}
	recs := list(t, home)
	onDisk := entriesIn(t, filepath.Join(home, "checkpoints"))
	if len(recs) != len(onDisk) {
		t.Fatalf("%d listed, %d on disk", len(recs), len(onDisk))
	}
	t.Logf("%d of %d killed saves completed before the kill", len(recs)-1, rounds)
	for _, r := range recs {
		mustRun(t, home, "verify", r.ID)
	}
	out := filepath.Join(tmp, "out")
	mustRun(t, home, "load", first, "--to", out)
	sameTree(t, tree, filepath.Join(out, "tree"))
}

// TestProgressOnTerminal runs save under script(1), which gives it a
// terminal: a progress bar is drawn. Without a terminal (every other test)
// stdout holds only the ID.
func TestProgressOnTerminal(t *testing.T) {
	if _, err := exec.LookPath("script"); err != nil {
		t.Skip("script(1) is not installed")
	}
	home, tmp := t.TempDir(), t.TempDir()
	tree := writeTree(t, tmp, 2, 20<<20)
	cmd := exec.Command("script", "-qec", fmt.Sprintf("%s save --job tty --step 1 %s", stasisBin, tree), "/dev/null")
	cmd.Env = append(os.Environ(), "STASIS_HOME="+home)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !regexp.MustCompile(`save \[=+\] 100% `).Match(out) {
		t.Fatalf("no finished progress bar in %q", out)
	}
}

func jsonDecode(b []byte, v any) error { return json.Unmarshal(b, v) }
