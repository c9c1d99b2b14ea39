package doctor

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// withCuFile installs a libcufile.so.0 into o's library dir.
func withCuFile(t *testing.T, o Options) {
	t.Helper()
	buildSharedLib(t, filepath.Join(o.LibDirs[0], "libcufile.so.0"), cFunctions("cuFileDriverOpen", "cuFileRead", "cuFileWrite"))
}

func TestLibcufileAbsent(t *testing.T) {
	checks := runChecks(t, hermeticOptions(t))
	c := mustCheck(t, checks, "libcufile")
	wantStatus(t, c, Missing)
	if c.Hint != "stasis falls back to its own pinned-memory O_DIRECT path" {
		t.Errorf("hint %q", c.Hint)
	}
	if _, ok := checks["gds"]; ok {
		t.Error("gds checked without libcufile")
	}
}

func TestGDSWithNvidiaFSInSysfs(t *testing.T) {
	o := hermeticOptions(t)
	withCuFile(t, o)
	mkdir(t, o.SysRoot, "module", "nvidia_fs")
	checks := runChecks(t, o)
	lib := mustCheck(t, checks, "libcufile")
	wantStatus(t, lib, OK)
	wantDetail(t, lib, filepath.Join(o.LibDirs[0], "libcufile.so.0"))
	c := mustCheck(t, checks, "gds")
	wantStatus(t, c, OK)
	wantDetail(t, c, "GPUDirect Storage (nvidia-fs loaded)")
}

func TestGDSWithNvidiaFSInProcModules(t *testing.T) {
	o := hermeticOptions(t)
	withCuFile(t, o)
	writeFile(t, filepath.Join(o.ProcRoot, "modules"),
		"nvidia_uvm 1966080 0 - Live 0x0000000000000000 (POE)\nnvidia_fs 262144 0 - Live 0x0000000000000000 (OE)\n", 0o444)
	wantStatus(t, mustCheck(t, runChecks(t, o), "gds"), OK)
}

func TestGDSForcedCompatMode(t *testing.T) {
	o := hermeticOptions(t)
	withCuFile(t, o)
	mkdir(t, o.SysRoot, "module", "nvidia_fs")
	t.Setenv("CUFILE_FORCE_COMPAT_MODE", "true")
	c := mustCheck(t, runChecks(t, o), "gds")
	wantStatus(t, c, Warn)
	wantDetail(t, c, "CUFILE_FORCE_COMPAT_MODE=true")
}

func TestGDSWithoutNvidiaFS(t *testing.T) {
	tests := []struct {
		name   string
		config string // testdata file, "" = none
		detail string
		hint   string
	}{
		{"compat allowed", "testdata/cufile_compat_true.json", "compat mode: cuFile moves data through host memory", "modprobe nvidia-fs"},
		{"compat refused", "testdata/cufile_compat_false.json", "allow_compat_mode is false", ownPathHint},
		{"key not set", "testdata/cufile_compat_unset.json", "does not set allow_compat_mode, which defaults to true", "modprobe nvidia-fs"},
		{"broken config", "testdata/cufile_broken.json", "cannot read allow_compat_mode", ownPathHint},
		{"no config", "", "compat mode: cuFile moves data through host memory", "modprobe nvidia-fs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := hermeticOptions(t)
			withCuFile(t, o)
			if tt.config != "" {
				o.CuFileConfig = tt.config
			}
			c := mustCheck(t, runChecks(t, o), "gds")
			wantStatus(t, c, Warn)
			wantDetail(t, c, tt.detail, o.CuFileConfig)
			if !strings.Contains(c.Hint, tt.hint) {
				t.Errorf("hint %q lacks %q", c.Hint, tt.hint)
			}
		})
	}
}

func TestCuFileConfigFromEnvironment(t *testing.T) {
	o := hermeticOptions(t)
	withCuFile(t, o)
	o.CuFileConfig = ""
	t.Setenv("CUFILE_ENV_PATH_JSON", "testdata/cufile_compat_false.json")
	c := mustCheck(t, runChecks(t, o), "gds")
	wantDetail(t, c, "allow_compat_mode is false in testdata/cufile_compat_false.json")
}

func TestStripJSONComments(t *testing.T) {
	in := `{
	// a comment with "quotes" and /* nested */ markers
	"url": "http://example.com/a//b", /* block
	comment */ "glob": "/mnt/*/data",
	"escaped": "a \" // not a comment"
}`
	var got map[string]string
	if err := json.Unmarshal(stripJSONComments([]byte(in)), &got); err != nil {
		t.Fatalf("%v\n%s", err, stripJSONComments([]byte(in)))
	}
	want := map[string]string{"url": "http://example.com/a//b", "glob": "/mnt/*/data", "escaped": `a " // not a comment`}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if n := strings.Count(string(stripJSONComments([]byte(in))), "\n"); n != strings.Count(in, "\n") {
		t.Errorf("line count changed: %d, want %d", n, strings.Count(in, "\n"))
	}
}

func TestTestdataConfigsAreCommented(t *testing.T) {
	// The fixtures must exercise comment stripping: plain JSON would not.
	for _, name := range []string{"cufile_compat_true.json", "cufile_compat_false.json"} {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		if json.Valid(data) || !strings.Contains(string(data), "//") {
			t.Errorf("%s should carry // comments", name)
		}
	}
}

func TestTensorIOPath(t *testing.T) {
	o := hermeticOptions(t)
	t.Setenv("STASIS_IO", "")
	c := mustCheck(t, runChecks(t, o), "tensor io path")
	wantStatus(t, c, OK)
	wantDetail(t, c, "auto takes pinned: a stand-in's reason")

	t.Setenv("STASIS_IO", "cufile")
	wantDetail(t, mustCheck(t, runChecks(t, o), "tensor io path"), "STASIS_IO=cufile chooses cufile; auto takes pinned")

	t.Setenv("STASIS_IO", "gds")
	c = mustCheck(t, runChecks(t, o), "tensor io path")
	wantStatus(t, c, Warn)
	if !strings.Contains(c.Hint, `$STASIS_IO "gds": use auto, cufile or pinned`) {
		t.Errorf("hint %q", c.Hint)
	}
}
