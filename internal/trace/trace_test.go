package trace

import (
	"os"
	"os/exec"
	"regexp"
	"testing"
)

// TestMain lets the test binary mark and exit when run as the subprocess
// of TestMark.
func TestMain(m *testing.M) {
	if os.Getenv("TRACE_TEST_CHILD") != "" {
		Mark("first")
		Mark("second")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestMark(t *testing.T) {
	run := func(env ...string) string {
		t.Helper()
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), append(env, "TRACE_TEST_CHILD=1")...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		return string(out)
	}
	want := regexp.MustCompile(`^stasis: trace: Go code started at \d{16} \(Unix µs\)\n` +
		`stasis: trace: +\d+\.\d{3} ms first\n` +
		`stasis: trace: +\d+\.\d{3} ms second\n$`)
	if out := run("STASIS_TRACE=1"); !want.MatchString(out) {
		t.Fatalf("with STASIS_TRACE set:\n%s", out)
	}
	if out := run("STASIS_TRACE="); out != "" {
		t.Fatalf("with STASIS_TRACE empty, marks printed:\n%s", out)
	}
}
