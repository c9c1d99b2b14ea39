package fileset_test

import (
	"testing"

	"golang.org/x/sys/unix"
)

// statBlocks returns the 512-byte blocks a file occupies.
func statBlocks(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks
}
