package hooks

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	home := t.TempDir()
	if err := os.WriteFile(filepath.Join(home, ConfigName), []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return home
}

func TestLoadConfigWithoutFileIsEmpty(t *testing.T) {
	c, err := LoadConfig(t.TempDir(), false)
	if err != nil || c != (Config{}) {
		t.Fatalf("got %+v, %v; want the zero Config", c, err)
	}
}

func TestLoadConfigReadsHooksAndRunDefaults(t *testing.T) {
	home := writeConfig(t, `
[hooks]
pre_checkpoint = "/opt/hooks/pre"
post_restore = "/opt/hooks/post-restore"
timeout = "15s"

[run]
mode = "process"
signal = "USR1,TERM"
grace = "90s"
kill_after = "5s"
fallback = "process"
`)
	c, err := LoadConfig(home, false)
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Hooks: Scripts{PreCheckpoint: "/opt/hooks/pre", PostRestore: "/opt/hooks/post-restore", Timeout: 15 * time.Second},
		Run:   RunDefaults{Mode: "process", Signal: "USR1,TERM", Grace: 90 * time.Second, KillAfter: 5 * time.Second, Fallback: "process"},
	}
	if c != want {
		t.Fatalf("got %+v\nwant %+v", c, want)
	}
}

func TestLoadConfigRefusesMistakes(t *testing.T) {
	for name, tc := range map[string]struct{ text, message string }{
		"misspelt key":  {"[hooks]\npre_checkpiont = \"/x\"\n", `unknown key "hooks.pre_checkpiont"`},
		"relative path": {"[hooks]\npost_checkpoint = \"hooks/post\"\n", `give an absolute path`},
		"bad duration":  {"[run]\ngrace = \"two minutes\"\n", `grace`},
		"not TOML":      {"[hooks\n", `config.toml`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := LoadConfig(writeConfig(t, tc.text), false)
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.message) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q: want a one-line ErrConfig naming %q", err, tc.message)
			}
		})
	}
}

func TestScriptsFlagsOverConfig(t *testing.T) {
	config := Scripts{PreCheckpoint: "/config/pre", PostCheckpoint: "/config/post", Timeout: time.Minute}
	got := Scripts{PostCheckpoint: "/flag/post"}.Over(config)
	want := Scripts{PreCheckpoint: "/config/pre", PostCheckpoint: "/flag/post", Timeout: time.Minute}
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}
