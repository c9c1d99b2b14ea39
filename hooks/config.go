package hooks

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/stasis-ckpt/stasis/catalog"
)

// ConfigName is the configuration file's name in the store.
const ConfigName = "config.toml"

// ErrConfig is returned for a configuration file that does not parse or
// names something unknown.
var ErrConfig = errors.New("bad configuration")

// Config is $STASIS_HOME/config.toml. Every field is optional; flags given
// on the command line win over it.
type Config struct {
	// Remote is the object store checkpoints are pushed to and pulled
	// from: "s3://bucket/prefix" (docs/config.md).
	Remote string      `toml:"remote"`
	S3     S3Settings  `toml:"s3"`
	Hooks  Scripts     `toml:"hooks"`
	Run    RunDefaults `toml:"run"`
}

// S3Settings say how to reach the remote's S3 engine. Credentials are
// never here: they come from the environment or ~/.aws/credentials.
type S3Settings struct {
	Endpoint string `toml:"endpoint"` // https://host:port; AWS_ENDPOINT_URL wins over it
	Region   string `toml:"region"`
	Profile  string `toml:"profile"`  // of ~/.aws/credentials; AWS_PROFILE wins over it
	Insecure bool   `toml:"insecure"` // allow plain HTTP
}

// RunDefaults are defaults for `stasis run`.
type RunDefaults struct {
	Mode      string        `toml:"mode"`       // app or process
	Signal    string        `toml:"signal"`     // preemption signals, "USR1,TERM"
	Grace     time.Duration `toml:"grace"`      // "120s"
	KillAfter time.Duration `toml:"kill_after"` // between SIGTERM and SIGKILL
	Fallback  string        `toml:"fallback"`   // "process" or ""
}

// LoadConfig reads home's config.toml; a store without one has the zero
// Config. The hooks it names run as the store's user, so, unless
// allowUnsafe, the file and every hook script it names (and their
// directories) must be owned by that user or root and written by nobody
// else (catalog.CheckOwned; errors wrap catalog.ErrUnsafe).
func LoadConfig(home string, allowUnsafe bool) (Config, error) {
	var c Config
	path := filepath.Join(home, ConfigName)
	if !allowUnsafe {
		if err := catalog.CheckOwned("configuration file", path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return Config{}, err
		}
	}
	md, err := toml.DecodeFile(path, &c)
	if errors.Is(err, os.ErrNotExist) {
		return Config{}, nil
	}
	if err != nil {
		return Config{}, fmt.Errorf("%w: %s: %s", ErrConfig, path, strings.Join(strings.Fields(err.Error()), " "))
	}
	if unknown := md.Undecoded(); len(unknown) > 0 {
		return Config{}, fmt.Errorf("%w: %s: unknown key %q (see docs/config.md)", ErrConfig, path, unknown[0].String())
	}
	for name, p := range c.Hooks.paths() {
		if p != "" && !filepath.IsAbs(p) {
			return Config{}, fmt.Errorf("%w: %s: [hooks] %s = %q: give an absolute path", ErrConfig, path, name, p)
		}
		if p != "" && !allowUnsafe {
			if err := catalog.CheckOwned("hook script ("+name+" in "+path+")", p); err != nil && !errors.Is(err, os.ErrNotExist) {
				return Config{}, err
			}
		}
	}
	return c, nil
}
