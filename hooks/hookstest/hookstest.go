// Package hookstest holds what the tests of hooks and of the command line
// share about hook scripts: the scripts of hooks/testdata and what they
// record.
package hookstest

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Script is the absolute path of hooks/testdata/name: hook_env.sh records
// the STASIS_ variables it gets in $HOOK_OUT/$STASIS_HOOK.env, hook_fail.sh
// exits 3 with two lines on stderr, hook_hang.sh never ends.
func Script(t *testing.T, name string) string {
	t.Helper()
	_, here, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller information")
	}
	return filepath.Join(filepath.Dir(here), "..", "testdata", name)
}

// ReadEnv reads the variables hook_env.sh recorded in path.
func ReadEnv(t *testing.T, path string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		k, v, _ := strings.Cut(line, "=")
		env[k] = v
	}
	return env
}
