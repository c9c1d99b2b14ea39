package restore

import (
	"fmt"
	"strings"

	"github.com/stasis-ckpt/stasis/checkpoint"
)

// MismatchError lists how this machine differs from a checkpoint in ways
// that make a restore fail or go wrong: files the tree maps that are
// missing or other, mounts it used that are missing or of another type,
// the driver version, GPU models. Force restores anyway.
type MismatchError struct {
	ID         string
	Mismatches []string // one line each
	// Warnings are the differences that alone would not have stopped
	// the restore.
	Warnings []string
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("%s: %s", e.Summary(), strings.Join(e.Mismatches, "; "))
}

// Summary says what the mismatches mean, without listing them.
func (e *MismatchError) Summary() string {
	return fmt.Sprintf("%s: %d mismatches with checkpoint %s (--force to restore anyway)", ErrIncompatible, len(e.Mismatches), e.ID)
}

func (e *MismatchError) Unwrap() error { return ErrIncompatible }

// checkMachine compares this machine with what the checkpoint recorded.
// It returns the mismatches that refuse a restore (a mapped file missing
// or different, a mount missing or of another file system type) and
// those that are only warned about (another kernel or CRIU version: CRIU
// restores across them when the features it used are there; a mount from
// another source: device names differ between nodes; a file the tree
// mapped shared and writable that differs: the job writes it). Mounts of
// pseudo file systems are not compared.
func checkMachine(meta checkpoint.Meta, hasher *checkpoint.Hasher, criuVersion string) (refuse, warn []string) {
	if meta.Kernel != "" && meta.Kernel != checkpoint.KernelRelease() {
		warn = append(warn, fmt.Sprintf("kernel: the checkpoint was made on Linux %s, this machine runs %s", meta.Kernel, checkpoint.KernelRelease()))
	}
	if meta.CRIUVersion != "" && meta.CRIUVersion != criuVersion {
		warn = append(warn, fmt.Sprintf("CRIU: the checkpoint was made with CRIU %s, this is CRIU %s", meta.CRIUVersion, criuVersion))
	}
	paths := make([]string, len(meta.MappedFiles))
	for i, f := range meta.MappedFiles {
		paths[i] = f.Path
	}
	here := map[string]checkpoint.MappedFile{}
	for _, f := range hasher.Describe(paths) {
		here[f.Path] = f
	}
	for _, want := range meta.MappedFiles {
		got, ok := here[want.Path]
		if ok && want.SharedWritable && (got.Size != want.Size || want.SHA256 != "" && got.SHA256 != want.SHA256) {
			// The job writes it through its shared mapping as it runs.
			warn = append(warn, fmt.Sprintf("%s differs from the checkpoint's (%d bytes here, %d there); the tree mapped it shared and writable, so its own writes may be why", want.Path, got.Size, want.Size))
			continue
		}
		switch {
		case !ok:
			refuse = append(refuse, fmt.Sprintf("%s is missing (the tree ran or mapped it: %d bytes)", want.Path, want.Size))
		case got.Size != want.Size:
			refuse = append(refuse, fmt.Sprintf("%s differs: %d bytes here, %d in the checkpoint", want.Path, got.Size, want.Size))
		case want.SHA256 != "" && got.SHA256 == "":
			refuse = append(refuse, fmt.Sprintf("%s cannot be read to compare it with the checkpoint's", want.Path))
		case want.SHA256 != "" && got.SHA256 != want.SHA256:
			refuse = append(refuse, fmt.Sprintf("%s differs: SHA-256 %.12s... here, %.12s... in the checkpoint", want.Path, got.SHA256, want.SHA256))
		}
	}
	mounts := checkpoint.MountsHere()
	for _, want := range meta.Mounts {
		if checkpoint.PseudoFS(want.FSType) {
			continue // recorded by older versions: /dev of an open /dev/null
		}
		got, ok := checkpoint.MountAt(mounts, want.MountPoint)
		if !ok {
			refuse = append(refuse, fmt.Sprintf("mount %s (%s from %s) is not mounted here", want.MountPoint, want.FSType, want.Source))
			continue
		}
		// The files the tree uses there are compared one by one above;
		// the type alone (ext4 on a host, overlay in a container for /)
		// does not keep CRIU from reopening them.
		if got.FSType != want.FSType {
			warn = append(warn, fmt.Sprintf("mount %s is %s here, %s in the checkpoint", want.MountPoint, got.FSType, want.FSType))
		}
		if got.Source != want.Source {
			warn = append(warn, fmt.Sprintf("mount %s is mounted from %s here, from %s in the checkpoint", want.MountPoint, got.Source, want.Source))
		}
	}
	return refuse, warn
}
