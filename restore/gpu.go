package restore

import (
	"errors"
	"fmt"

	"github.com/stasis-ckpt/stasis/checkpoint"
	"github.com/stasis-ckpt/stasis/cuda"
)

// ErrIncompatible is returned when this machine's driver, GPUs, files or
// mounts differ from the checkpoint's in a way a restore cannot bridge
// without --force (a MismatchError lists them).
var ErrIncompatible = errors.New("this machine does not match the checkpoint")

// gpuPlan works out the GPU pairs for the CUDA restore (cuda.PlanPairs:
// the GPUs gpuMap names, else the same GPUs, else those of the same
// index; nil pairs mean the same GPUs) and the mismatches a restore onto
// them would have: another driver version, another GPU model. An error
// (wrapping cuda.ErrNoGPU) means there are no GPUs to restore onto; one
// wrapping cuda.ErrUnavailable, that the pairs are needed and the backend
// cannot take them (a cuda-checkpoint without --device-map).
func gpuPlan(meta *checkpoint.GPUMeta, drv *cuda.Driver, gpuMap cuda.GPUMap) ([]cuda.GPUPair, []string, error) {
	var mismatches []string
	version, err := drv.DriverVersion()
	if err != nil {
		return nil, nil, err
	}
	if version != meta.DriverVersion {
		mismatches = append(mismatches, fmt.Sprintf("driver: the checkpoint was made with a driver for CUDA %s, this one is for CUDA %s", cudaVersion(meta.DriverVersion), cudaVersion(version)))
	}
	here, err := drv.Devices()
	if err != nil {
		return nil, nil, err
	}
	pairs, err := cuda.PlanPairs(meta.Devices, here, gpuMap)
	if err != nil {
		return nil, nil, err
	}
	if pairs != nil {
		if err := drv.CanRemap(); err != nil {
			return nil, nil, fmt.Errorf("the restore moves GPU state onto other GPUs: %w", err)
		}
	}
	for _, old := range meta.Devices {
		if to, ok := cuda.Target(pairs, old, here); ok && to.Name != old.Name {
			mismatches = append(mismatches, fmt.Sprintf("GPU %d (%s) was a %s, GPU %d (%s) that takes it over is a %s", old.Index, old.UUID, old.Name, to.Index, to.UUID, to.Name))
		}
	}
	return pairs, mismatches, nil
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
