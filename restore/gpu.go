package restore

import (
	"errors"
	"fmt"
	"strings"

	"github.com/stasis-ckpt/stasis/checkpoint"
	"github.com/stasis-ckpt/stasis/cuda"
)

// ErrIncompatible is returned when this machine's driver or GPUs differ
// from the checkpoint's in a way a restore cannot bridge without --force.
var ErrIncompatible = errors.New("this machine does not match the checkpoint")

// ParseGPUMap reads --gpu-map OLD=NEW,... (UUIDs as nvidia-smi writes them).
func ParseGPUMap(s string) (map[string]string, error) {
	m := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return m, nil
	}
	for _, pair := range strings.Split(s, ",") {
		old, nu, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok {
			return nil, fmt.Errorf("--gpu-map %q: use OLD-UUID=NEW-UUID,...", pair)
		}
		for _, u := range []string{old, nu} {
			if _, err := cuda.ParseUUID(u); err != nil {
				return nil, fmt.Errorf("--gpu-map: %v", err)
			}
		}
		m[strings.ToLower(old)] = strings.ToLower(nu)
	}
	return m, nil
}

// gpuPlan checks the machine against the checkpoint and works out the GPU
// pairs for the CUDA restore: the --gpu-map given, or else, when the
// checkpoint's GPUs are not all here, the GPU of the same index. Nil pairs
// mean the same GPUs.
func gpuPlan(meta *checkpoint.GPUMeta, drv *cuda.Driver, gpuMap map[string]string, force bool) ([]cuda.GPUPair, error) {
	version, err := drv.DriverVersion()
	if err != nil {
		return nil, err
	}
	if version != meta.DriverVersion && !force {
		return nil, fmt.Errorf("%w: the checkpoint was made with a driver for CUDA %s, this one is for CUDA %s (--force to try anyway)", ErrIncompatible, cudaVersion(meta.DriverVersion), cudaVersion(version))
	}
	here, err := drv.Devices()
	if err != nil {
		return nil, err
	}
	byUUID := map[string]cuda.Device{}
	for _, d := range here {
		byUUID[strings.ToLower(d.UUID)] = d
	}
	allHere := true
	for _, d := range meta.Devices {
		if _, ok := byUUID[strings.ToLower(d.UUID)]; !ok {
			allHere = false
		}
	}
	var pairs []cuda.GPUPair
	remapped := false
	for _, old := range meta.Devices {
		target, err := gpuTarget(old, here, byUUID, gpuMap, allHere)
		if err != nil {
			return nil, err
		}
		if target.Name != old.Name && !force {
			return nil, fmt.Errorf("%w: GPU %s was a %s, %s is a %s (--force to try anyway)", ErrIncompatible, old.UUID, old.Name, target.UUID, target.Name)
		}
		o, err1 := cuda.ParseUUID(old.UUID)
		n, err2 := cuda.ParseUUID(target.UUID)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%w: unreadable GPU UUIDs %s, %s", ErrIncompatible, old.UUID, target.UUID)
		}
		remapped = remapped || o != n
		pairs = append(pairs, cuda.GPUPair{Old: o, New: n})
	}
	if !remapped {
		return nil, nil // the same GPUs: no pairs
	}
	seen := map[[16]byte]bool{}
	for _, p := range pairs {
		if seen[p.New] && !force {
			return nil, fmt.Errorf("%w: two GPUs of the checkpoint would go to %s (complete --gpu-map, or --force)", ErrIncompatible, cuda.FormatUUID(p.New))
		}
		seen[p.New] = true
	}
	return pairs, nil
}

// gpuTarget picks the GPU of this machine that takes over old: the one
// --gpu-map names, else the same GPU when every GPU of the checkpoint is
// here (or --gpu-map is given and leaves it out), else the GPU of the same
// index.
func gpuTarget(old cuda.Device, here []cuda.Device, byUUID map[string]cuda.Device, gpuMap map[string]string, allHere bool) (cuda.Device, error) {
	if nu, ok := gpuMap[strings.ToLower(old.UUID)]; ok {
		d, found := byUUID[nu]
		if !found {
			return d, fmt.Errorf("%w: --gpu-map names %s, which is not a GPU of this machine", ErrIncompatible, nu)
		}
		return d, nil
	}
	if d, ok := byUUID[strings.ToLower(old.UUID)]; ok && (allHere || len(gpuMap) > 0) {
		return d, nil
	}
	if old.Index >= len(here) {
		return cuda.Device{}, fmt.Errorf("%w: the checkpoint used GPU %d (%s), this machine has %d GPUs (give --gpu-map)", ErrIncompatible, old.Index, old.UUID, len(here))
	}
	return here[old.Index], nil
}

func cudaVersion(v int) string { return fmt.Sprintf("%d.%d", v/1000, v%1000/10) }

// resumeGPU restores and unlocks the CUDA processes of a restored tree.
func resumeGPU(drv *cuda.Driver, pids []int, pairs []cuda.GPUPair) error {
	var errs []error
	for _, pid := range pids {
		if err := drv.Restore(pid, pairs); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := drv.Unlock(pid); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("the process tree is restored but its GPU side is not (see `stasis recover`): %w", errors.Join(errs...))
	}
	return nil
}
