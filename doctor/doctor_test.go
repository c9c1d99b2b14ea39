package doctor

import (
	"context"
	"encoding/json"
	"testing"
)

func TestWorst(t *testing.T) {
	tests := []struct {
		name     string
		statuses []Status
		want     Status
	}{
		{"empty", nil, OK},
		{"all ok", []Status{OK, OK}, OK},
		{"warn", []Status{OK, Warn, OK}, Warn},
		{"missing beats warn", []Status{Warn, Missing, OK}, Missing},
		{"missing first", []Status{Missing, Warn}, Missing},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cs []Check
			for _, s := range tt.statuses {
				cs = append(cs, Check{Name: "x", Status: s})
			}
			if got := Worst(cs); got != tt.want {
				t.Errorf("Worst(%v) = %s, want %s", tt.statuses, got, tt.want)
			}
		})
	}
}

func TestRunOrderWithNothingInstalled(t *testing.T) {
	cs := Run(context.Background(), hermeticOptions(t))
	want := []string{"kernel", "criu", "libcuda", "nvidia driver", "libcufile", "tensor io path", "store", "store free space", "store o_direct", "RAM scratch"}
	if len(cs) != len(want) {
		t.Fatalf("got %d checks %v, want %v", len(cs), cs, want)
	}
	for i, c := range cs {
		if c.Name != want[i] {
			t.Errorf("check %d is %q, want %q", i, c.Name, want[i])
		}
		if c.Detail == "" {
			t.Errorf("%s: empty detail", c.Name)
		}
		if c.Status != OK && c.Hint == "" {
			t.Errorf("%s: %s without a hint", c.Name, c.Status)
		}
	}
	if got := Worst(cs); got != Missing {
		t.Errorf("Worst = %s, want MISSING", got)
	}
}

func TestCheckJSON(t *testing.T) {
	b, err := json.Marshal([]Check{{Name: "criu", Status: OK, Detail: "d"}, {Name: "gds", Status: Warn, Detail: "d", Hint: "h"}})
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"name":"criu","status":"OK","detail":"d"},{"name":"gds","status":"WARN","detail":"d","hint":"h"}]`
	if string(b) != want {
		t.Errorf("got %s\nwant %s", b, want)
	}
}
