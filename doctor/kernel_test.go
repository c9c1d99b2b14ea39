package doctor

import (
	"bytes"
	"compress/gzip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func writeGzip(t *testing.T, path, content string) {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	zw.Write([]byte(content))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, b.String(), 0o644)
}

func TestKernelReportsUnameRelease(t *testing.T) {
	out, err := exec.Command("uname", "-r").Output()
	if err != nil {
		t.Skipf("uname -r: %v", err)
	}
	c := mustCheck(t, runChecks(t, hermeticOptions(t)), "kernel")
	wantStatus(t, c, OK)
	if release := strings.TrimSpace(string(out)); !strings.HasPrefix(c.Detail, release+" ") {
		t.Errorf("detail %q does not start with the release %q", c.Detail, release)
	}
}

func TestKernelSoftDirty(t *testing.T) {
	tests := []struct {
		name   string
		config string // content of ProcRoot/config.gz; "" = no file
		refs   bool   // create ProcRoot/self/clear_refs
		want   string
	}{
		{"config enabled", "CONFIG_X=y\nCONFIG_MEM_SOFT_DIRTY=y\n", false, "soft-dirty: yes (CONFIG_MEM_SOFT_DIRTY=y in "},
		{"config disabled", "CONFIG_HAVE_ARCH_SOFT_DIRTY=y\n# CONFIG_MEM_SOFT_DIRTY is not set\n", true, "soft-dirty: no (CONFIG_MEM_SOFT_DIRTY not set in "},
		{"no config, clear_refs", "", true, "soft-dirty: unknown (kernel config not readable; /proc/self/clear_refs exists)"},
		{"nothing", "", false, "soft-dirty: unknown (kernel config not readable)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := hermeticOptions(t)
			if tt.config != "" {
				writeGzip(t, filepath.Join(o.ProcRoot, "config.gz"), tt.config)
			}
			if tt.refs {
				writeFile(t, filepath.Join(o.ProcRoot, "self", "clear_refs"), "", 0o200)
			}
			c := mustCheck(t, runChecks(t, o), "kernel")
			wantStatus(t, c, OK)
			wantDetail(t, c, tt.want)
		})
	}
}

// The page map probe must agree with the running kernel's own config.
func TestPagemapAgreesWithKernelConfig(t *testing.T) {
	var uts string
	if out, err := exec.Command("uname", "-r").Output(); err == nil {
		uts = strings.TrimSpace(string(out))
	}
	for _, path := range []string{"/proc/config.gz", "/boot/config-" + uts} {
		value, err := kernelConfigValue(path, "CONFIG_MEM_SOFT_DIRTY")
		if err != nil {
			continue
		}
		if got, want := pagemapShowsSoftDirty(), value == "y"; got != want {
			t.Errorf("pagemap soft-dirty bit %v, but %s has CONFIG_MEM_SOFT_DIRTY=%q", got, path, value)
		}
		return
	}
	t.Skip("this kernel's config is not readable, so there is nothing to compare with")
}

func TestKernelConfigValuePlainFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config-6.1.0")
	writeFile(t, path, "CONFIG_MEM_SOFT_DIRTY=y\n", 0o644)
	if v, err := kernelConfigValue(path, "CONFIG_MEM_SOFT_DIRTY"); err != nil || v != "y" {
		t.Errorf("got %q, %v; want y", v, err)
	}
	if _, err := kernelConfigValue(filepath.Join(t.TempDir(), "absent"), "X"); !os.IsNotExist(err) {
		t.Errorf("absent file: err %v", err)
	}
}
