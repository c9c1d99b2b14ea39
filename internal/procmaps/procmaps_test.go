package procmaps

import (
	"bufio"
	"os"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		line string
		want Mapping
		anon bool
	}{
		{"7f0000000000-7f0000021000 rw-p 00000000 00:00 0 ", Mapping{Start: 0x7f0000000000, End: 0x7f0000021000, Perms: "rw-p", Inode: "0"}, true},
		{"55becc28c000-55becc41b000 rw-p 00000000 00:00 0                          [heap]", Mapping{Start: 0x55becc28c000, End: 0x55becc41b000, Perms: "rw-p", Inode: "0", Path: "[heap]"}, true},
		{"7f1000000000-7f1000001000 rw-s 00001000 08:01 1234                       /tmp/a  b (deleted)", Mapping{Start: 0x7f1000000000, End: 0x7f1000001000, Perms: "rw-s", Inode: "1234", Path: "/tmp/a  b (deleted)"}, false},
		{"7f2000000000-7f2000001000 r--p 00000000 00:05 0                          /memfd:x (deleted)", Mapping{Start: 0x7f2000000000, End: 0x7f2000001000, Perms: "r--p", Inode: "0", Path: "/memfd:x (deleted)"}, false},
	} {
		got, err := Parse(tc.line)
		if err != nil || got != tc.want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", tc.line, got, err, tc.want)
		}
		if got.Anonymous() != tc.anon {
			t.Errorf("%q: Anonymous = %v", tc.line, got.Anonymous())
		}
	}
	if m, _ := Parse("7f1000000000-7f1000001000 rw-s 00001000 08:01 1234 /x"); !m.SharedWritable() || m.Private() {
		t.Errorf("rw-s: SharedWritable %v, Private %v", m.SharedWritable(), m.Private())
	}
	for _, bad := range []string{"", "7f00-7f01 rw-p 0 00:00", "zz-7f01 rw-p 0 00:00 0", "7f00-7f01 rw 0 00:00 0"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) succeeded", bad)
		}
	}
	// Every line of this process's own map parses.
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if _, err := Parse(sc.Text()); err != nil {
			t.Error(err)
		}
	}
}
