package doctor

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/stasis-ckpt/stasis/criu"
)

// Time limits for running criu; variables so tests can shorten them.
var (
	criuVersionTimeout = 5 * time.Second
	criuCheckTimeout   = 15 * time.Second
)

const criuInstallHint = "install CRIU >= 4.0 (`make` builds one into bin/ when the distro's is too old)"

var (
	criuVersionPattern = regexp.MustCompile(`Version:\s*(\d+)\.(\d+)(?:\.(\d+))?`)
	// "Error (criu/util.c:642): exited, status=1"
	childExitPattern = regexp.MustCompile(`\): exited, status=\d+$`)
)

// checkCRIU reports the criu binary and, when one is found, `criu check`.
func checkCRIU(ctx context.Context, o Options) []Check {
	path, err := findCRIU(o.CRIUPath)
	if err != nil {
		return []Check{{Name: "criu", Status: Missing, Detail: err.Error(), Hint: criuInstallHint}}
	}
	return []Check{criuVersionCheck(ctx, path), criuKernelCheck(ctx, path), memoryCopyCheck()}
}

// memoryCopyCheck reports how much of a process tree's memory a
// checkpoint copies itself (--dump-pages auto or copy) before CRIU's page
// pipes would run out of descriptors and CRIU writes it instead.
func memoryCopyCheck() Check {
	c := Check{Name: "memory copy", Status: OK}
	mem, pipe, files := criu.LazyPagesCapacity()
	if mem == math.MaxInt64 {
		c.Detail = "checkpoints copy a process tree's memory themselves at any size (no open-file limit)"
		return c
	}
	c.Detail = fmt.Sprintf("checkpoints copy up to %s of a process tree's memory themselves (CRIU's page pipes of %d KiB, %d descriptors); CRIU writes a larger tree's", formatGiB(uint64(mem)), pipe>>10, files)
	if mem < 64<<30 {
		c.Hint = "a higher hard open-file limit (`ulimit -Hn`), or CAP_SYS_RESOURCE, lets stasis copy more"
	}
	return c
}

func findCRIU(configured string) (string, error) {
	if configured == "" {
		path, err := exec.LookPath("criu")
		if err != nil {
			return "", errors.New("criu not found in PATH")
		}
		return path, nil
	}
	path, err := exec.LookPath(configured)
	if err != nil {
		return "", fmt.Errorf("criu not found at %s", configured)
	}
	return path, nil
}

func criuVersionCheck(ctx context.Context, path string) Check {
	c := Check{Name: "criu"}
	out, err := runCommand(ctx, criuVersionTimeout, path, "--version")
	m := criuVersionPattern.FindStringSubmatch(out)
	if m == nil {
		c.Status = Warn
		c.Detail = fmt.Sprintf("%s: could not read a version from `criu --version`", path)
		if err != nil {
			c.Detail += ": " + err.Error()
		}
		if line := firstLine(out); line != "" {
			c.Detail += fmt.Sprintf(" (output: %q)", line)
		}
		c.Hint = criuInstallHint
		return c
	}
	version := m[1] + "." + m[2]
	if m[3] != "" {
		version += "." + m[3]
	}
	c.Detail = fmt.Sprintf("%s, version %s", path, version)
	if major, _ := strconv.Atoi(m[1]); major >= 4 {
		c.Status = OK
		return c
	}
	c.Status = Warn
	c.Detail += " (older than 4.0)"
	c.Hint = `CRIU < 4.0 fails on kernels >= 6.13 with "vdso: Unexpected rt vDSO area bounds"; ` + criuInstallHint
	return c
}

// criuKernelCheck runs `criu check`, which asks the kernel for the features
// CRIU needs. It needs root.
func criuKernelCheck(ctx context.Context, path string) Check {
	c := Check{Name: "criu check"}
	if os.Geteuid() != 0 {
		c.Status = Warn
		c.Detail = "not run: `criu check` needs root"
		c.Hint = "run `sudo stasis doctor` to check the kernel features CRIU needs"
		return c
	}
	out, err := runCommand(ctx, criuCheckTimeout, path, "check")
	switch {
	case strings.Contains(out, "Looks good."):
		c.Status = OK
		c.Detail = "Looks good."
		return c
	case strings.Contains(out, "Looks good"):
		// "Looks good but some kernel features are missing ..."
		c.Detail = lineContaining(out, "Looks good")
	default:
		c.Detail = firstErrorLine(out)
		if c.Detail == "" {
			c.Detail = lastLine(out)
		}
	}
	if err != nil {
		if c.Detail != "" {
			c.Detail += " "
		}
		c.Detail += "(" + err.Error() + ")"
	}
	c.Status = Warn
	c.Hint = "run `criu check` to see everything CRIU says about this kernel"
	if strings.Contains(c.Detail, "vDSO") {
		c.Hint = criuInstallHint
	}
	return c
}

// firstErrorLine returns CRIU's first "Error" line, passing over reports
// that a helper process exited, which precede the actual cause.
func firstErrorLine(out string) string {
	first := ""
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if !strings.Contains(line, "Error") {
			continue
		}
		if !childExitPattern.MatchString(line) {
			return line
		}
		if first == "" {
			first = line
		}
	}
	return first
}

func firstLine(s string) string {
	for _, line := range strings.Split(s, "\n") {
		if line = strings.TrimSpace(line); line != "" {
			return line
		}
	}
	return ""
}

func lastLine(s string) string {
	lines := strings.Split(s, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if line := strings.TrimSpace(lines[i]); line != "" {
			return line
		}
	}
	return ""
}

func lineContaining(s, substr string) string {
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, substr) {
			return strings.TrimSpace(line)
		}
	}
	return ""
}
