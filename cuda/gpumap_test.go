package cuda

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func gpus(n int) []Device {
	devs := make([]Device, n)
	for i := range devs {
		devs[i] = Device{Index: i, Name: "H200", UUID: fmt.Sprintf("GPU-%08x-0000-0000-0000-%012x", i, i)}
	}
	return devs
}

// pairsText writes pairs as "0>1 1>0": each GPU of old by its index in
// old, the one it goes to by its index in here.
func pairsText(pairs []GPUPair, old, here []Device) string {
	var parts []string
	for _, p := range pairs {
		o, ok1 := FindGPU(old, FormatUUID(p.Old))
		n, ok2 := FindGPU(here, FormatUUID(p.New))
		if !ok1 || !ok2 {
			return fmt.Sprintf("unknown GPUs in %x", pairs)
		}
		parts = append(parts, fmt.Sprintf("%d>%d", o.Index, n.Index))
	}
	return strings.Join(parts, " ")
}

func TestParseGPUMap(t *testing.T) {
	m, err := ParseGPUMap(" 0=1, GPU-00000000-0000-0000-0000-00000000000A=gpu-00000000-0000-0000-0000-000000000002")
	if err != nil || m["0"] != "1" || m["GPU-00000000-0000-0000-0000-00000000000a"] != "GPU-00000000-0000-0000-0000-000000000002" {
		t.Fatalf("%v, %v", m, err)
	}
	for _, bad := range []string{"x", "0", "0=", "=1", "-1=0", "01=1", "GPU-1=GPU-2", "0=1,0=2"} {
		if _, err := ParseGPUMap(bad); err == nil {
			t.Errorf("ParseGPUMap(%q) accepted", bad)
		}
	}
	if m, err := ParseGPUMap(""); err != nil || len(m) != 0 {
		t.Errorf("empty map: %v, %v", m, err)
	}
}

func TestPlanPairs(t *testing.T) {
	two, four := gpus(2), gpus(4)
	other := []Device{{Index: 0, Name: "H200", UUID: "GPU-aaaaaaaa-0000-0000-0000-000000000000"}, {Index: 1, Name: "H200", UUID: "GPU-bbbbbbbb-0000-0000-0000-000000000000"}}
	for _, c := range []struct {
		name      string
		old, here []Device
		m         string
		want      string
	}{
		{"the same GPUs", two, two, "", ""},
		{"0=1 on two GPUs swaps them", two, two, "0=1", "0>1 1>0"},
		{"by UUID", two, two, two[0].UUID + "=" + two[1].UUID, "0>1 1>0"},
		{"0=1 on four GPUs", four, four, "0=1", "0>1 1>0 2>2 3>3"},
		{"a rotation", four, four, "0=1,1=2,2=3", "0>1 1>2 2>3 3>0"},
		{"another machine's GPUs go by index", other, two, "", "0>0 1>1"},
		{"another machine's, crossed", other, two, "0=1", "0>1 1>0"},
		{"one GPU of another machine onto GPU 1", other[:1], two, "0=1", "0>1"},
	} {
		m, err := ParseGPUMap(c.m)
		if err != nil {
			t.Fatal(err)
		}
		pairs, err := PlanPairs(c.old, c.here, m)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if got := pairsText(pairs, c.old, c.here); got != c.want {
			t.Errorf("%s: pairs %q, want %q", c.name, got, c.want)
		}
	}
	for _, c := range []struct {
		name      string
		old, here []Device
		m, want   string
	}{
		{"a GPU that is not here", two, two, "0=5", "not a GPU of this machine"},
		{"a GPU the job did not have", two[:1], two, "1=0", "which the job did not have"},
		{"two onto one", four, four, "0=2,1=2", "sends two GPUs to GPU 2"},
		{"more GPUs than here", four, two, "", "the job had 4 GPUs"},
	} {
		m, err := ParseGPUMap(c.m)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := PlanPairs(c.old, c.here, m); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		} else if c.want != "sends two GPUs to GPU 2" && !errors.Is(err, ErrNoGPU) {
			t.Errorf("%s: %v does not wrap ErrNoGPU", c.name, err)
		}
	}
	if d, ok := Target([]GPUPair{}, two[1], two); !ok || d.Index != 1 {
		t.Errorf("Target without pairs: %v %v", d, ok)
	}
}
