// Package zdtm runs CRIU's own test suite (zdtm, test/zdtm/static of the
// CRIU source) through stasis. This file reads the suite: which tests there
// are and what each one's .desc asks for; zdtm_test.go starts the tests as
// zdtm.py's host flavour does and checkpoints and restores them, by hand
// with CRIU and through stasis. scripts/zdtm-build.sh builds the suite.
package zdtm

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Desc is what a test's .desc file asks for (a Python dict literal read by
// zdtm.py; a test without one asks for nothing).
type Desc struct {
	// Flavors the test runs in: "h" (host), "ns", "uns". Empty means all.
	Flavors []string
	// Flags such as "suid" (runs as root: zdtm does not switch it to its
	// test user), "crfail" (the dump must fail), "noauto" (not part of a
	// full run), "excl" (not in parallel with others), "reqrst", "nouser".
	Flags []string
	// Opts are CRIU options for dump and restore, DumpOpts and
	// RestoreOpts for one of them.
	Opts, DumpOpts, RestoreOpts []string
	// Features CRIU must report (`criu check --feature F`).
	Features []string
	// Arch is the only architecture the test is for, when set.
	Arch string
	// Timeout for the test's start, in seconds (zdtm's default: 30).
	Timeout int
}

// Flag reports whether d has flag f.
func (d Desc) Flag(f string) bool {
	for _, g := range d.Flags {
		if g == f {
			return true
		}
	}
	return false
}

// Host reports whether the test runs in zdtm's host flavour.
func (d Desc) Host() bool {
	if len(d.Flavors) == 0 {
		return true
	}
	for _, f := range d.Flavors {
		if f == "h" {
			return true
		}
	}
	return false
}

// ErrCode: the .desc is a Python expression that zdtm.py evaluates (one
// test's depends on the environment), not a dict literal.
var ErrCode = errors.New("the .desc is Python code, not a dict literal")

// ParseDesc reads the text of a .desc file: a dict of string keys whose
// values are strings or lists of strings, with Python's comments, quotes
// and trailing commas. Unknown keys are ignored.
func ParseDesc(text string) (Desc, error) {
	var d Desc
	if strings.TrimSpace(text) == "" {
		return d, nil
	}
	p := &descParser{s: text}
	if p.peek() != '{' {
		return d, ErrCode
	}
	values, err := p.dict()
	if err != nil {
		return d, err
	}
	if p.skipSpace(); p.i != len(p.s) {
		return d, p.errorf("text after the dict")
	}
	words := func(key string) ([]string, error) {
		v, ok := values[key]
		if !ok {
			return nil, nil
		}
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("desc: %q is a list, want a string", key)
		}
		return strings.Fields(s), nil
	}
	for key, dst := range map[string]*[]string{
		"flavor": &d.Flavors, "flags": &d.Flags, "opts": &d.Opts,
		"dopts": &d.DumpOpts, "ropts": &d.RestoreOpts, "feature": &d.Features,
	} {
		if *dst, err = words(key); err != nil {
			return d, err
		}
	}
	arch, err := words("arch")
	if err != nil {
		return d, err
	}
	d.Arch = strings.Join(arch, " ")
	timeout, err := words("timeout")
	if err != nil {
		return d, err
	}
	if len(timeout) == 1 {
		if d.Timeout, err = strconv.Atoi(timeout[0]); err != nil {
			return d, fmt.Errorf("desc: timeout %q: %w", timeout[0], err)
		}
	}
	return d, nil
}

type descParser struct {
	s string
	i int
}

func (p *descParser) errorf(format string, args ...any) error {
	return fmt.Errorf("desc: at byte %d: %s", p.i, fmt.Sprintf(format, args...))
}

// skipSpace skips white space and comments.
func (p *descParser) skipSpace() {
	for p.i < len(p.s) {
		switch c := p.s[p.i]; {
		case c == '#':
			for p.i < len(p.s) && p.s[p.i] != '\n' {
				p.i++
			}
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			p.i++
		default:
			return
		}
	}
}

// expect consumes c, after any space.
func (p *descParser) expect(c byte) error {
	p.skipSpace()
	if p.i >= len(p.s) || p.s[p.i] != c {
		return p.errorf("want %q", c)
	}
	p.i++
	return nil
}

// peek returns the next byte after any space, or 0 at the end.
func (p *descParser) peek() byte {
	p.skipSpace()
	if p.i >= len(p.s) {
		return 0
	}
	return p.s[p.i]
}

// str reads one or more adjacent string literals (Python joins them).
func (p *descParser) str() (string, error) {
	var b strings.Builder
	for n := 0; ; n++ {
		q := p.peek()
		if q != '\'' && q != '"' {
			if n == 0 {
				return "", p.errorf("want a string")
			}
			return b.String(), nil
		}
		p.i++
		for {
			if p.i >= len(p.s) {
				return "", p.errorf("unterminated string")
			}
			c := p.s[p.i]
			p.i++
			if c == q {
				break
			}
			if c == '\\' && p.i < len(p.s) {
				c = p.s[p.i]
				p.i++
			}
			b.WriteByte(c)
		}
	}
}

func (p *descParser) list() ([]string, error) {
	if err := p.expect('['); err != nil {
		return nil, err
	}
	var l []string
	for p.peek() != ']' {
		s, err := p.str()
		if err != nil {
			return nil, err
		}
		l = append(l, s)
		if p.peek() == ',' {
			p.i++
		} else if p.peek() != ']' {
			return nil, p.errorf("want ',' or ']'")
		}
	}
	p.i++
	return l, nil
}

func (p *descParser) dict() (map[string]any, error) {
	if err := p.expect('{'); err != nil {
		return nil, err
	}
	m := map[string]any{}
	for p.peek() != '}' {
		key, err := p.str()
		if err != nil {
			return nil, err
		}
		if err := p.expect(':'); err != nil {
			return nil, err
		}
		if p.peek() == '[' {
			m[key], err = p.list()
		} else {
			m[key], err = p.str()
		}
		if err != nil {
			return nil, err
		}
		if p.peek() == ',' {
			p.i++
		} else if p.peek() != '}' {
			return nil, p.errorf("want ',' or '}'")
		}
	}
	p.i++
	return m, nil
}

// Tests lists the tests in dir (test/zdtm/static, built) as zdtm.py does:
// its executable regular files, less hooks, checkskip scripts and the
// files zdtm.desc excludes.
func Tests(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	excluded := map[string]bool{"route_rules": true, "criu-rtc.so": true}
	var tests []string
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || excluded[name] || strings.HasSuffix(name, ".hook") || strings.HasSuffix(name, ".checkskip") {
			continue
		}
		info, err := e.Info()
		if err != nil {
			return nil, err
		}
		if info.Mode()&0o100 != 0 {
			tests = append(tests, name)
		}
	}
	sort.Strings(tests)
	return tests, nil
}

// LoadDesc reads test's .desc in dir (none: an empty Desc).
func LoadDesc(dir, test string) (Desc, error) {
	text, err := os.ReadFile(filepath.Join(dir, test+".desc"))
	if errors.Is(err, fs.ErrNotExist) {
		return Desc{}, nil
	}
	if err != nil {
		return Desc{}, err
	}
	d, err := ParseDesc(string(text))
	if err != nil {
		return d, fmt.Errorf("%s.desc: %w", test, err)
	}
	return d, nil
}
