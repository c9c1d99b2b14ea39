package checkpoint

import "testing"

func TestDumpPages(t *testing.T) {
	for _, c := range []struct {
		flag          string
		cpu, cudaTree bool // whether stasis copies the memory
	}{
		{"auto", true, false},
		{"copy", true, true},
		{"criu", false, false},
	} {
		d, err := ParseDumpPages(c.flag)
		if err != nil {
			t.Fatalf("%s: %v", c.flag, err)
		}
		if d.copies(false) != c.cpu || d.copies(true) != c.cudaTree {
			t.Errorf("%s: copies a CPU tree %v, a CUDA tree %v; want %v, %v", c.flag, d.copies(false), d.copies(true), c.cpu, c.cudaTree)
		}
	}
	if (Options{}).DumpPages != DumpPagesAuto {
		t.Error("the zero Options are not DumpPagesAuto")
	}
	if _, err := ParseDumpPages("lazy"); err == nil {
		t.Error(`ParseDumpPages("lazy") did not fail`)
	}
}
