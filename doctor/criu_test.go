package doctor

import (
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stasis-ckpt/stasis/criu"
)

// fakeCRIU writes an executable shell script named criu that answers
// `--version` and `check` with the given shell snippets.
func fakeCRIU(t *testing.T, version, check string) string {
	t.Helper()
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh to run the fake criu script")
	}
	path := filepath.Join(t.TempDir(), "criu")
	script := "#!/bin/sh\ncase \"$1\" in\n--version) " + version + " ;;\ncheck) " + check + " ;;\n*) exit 2 ;;\nesac\n"
	writeFile(t, path, script, 0o755)
	return path
}

func TestCRIUOld(t *testing.T) {
	o := hermeticOptions(t)
	o.CRIUPath = fakeCRIU(t, `echo "Version: 3.17.1"`, `echo "Looks good."`)
	c := mustCheck(t, runChecks(t, o), "criu")
	wantStatus(t, c, Warn)
	wantDetail(t, c, o.CRIUPath, "3.17.1")
	if !strings.Contains(c.Hint, "vDSO") || !strings.Contains(c.Hint, "6.13") {
		t.Errorf("hint %q does not name the vDSO failure on kernels >= 6.13", c.Hint)
	}
}

func TestCRIUCurrentFoundInPath(t *testing.T) {
	o := hermeticOptions(t)
	path := fakeCRIU(t, `printf 'Version: 4.1.1\nGitID: v4.1.1\n'`, `echo "Looks good."`)
	t.Setenv("PATH", filepath.Dir(path))
	o.CRIUPath = ""
	checks := runChecks(t, o)

	c := mustCheck(t, checks, "criu")
	wantStatus(t, c, OK)
	wantDetail(t, c, path, "version 4.1.1")

	copyCheck := mustCheck(t, checks, "memory copy")
	wantStatus(t, copyCheck, OK)
	if mem, _, _ := criu.LazyPagesCapacity(); mem != math.MaxInt64 {
		wantDetail(t, copyCheck, formatGiB(uint64(mem)), "descriptors")
	}

	check := mustCheck(t, checks, "criu check")
	if os.Geteuid() != 0 {
		wantStatus(t, check, Warn)
		wantDetail(t, check, "needs root")
		return
	}
	wantStatus(t, check, OK)
}

func TestCRIUAbsent(t *testing.T) {
	o := hermeticOptions(t)
	checks := runChecks(t, o)
	c := mustCheck(t, checks, "criu")
	wantStatus(t, c, Missing)
	wantDetail(t, c, o.CRIUPath)
	if !strings.Contains(c.Hint, "CRIU >= 4.0") {
		t.Errorf("hint %q", c.Hint)
	}
	if _, ok := checks["criu check"]; ok {
		t.Error("criu check ran without criu")
	}

	t.Setenv("PATH", t.TempDir())
	o.CRIUPath = ""
	c = mustCheck(t, runChecks(t, o), "criu")
	wantStatus(t, c, Missing)
	wantDetail(t, c, "not found in PATH")
}

func TestCRIUUnreadableVersion(t *testing.T) {
	o := hermeticOptions(t)
	o.CRIUPath = fakeCRIU(t, `echo "criu: something odd" >&2; exit 1`, `echo "Looks good."`)
	c := mustCheck(t, runChecks(t, o), "criu")
	wantStatus(t, c, Warn)
	wantDetail(t, c, "could not read a version", "something odd")
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("criu check only runs as root")
	}
}

func TestCRIUCheckFails(t *testing.T) {
	requireRoot(t)
	o := hermeticOptions(t)
	o.CRIUPath = fakeCRIU(t, `echo "Version: 4.1.1"`,
		`echo "Warn  (criu/cr-check.c:1342): pidfd_open is not supported"; `+
			`echo "Error (criu/cr-check.c:1228): UFFD is not supported"; echo "Does not look good." >&2; exit 1`)
	c := mustCheck(t, runChecks(t, o), "criu check")
	wantStatus(t, c, Warn)
	wantDetail(t, c, "Error (criu/cr-check.c:1228): UFFD is not supported", "exit status 1")
}

// CRIU 3.17 on kernels >= 6.13 first reports a helper's exit, then the cause.
func TestCRIUCheckVDSOFailure(t *testing.T) {
	requireRoot(t)
	o := hermeticOptions(t)
	o.CRIUPath = fakeCRIU(t, `echo "Version: 3.17.1"`,
		`echo "Error (criu/util.c:642): exited, status=1" >&2; `+
			`echo "Error (criu/vdso.c:381): vdso: Unexpected rt vDSO area bounds" >&2; `+
			`echo "Error (criu/crtools.c:260): Could not initialize kernel features detection." >&2; exit 1`)
	c := mustCheck(t, runChecks(t, o), "criu check")
	wantStatus(t, c, Warn)
	wantDetail(t, c, "Error (criu/vdso.c:381): vdso: Unexpected rt vDSO area bounds")
	if c.Hint != criuInstallHint {
		t.Errorf("hint %q, want %q", c.Hint, criuInstallHint)
	}
}

func TestCRIUCheckWithoutErrorLineReportsLastLine(t *testing.T) {
	requireRoot(t)
	o := hermeticOptions(t)
	o.CRIUPath = fakeCRIU(t, `echo "Version: 4.1.1"`, `echo "first"; echo "Does not look good."; echo; exit 1`)
	c := mustCheck(t, runChecks(t, o), "criu check")
	wantStatus(t, c, Warn)
	wantDetail(t, c, "Does not look good.")
}

func TestCRIUCheckTimesOut(t *testing.T) {
	requireRoot(t)
	saved := criuCheckTimeout
	criuCheckTimeout = 200 * time.Millisecond
	t.Cleanup(func() { criuCheckTimeout = saved })

	o := hermeticOptions(t)
	o.CRIUPath = fakeCRIU(t, `echo "Version: 4.1.1"`, `exec sleep 30`)
	start := time.Now()
	c := mustCheck(t, runChecks(t, o), "criu check")
	wantStatus(t, c, Warn)
	wantDetail(t, c, "timed out after 200ms")
	if elapsed := time.Since(start); elapsed > 10*time.Second {
		t.Errorf("took %s despite the time limit", elapsed)
	}
}

// TestRealCRIU runs against whatever criu is installed.
func TestRealCRIU(t *testing.T) {
	path, err := exec.LookPath("criu")
	if err != nil {
		t.Skip("no criu in PATH; install CRIU to run this test")
	}
	o := hermeticOptions(t)
	o.CRIUPath = path
	checks := runChecks(t, o)
	c := mustCheck(t, checks, "criu")
	if c.Status == Missing {
		t.Fatalf("criu at %s reported missing: %+v", path, c)
	}
	wantDetail(t, c, path, "version ")
	copyCheck := mustCheck(t, checks, "memory copy")
	wantStatus(t, copyCheck, OK)
	if mem, _, _ := criu.LazyPagesCapacity(); mem != math.MaxInt64 {
		wantDetail(t, copyCheck, formatGiB(uint64(mem)), "descriptors")
	}

	check := mustCheck(t, checks, "criu check")
	if check.Status == Missing || check.Detail == "" {
		t.Errorf("criu check: %+v", check)
	}
	t.Logf("criu: %s %s; criu check: %s %s", c.Status, c.Detail, check.Status, check.Detail)
}
