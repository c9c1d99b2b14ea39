package cuda

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrNoGPU is wrapped by errors about a GPU that is named (in --gpu-map,
// --to-gpu, or by a checkpoint) but is not there.
var ErrNoGPU = errors.New("no such GPU")

// GPUMap is what --gpu-map OLD=NEW,... says: which GPU takes over which,
// each named by its index or its UUID (as nvidia-smi writes it; the
// "GPU-" prefix is optional). Keys and values are normalised: an index in
// decimal, a UUID as FormatUUID writes it.
type GPUMap map[string]string

// ParseGPUName checks a GPU name, an index or a UUID, and normalises it.
func ParseGPUName(name string) (string, error) {
	name = strings.TrimSpace(name)
	if i, err := strconv.Atoi(name); err == nil && i >= 0 && strconv.Itoa(i) == name {
		return name, nil
	}
	if len(name) > 4 && strings.EqualFold(name[:4], "GPU-") {
		name = name[4:]
	}
	u, err := ParseUUID(name)
	if err != nil {
		return "", fmt.Errorf("%q is neither a GPU index nor a GPU UUID", name)
	}
	return FormatUUID(u), nil
}

// ParseGPUMap reads OLD=NEW,... (each an index or a UUID).
func ParseGPUMap(s string) (GPUMap, error) {
	m := GPUMap{}
	if strings.TrimSpace(s) == "" {
		return m, nil
	}
	for _, pair := range strings.Split(s, ",") {
		old, nu, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok {
			return nil, fmt.Errorf("--gpu-map %q: use OLD=NEW,... (each a GPU index or UUID)", pair)
		}
		o, err := ParseGPUName(old)
		if err != nil {
			return nil, fmt.Errorf("--gpu-map: %v", err)
		}
		n, err := ParseGPUName(nu)
		if err != nil {
			return nil, fmt.Errorf("--gpu-map: %v", err)
		}
		if _, dup := m[o]; dup {
			return nil, fmt.Errorf("--gpu-map names GPU %s twice", o)
		}
		m[o] = n
	}
	return m, nil
}

// FindGPU returns the device of devs that a normalised name (ParseGPUName)
// names.
func FindGPU(devs []Device, name string) (Device, bool) {
	for _, d := range devs {
		if strconv.Itoa(d.Index) == name || strings.EqualFold(d.UUID, name) {
			return d, true
		}
	}
	return Device{}, false
}

// PlanPairs works out which GPU of here takes over each GPU of old, for a
// CUDA restore: the one m names; else, when every GPU of old is here or m
// is given, the same GPU; else the GPU of the same index. A GPU whose
// default is already taken by m gets the lowest-numbered GPU left, so
// that the pairs are one-to-one and cover every GPU of old, as the driver
// requires: on two GPUs, 0=1 means 0=1,1=0. Nil pairs mean every GPU stays
// where it is. Errors wrap ErrNoGPU, or name the two GPUs m sends to one.
func PlanPairs(old, here []Device, m GPUMap) ([]GPUPair, error) {
	target := make(map[int]Device, len(old)) // by position in old
	taken := map[string]bool{}
	for o, n := range m {
		from, ok := FindGPU(old, o)
		if !ok {
			return nil, fmt.Errorf("%w: --gpu-map names GPU %s, which the job did not have (it had %s)", ErrNoGPU, o, listGPUs(old))
		}
		to, ok := FindGPU(here, n)
		if !ok {
			return nil, fmt.Errorf("%w: --gpu-map names GPU %s, which is not a GPU of this machine (it has %s)", ErrNoGPU, n, listGPUs(here))
		}
		key := strings.ToLower(to.UUID)
		if taken[key] {
			return nil, fmt.Errorf("--gpu-map sends two GPUs to GPU %d (%s)", to.Index, to.UUID)
		}
		taken[key] = true
		target[positionOf(old, from)] = to
	}
	allHere := true
	for _, d := range old {
		if _, ok := FindGPU(here, strings.ToLower(d.UUID)); !ok {
			allHere = false
		}
	}
	var deferred []int
	for i, d := range old {
		if _, ok := target[i]; ok {
			continue
		}
		to, ok := FindGPU(here, strings.ToLower(d.UUID))
		if !ok || !(allHere || len(m) > 0) {
			to, ok = FindGPU(here, strconv.Itoa(d.Index))
		}
		if !ok || taken[strings.ToLower(to.UUID)] {
			deferred = append(deferred, i)
			continue
		}
		taken[strings.ToLower(to.UUID)] = true
		target[i] = to
	}
	for _, i := range deferred {
		found := false
		for _, to := range here {
			if !taken[strings.ToLower(to.UUID)] {
				taken[strings.ToLower(to.UUID)] = true
				target[i], found = to, true
				break
			}
		}
		if !found {
			return nil, fmt.Errorf("%w: the job had %d GPUs (%s), this machine has %d (%s); give --gpu-map", ErrNoGPU, len(old), listGPUs(old), len(here), listGPUs(here))
		}
	}
	var pairs []GPUPair
	moved := false
	for i, d := range old {
		o, err1 := ParseUUID(d.UUID)
		n, err2 := ParseUUID(target[i].UUID)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("unreadable GPU UUIDs %q, %q", d.UUID, target[i].UUID)
		}
		moved = moved || o != n
		pairs = append(pairs, GPUPair{Old: o, New: n})
	}
	if !moved {
		return nil, nil
	}
	return pairs, nil
}

func positionOf(devs []Device, d Device) int {
	for i, x := range devs {
		if x.UUID == d.UUID && x.Index == d.Index {
			return i
		}
	}
	return -1
}

// listGPUs writes devices as "0 (GPU-...), 1 (GPU-...)".
func listGPUs(devs []Device) string {
	if len(devs) == 0 {
		return "none"
	}
	parts := make([]string, len(devs))
	for i, d := range devs {
		parts[i] = fmt.Sprintf("%d (%s)", d.Index, d.UUID)
	}
	return strings.Join(parts, ", ")
}

// Target returns the GPU of devs that pairs send d to: the one a pair
// names, else d's own UUID among devs.
func Target(pairs []GPUPair, d Device, devs []Device) (Device, bool) {
	name := strings.ToLower(d.UUID)
	if u, err := ParseUUID(d.UUID); err == nil {
		for _, p := range pairs {
			if p.Old == u {
				name = FormatUUID(p.New)
			}
		}
	}
	return FindGPU(devs, name)
}
