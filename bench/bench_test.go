package bench

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/gdswriter"
)

// TestRunSmall runs the whole benchmark on 24 MiB: every figure is filled,
// the ratios are the quotients of the figures, the loaded bytes equalled the
// saved ones (Run checks), and nothing is left in the directory.
func TestRunSmall(t *testing.T) {
	dir := t.TempDir()
	for _, m := range []gdswriter.Method{gdswriter.MethodNone, gdswriter.MethodAuto} {
		res, err := Run(context.Background(), Options{Dir: dir, Size: 24 << 20, Method: m, Rounds: 2})
		if err != nil {
			t.Fatal(err)
		}
		for name, v := range map[string]float64{"raw write": res.RawWriteGBps, "raw read": res.RawReadGBps, "save": res.SaveGBps, "load": res.LoadGBps} {
			if v <= 0 {
				t.Errorf("%s: %v GB/s", name, v)
			}
		}
		if res.SaveRatio != res.SaveGBps/res.RawWriteGBps || res.LoadRatio != res.LoadGBps/res.RawReadGBps {
			t.Errorf("ratios do not match the figures: %+v", res)
		}
		switch m {
		case gdswriter.MethodNone:
			if res.StoredBytes != res.Bytes {
				t.Errorf("uncompressed: stored %d of %d", res.StoredBytes, res.Bytes)
			}
		case gdswriter.MethodAuto:
			if res.StoredRatio > 0.72 {
				t.Errorf("auto stored bf16 at %.3f of its size, want <= 0.72", res.StoredRatio)
			}
		}
		t.Logf("%s: %+v", m, *res)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("bench left %d entries in its directory", len(entries))
	}
}

func TestBadOptions(t *testing.T) {
	if _, err := Run(context.Background(), Options{Dir: t.TempDir(), Size: 1000}); !errors.Is(err, catalog.ErrInvalid) {
		t.Errorf("size 1000: %v", err)
	}
	if _, err := Run(context.Background(), Options{Dir: t.TempDir(), Size: 1 << 20, Data: "text"}); !errors.Is(err, catalog.ErrInvalid) {
		t.Errorf("data text: %v", err)
	}
}

func TestParseSize(t *testing.T) {
	good := map[string]int64{"4096": 4096, "512MiB": 512 << 20, "2GiB": 2 << 30, "1.5GB": 1_500_000_000, "3G": 3 << 30}
	for in, want := range good {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1GiB", "two", "1XB", "0"} {
		if _, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) accepted", in)
		}
	}
}
