package doctor

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/stasis-ckpt/stasis/cuda"
	"github.com/stasis-ckpt/stasis/tensors"
)

// Status is the outcome of one check.
type Status string

// Check outcomes, from least to most severe.
const (
	OK      Status = "OK"
	Warn    Status = "WARN"
	Missing Status = "MISSING"
)

// Check is the result of probing one capability.
type Check struct {
	Name   string `json:"name"`
	Status Status `json:"status"`
	Detail string `json:"detail"`         // what was found: versions, paths, sizes
	Hint   string `json:"hint,omitempty"` // what to do about a WARN or MISSING
}

// Options says where to look. The zero value inspects the running machine
// (except StoreDir, which the caller supplies).
type Options struct {
	StoreDir         string   // the store ($STASIS_HOME); may not exist yet
	CRIUPath         string   // "" = look up "criu" in PATH
	LibDirs          []string // searched for shared libraries before the defaults
	NoDefaultLibDirs bool     // search only LibDirs
	ProcRoot         string   // "" = "/proc"
	SysRoot          string   // "" = "/sys"
	CuFileConfig     string   // "" = $CUFILE_ENV_PATH_JSON or /etc/cufile.json
	// AutoChoice, when set, stands in for tensors.AutoChoice (which loads
	// libcuda and libcufile) in tests.
	AutoChoice func() (path, why string, cf *cuda.CuFile)
}

func (o Options) autoChoice() (string, string, *cuda.CuFile) {
	if o.AutoChoice != nil {
		return o.AutoChoice()
	}
	return tensors.AutoChoice()
}

// Run performs every check and returns the results in a stable order:
// kernel, criu, criu check, memory copy, libcuda, cuda checkpoint api,
// cuda checkpoint backend, nvidia driver, libcufile, gds, tensor io path,
// store, store free space, store o_direct, RAM scratch. Checks that depend
// on something absent (criu check, memory copy, cuda checkpoint api and
// backend, gds) are left out when it is absent.
func Run(ctx context.Context, o Options) []Check {
	libs := newLibFinder(ctx, o)
	var checks []Check
	checks = append(checks, checkKernel(o))
	checks = append(checks, checkCRIU(ctx, o)...)
	checks = append(checks, checkCUDA(o, libs)...)
	checks = append(checks, checkCuFile(o, libs)...)
	checks = append(checks, checkStore(o)...)
	return checks
}

// Worst returns the most severe status among checks (MISSING > WARN > OK).
// An empty list is OK.
func Worst(cs []Check) Status {
	worst := OK
	for _, c := range cs {
		if severity(c.Status) > severity(worst) {
			worst = c.Status
		}
	}
	return worst
}

func severity(s Status) int {
	switch s {
	case Missing:
		return 2
	case Warn:
		return 1
	}
	return 0
}

func (o Options) procRoot() string {
	if o.ProcRoot == "" {
		return "/proc"
	}
	return o.ProcRoot
}

// realProc reports whether ProcRoot is the running kernel's /proc, so probes
// of the live system (such as /boot or our own page map) are meaningful.
func (o Options) realProc() bool {
	return o.ProcRoot == "" || filepath.Clean(o.ProcRoot) == "/proc"
}

func (o Options) sysRoot() string {
	if o.SysRoot == "" {
		return "/sys"
	}
	return o.SysRoot
}

func (o Options) cuFileConfig() string {
	if o.CuFileConfig != "" {
		return o.CuFileConfig
	}
	if p := os.Getenv("CUFILE_ENV_PATH_JSON"); p != "" {
		return p
	}
	return "/etc/cufile.json"
}

// runCommand runs a program with a time limit and returns its combined output.
func runCommand(ctx context.Context, timeout time.Duration, path string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	// A killed script may leave children holding the output pipe open.
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() == context.DeadlineExceeded {
		return string(out), fmt.Errorf("timed out after %s", timeout)
	}
	return string(out), err
}
