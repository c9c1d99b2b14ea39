package doctor

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/stasis-ckpt/stasis/cuda"
)

// checkpointSymbols are the CUDA driver functions stasis calls to checkpoint
// and restore a process's GPU state.
var checkpointSymbols = cuda.CheckpointAPI

var (
	// "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  ..." or
	// "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  ..."
	driverVersionPattern = regexp.MustCompile(`Kernel Module.*?\s(\d+\.\d+(?:\.\d+)*)(?:\s|$)`)
	// libcuda.so.580.159.04
	libcudaVersionPattern = regexp.MustCompile(`^libcuda\.so\.(\d+\.\d+(?:\.\d+)*)$`)
)

// checkCUDA reports libcuda, its checkpoint API, the backend stasis makes
// the checkpoint calls with, and the kernel driver.
func checkCUDA(o Options, libs *libFinder) []Check {
	lib := libs.find("libcuda.so.1", false)
	var checks []Check
	if lib.path == "" {
		detail := "libcuda.so.1 not found"
		if len(lib.skipped) > 0 {
			detail += " for this architecture (skipped " + strings.Join(lib.skipped, ", ") + ")"
		}
		checks = append(checks, Check{
			Name: "libcuda", Status: Missing, Detail: detail,
			Hint: "no NVIDIA driver: GPU checkpoints are unavailable; CPU processes and files still work",
		})
	} else {
		api, missing, err := checkpointAPICheck(lib)
		checks = append(checks, Check{Name: "libcuda", Status: OK, Detail: lib.describe()}, api)
		if err == nil {
			checks = append(checks, backendCheck(missing))
		}
	}
	return append(checks, driverCheck(o, lib))
}

// checkpointAPICheck reports the functions of the checkpoint API that
// libcuda lacks; err is set when its symbols cannot be read.
func checkpointAPICheck(lib libSearch) (Check, []string, error) {
	c := Check{Name: "cuda checkpoint api"}
	missing, err := missingSymbols(lib.resolved, checkpointSymbols)
	if err != nil {
		c.Status = Warn
		c.Detail = fmt.Sprintf("cannot read the symbol table of %s: %v", lib.resolved, err)
		c.Hint = "reinstall the NVIDIA driver"
		return c, nil, err
	}
	if len(missing) == 0 {
		c.Status = OK
		c.Detail = fmt.Sprintf("all %d cuCheckpointProcess* functions exported by %s", len(checkpointSymbols), lib.resolved)
		return c, nil, nil
	}
	c.Status = Warn
	c.Detail = fmt.Sprintf("%s lacks %s", lib.resolved, strings.Join(missing, ", "))
	c.Hint = "upgrade the NVIDIA driver (the full checkpoint API ships with r570; r550+ checkpoints only through NVIDIA's cuda-checkpoint tool)"
	return c, missing, nil
}

// backendCheck says what stasis makes the process checkpoint calls with,
// and why: libcuda's API, else cuda-checkpoint (found as cuda.Load finds
// it), else nothing.
func backendCheck(missingAPI []string) Check {
	c := Check{Name: "cuda checkpoint backend"}
	if len(missingAPI) == 0 {
		c.Status = OK
		c.Detail = "libcuda's checkpoint API"
		return c
	}
	path, where, err := cuda.FindTool()
	if err != nil {
		c.Status = Missing
		c.Detail = "none: libcuda lacks the checkpoint API, and " + err.Error()
		c.Hint = "upgrade the NVIDIA driver to 570 or later, or install NVIDIA's cuda-checkpoint (github.com/NVIDIA/cuda-checkpoint) on PATH, beside stasis, or where $" + cuda.ToolEnv + " names it"
		return c
	}
	c.Status = OK
	c.Detail = fmt.Sprintf("cuda-checkpoint %s (found through %s), since libcuda lacks the checkpoint API", path, where)
	if err := cuda.ToolCanRemap(path); err != nil {
		c.Status = Warn
		c.Detail += "; it has no --device-map"
		c.Hint = "restores and migrations onto other GPUs are refused: install a cuda-checkpoint with --device-map (CUDA 13.0 or later) or upgrade the NVIDIA driver"
	} else {
		c.Detail += "; restores onto other GPUs through --device-map"
	}
	return c
}

// missingSymbols returns the names in want that the ELF file at path does
// not define as functions in its dynamic symbol table.
func missingSymbols(path string, want []string) ([]string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return nil, err
	}
	defined := map[string]bool{}
	for _, s := range syms {
		kind := elf.ST_TYPE(s.Info)
		if s.Section == elf.SHN_UNDEF || (kind != elf.STT_FUNC && kind != elf.STT_GNU_IFUNC) {
			continue
		}
		name, _, _ := strings.Cut(s.Name, "@")
		defined[name] = true
	}
	var missing []string
	for _, name := range want {
		if !defined[name] {
			missing = append(missing, name)
		}
	}
	return missing, nil
}

// driverCheck reads the kernel module's version and compares it with the
// user-space library's, whose mismatch makes every CUDA call fail.
func driverCheck(o Options, lib libSearch) Check {
	c := Check{Name: "nvidia driver"}
	versionFile := filepath.Join(o.procRoot(), "driver", "nvidia", "version")
	data, err := os.ReadFile(versionFile)
	if err != nil {
		if lib.path == "" {
			c.Status = Missing
			c.Detail = "no NVIDIA kernel driver (" + versionFile + " absent)"
			c.Hint = "install the NVIDIA driver for GPU checkpoints; CPU processes and files still work"
		} else {
			c.Status = Warn
			c.Detail = "libcuda.so.1 is installed but " + versionFile + " is absent: the kernel module is not loaded or not visible here"
			c.Hint = "load the nvidia kernel module (in a container: run it with GPU access)"
		}
		return c
	}
	m := driverVersionPattern.FindStringSubmatch(string(data))
	if m == nil {
		c.Status = Warn
		c.Detail = fmt.Sprintf("unrecognised %s: %q", versionFile, firstLine(string(data)))
		c.Hint = "check the NVIDIA driver installation (`nvidia-smi`)"
		return c
	}
	module := m[1]
	c.Status = OK
	c.Detail = "kernel module " + module
	if strings.Contains(string(data), "Open Kernel Module") {
		c.Detail += " (open)"
	}
	if lm := libcudaVersionPattern.FindStringSubmatch(filepath.Base(lib.resolved)); lm != nil {
		if lm[1] != module {
			c.Status = Warn
			c.Detail += "; libcuda is " + lm[1]
			c.Hint = "driver/library version mismatch: reboot or reload the nvidia module so both match"
		} else {
			c.Detail += ", matches libcuda"
		}
	}
	return c
}
