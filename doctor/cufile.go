package doctor

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/stasis-ckpt/stasis/tensors"
)

const ownPathHint = "cuFile will fail without nvidia-fs; stasis uses its own path"

// checkCuFile reports libcufile and, when it is found, how cuFile would move
// data: GPUDirect Storage through nvidia-fs, or compat mode through host
// memory; then the I/O path the tensor saves and loads take.
func checkCuFile(o Options, libs *libFinder) []Check {
	return append(checkCuFileLibrary(o, libs), o.ioPathCheck())
}

func checkCuFileLibrary(o Options, libs *libFinder) []Check {
	lib := libs.find("libcufile.so.0", true)
	if lib.path == "" {
		detail := "libcufile.so.0 not found"
		if len(lib.skipped) > 0 {
			detail += " for this architecture (skipped " + strings.Join(lib.skipped, ", ") + ")"
		}
		return []Check{{
			Name: "libcufile", Status: Missing, Detail: detail,
			Hint: "stasis falls back to its own pinned-memory O_DIRECT path",
		}}
	}
	return []Check{
		{Name: "libcufile", Status: OK, Detail: lib.describe()},
		gdsCheck(o),
	}
}

// ioPathCheck reports the I/O path of GPU tensors: $STASIS_IO when it
// chooses one, else what auto takes here (cufile or pinned) and why, with
// the cuFile library stasis loads and its version.
func (o Options) ioPathCheck() Check {
	c := Check{Name: "tensor io path", Status: OK}
	path, why, cf := o.autoChoice()
	if cf != nil {
		version := cf.VersionString()
		if version == "" {
			version = "of unknown version"
		}
		why = fmt.Sprintf("cuFile %s (%s); %s", version, cf.Path, why)
	}
	c.Detail = fmt.Sprintf("auto takes %s: %s", path, why)
	switch mode, err := tensors.ParseIO(""); {
	case err != nil:
		c.Status, c.Hint = Warn, err.Error()
	case mode != tensors.IOAuto:
		c.Detail = fmt.Sprintf("%s=%s chooses %s; %s", tensors.IOEnv, mode, mode, c.Detail)
	}
	return c
}

func gdsCheck(o Options) Check {
	c := Check{Name: "gds"}
	if nvidiaFSLoaded(o) {
		if force := os.Getenv("CUFILE_FORCE_COMPAT_MODE"); strings.EqualFold(force, "true") {
			c.Status = Warn
			c.Detail = "nvidia-fs loaded, but CUFILE_FORCE_COMPAT_MODE=" + force + " forces compat mode"
			c.Hint = "unset CUFILE_FORCE_COMPAT_MODE to use GPUDirect Storage"
			return c
		}
		c.Status = OK
		c.Detail = "GPUDirect Storage (nvidia-fs loaded)"
		return c
	}

	c.Status = Warn
	path := o.cuFileConfig()
	allow, err := allowCompatMode(path)
	switch {
	case os.IsNotExist(err):
		c.Detail = fmt.Sprintf("compat mode: cuFile moves data through host memory (nvidia-fs not loaded; no %s, and cuFile allows compat mode by default)", path)
		c.Hint = "load nvidia-fs (modprobe nvidia-fs) for GPUDirect Storage"
	case err != nil:
		c.Detail = fmt.Sprintf("nvidia-fs not loaded; cannot read allow_compat_mode from %s: %v", path, err)
		c.Hint = ownPathHint
	case allow == nil:
		c.Detail = fmt.Sprintf("compat mode: cuFile moves data through host memory (nvidia-fs not loaded; %s does not set allow_compat_mode, which defaults to true)", path)
		c.Hint = "load nvidia-fs (modprobe nvidia-fs) for GPUDirect Storage"
	case *allow:
		c.Detail = fmt.Sprintf("compat mode: cuFile moves data through host memory (nvidia-fs not loaded; allow_compat_mode is true in %s)", path)
		c.Hint = "load nvidia-fs (modprobe nvidia-fs) for GPUDirect Storage"
	default:
		c.Detail = fmt.Sprintf("nvidia-fs not loaded and allow_compat_mode is false in %s", path)
		c.Hint = ownPathHint
	}
	return c
}

// nvidiaFSLoaded looks for the nvidia_fs module in sysfs and in /proc/modules.
func nvidiaFSLoaded(o Options) bool {
	if _, err := os.Stat(filepath.Join(o.sysRoot(), "module", "nvidia_fs")); err == nil {
		return true
	}
	f, err := os.Open(filepath.Join(o.procRoot(), "modules"))
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "nvidia_fs ") {
			return true
		}
	}
	return false
}

// allowCompatMode reads properties.allow_compat_mode from a cuFile config;
// nil means the file does not set it.
func allowCompatMode(path string) (*bool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var config struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if err := json.Unmarshal(stripJSONComments(data), &config); err != nil {
		return nil, err
	}
	raw, ok := config.Properties["allow_compat_mode"]
	if !ok {
		return nil, nil
	}
	var allow bool
	if err := json.Unmarshal(raw, &allow); err != nil {
		return nil, fmt.Errorf("allow_compat_mode is %s, not a boolean", raw)
	}
	return &allow, nil
}

// stripJSONComments removes // and /* */ comments outside strings, as
// cufile.json carries them; line breaks are kept so errors point at the
// right line.
func stripJSONComments(data []byte) []byte {
	out := make([]byte, 0, len(data))
	inString, escaped := false, false
	for i := 0; i < len(data); i++ {
		ch := data[i]
		switch {
		case inString:
			out = append(out, ch)
			if escaped {
				escaped = false
			} else if ch == '\\' {
				escaped = true
			} else if ch == '"' {
				inString = false
			}
		case ch == '"':
			inString = true
			out = append(out, ch)
		case ch == '/' && i+1 < len(data) && data[i+1] == '/':
			for i < len(data) && data[i] != '\n' {
				i++
			}
			if i < len(data) {
				out = append(out, '\n')
			}
		case ch == '/' && i+1 < len(data) && data[i+1] == '*':
			i += 2
			for i < len(data) && !(data[i] == '*' && i+1 < len(data) && data[i+1] == '/') {
				if data[i] == '\n' {
					out = append(out, '\n')
				}
				i++
			}
			i++ // skip the closing '/'
		default:
			out = append(out, ch)
		}
	}
	return out
}
