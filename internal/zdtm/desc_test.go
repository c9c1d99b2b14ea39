package zdtm_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/stasis-ckpt/stasis/internal/zdtm"
)

func TestParseDesc(t *testing.T) {
	for _, c := range []struct {
		text string
		want zdtm.Desc
	}{
		{"", zdtm.Desc{}},
		{"{}\n", zdtm.Desc{}},
		{"{'flags': 'suid'}", zdtm.Desc{Flags: []string{"suid"}}},
		{`{'flavor': 'h ns', "opts": '--tcp-established', 'flags': 'nouser samens', 'feature' : 'tcp_half_closed', 'timeout': '60'}`,
			zdtm.Desc{Flavors: []string{"h", "ns"}, Opts: []string{"--tcp-established"}, Flags: []string{"nouser", "samens"}, Features: []string{"tcp_half_closed"}, Timeout: 60}},
		{"# a comment, then the dict\n{\n'flavor': 'h',\n# inside\n'opts': '--manage-cgroups '\n  '--cgroup-yard x',\n'deps': ['/bin/sh', '/usr/bin/diff'],\n 'arch': 'x86_64',\n}\n",
			zdtm.Desc{Flavors: []string{"h"}, Opts: []string{"--manage-cgroups", "--cgroup-yard", "x"}, Arch: "x86_64"}},
		{"{'dopts': '--tcp-established', 'ropts': '--tcp-close', 'flags': 'reqrst '}",
			zdtm.Desc{DumpOpts: []string{"--tcp-established"}, RestoreOpts: []string{"--tcp-close"}, Flags: []string{"reqrst"}}},
	} {
		got, err := zdtm.ParseDesc(c.text)
		if err != nil {
			t.Errorf("%q: %v", c.text, err)
			continue
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%q:\n got %+v\nwant %+v", c.text, got, c.want)
		}
	}
	for _, bad := range []string{"{'flags': 'suid'", "{'flags' 'suid'}", "{'flags': suid}", "{'flags': ['a']}", "{'timeout': 'x'}", "{} {}", "{'a': 'b' 'c': 'd'}", "os.getenv('X') or {}"} {
		if _, err := zdtm.ParseDesc(bad); err == nil {
			t.Errorf("%q: parsed, want an error", bad)
		}
	}
	d := zdtm.Desc{Flags: []string{"suid", "crfail"}}
	if !d.Flag("crfail") || d.Flag("noauto") || !d.Host() {
		t.Errorf("%+v: Flag or Host wrong", d)
	}
	if (zdtm.Desc{Flavors: []string{"ns", "uns"}}).Host() {
		t.Error("a test of flavours ns and uns runs in the host flavour")
	}
}

// TestEveryDescParses reads every test's .desc in the built suite.
func TestEveryDescParses(t *testing.T) {
	dir := suiteDir(t)
	tests, err := zdtm.Tests(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(tests) < 300 {
		t.Fatalf("%d tests in %s, want the whole suite (over 300)", len(tests), dir)
	}
	hosts := 0
	for _, name := range tests {
		d, err := zdtm.LoadDesc(dir, name)
		if errors.Is(err, zdtm.ErrCode) {
			t.Logf("%s: %v", name, err)
			continue
		}
		if err != nil {
			t.Error(err)
		}
		if d.Host() {
			hosts++
		}
	}
	t.Logf("%d tests, %d of them in the host flavour", len(tests), hosts)
}
