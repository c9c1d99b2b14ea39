package doctor

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const driverVersionLine = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Thu Jan  1 00:00:00 UTC 2026\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"

func writeDriverVersion(t *testing.T, o Options, content string) {
	t.Helper()
	writeFile(t, filepath.Join(o.ProcRoot, "driver", "nvidia", "version"), content, 0o444)
}

// missingFromDetail extracts the list after "lacks " in an API check detail.
func missingFromDetail(t *testing.T, detail string) []string {
	t.Helper()
	_, rest, ok := strings.Cut(detail, " lacks ")
	if !ok {
		t.Fatalf("detail %q does not list missing functions", detail)
	}
	list, _, _ := strings.Cut(rest, ";")
	return strings.Split(list, ", ")
}

func TestLibcudaWithFullCheckpointAPI(t *testing.T) {
	o := hermeticOptions(t)
	// Install it the way drivers do: a versioned file and a soname link.
	real := filepath.Join(o.LibDirs[0], "libcuda.so.580.159.04")
	buildSharedLib(t, real, cFunctions(checkpointSymbols...))
	if err := os.Symlink(filepath.Base(real), filepath.Join(o.LibDirs[0], "libcuda.so.1")); err != nil {
		t.Fatal(err)
	}
	writeDriverVersion(t, o, driverVersionLine)
	checks := runChecks(t, o)

	lib := mustCheck(t, checks, "libcuda")
	wantStatus(t, lib, OK)
	wantDetail(t, lib, filepath.Join(o.LibDirs[0], "libcuda.so.1")+" -> "+real)

	api := mustCheck(t, checks, "cuda checkpoint api")
	wantStatus(t, api, OK)
	wantDetail(t, api, "all 6 cuCheckpointProcess* functions", real)
	backend := mustCheck(t, checks, "cuda checkpoint backend")
	wantStatus(t, backend, OK)
	wantDetail(t, backend, "libcuda's checkpoint API")

	driver := mustCheck(t, checks, "nvidia driver")
	wantStatus(t, driver, OK)
	wantDetail(t, driver, "kernel module 580.159.04", "matches libcuda")
}

func TestLibcudaWithPartialCheckpointAPI(t *testing.T) {
	o := hermeticOptions(t)
	// Restore is referenced but not defined: an undefined dynamic symbol
	// must not count as exported.
	source := cFunctions("cuInit", "cuCheckpointProcessGetState", "cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint") +
		"int cuCheckpointProcessRestore(void);\nint callsRestore(void) { return cuCheckpointProcessRestore(); }\n"
	buildSharedLib(t, filepath.Join(o.LibDirs[0], "libcuda.so.1"), source)
	checks := runChecks(t, o)

	wantStatus(t, mustCheck(t, checks, "libcuda"), OK)
	api := mustCheck(t, checks, "cuda checkpoint api")
	wantStatus(t, api, Warn)
	want := []string{"cuCheckpointProcessRestore", "cuCheckpointProcessUnlock", "cuCheckpointProcessGetRestoreThreadId"}
	if got := missingFromDetail(t, api.Detail); !reflect.DeepEqual(got, want) {
		t.Errorf("missing %v, want %v", got, want)
	}
	if !strings.Contains(api.Hint, "driver") || !strings.Contains(api.Hint, "cuda-checkpoint") {
		t.Errorf("hint %q", api.Hint)
	}

	// The library is there, the kernel driver's version file is not.
	driver := mustCheck(t, checks, "nvidia driver")
	wantStatus(t, driver, Warn)
	wantDetail(t, driver, "driver/nvidia/version is absent")
}

func TestLibcudaWithoutCheckpointAPI(t *testing.T) {
	o := hermeticOptions(t)
	buildSharedLib(t, filepath.Join(o.LibDirs[0], "libcuda.so.1"), cFunctions("cuInit"))
	t.Setenv("STASIS_CUDA_CHECKPOINT", "")
	t.Setenv("PATH", t.TempDir())
	checks := runChecks(t, o)
	api := mustCheck(t, checks, "cuda checkpoint api")
	wantStatus(t, api, Warn)
	if got := missingFromDetail(t, api.Detail); !reflect.DeepEqual(got, checkpointSymbols) {
		t.Errorf("missing %v, want all of %v", got, checkpointSymbols)
	}
	// No cuda-checkpoint either.
	backend := mustCheck(t, checks, "cuda checkpoint backend")
	wantStatus(t, backend, Missing)
	wantDetail(t, backend, "none: libcuda lacks the checkpoint API, and no cuda-checkpoint was found")
	for _, want := range []string{"570", "cuda-checkpoint", "$STASIS_CUDA_CHECKPOINT"} {
		if !strings.Contains(backend.Hint, want) {
			t.Errorf("hint %q lacks %q", backend.Hint, want)
		}
	}

	// cuda-checkpoint on PATH, one without --device-map, then one named by
	// $STASIS_CUDA_CHECKPOINT, with it.
	bin := t.TempDir()
	old := filepath.Join(bin, "cuda-checkpoint")
	writeFile(t, old, "#!/bin/sh\necho '--action lock|checkpoint|restore|unlock --pid <pid> [--timeout <ms>]'\n", 0o755)
	t.Setenv("PATH", bin)
	backend = mustCheck(t, runChecks(t, o), "cuda checkpoint backend")
	wantStatus(t, backend, Warn)
	wantDetail(t, backend, "cuda-checkpoint "+old+" (found through PATH), since libcuda lacks the checkpoint API; it has no --device-map")
	if !strings.Contains(backend.Hint, "onto other GPUs are refused") {
		t.Errorf("hint %q", backend.Hint)
	}
	named := filepath.Join(t.TempDir(), "cc")
	writeFile(t, named, "#!/bin/sh\necho '--device-map|-d <deviceUuids>'\n", 0o755)
	t.Setenv("STASIS_CUDA_CHECKPOINT", named)
	backend = mustCheck(t, runChecks(t, o), "cuda checkpoint backend")
	wantStatus(t, backend, OK)
	wantDetail(t, backend, "cuda-checkpoint "+named+" (found through $STASIS_CUDA_CHECKPOINT)", "restores onto other GPUs through --device-map")
}

func TestLibcudaAbsent(t *testing.T) {
	o := hermeticOptions(t)
	checks := runChecks(t, o)
	lib := mustCheck(t, checks, "libcuda")
	wantStatus(t, lib, Missing)
	if !strings.Contains(lib.Hint, "CPU processes and files still work") {
		t.Errorf("hint %q", lib.Hint)
	}
	if _, ok := checks["cuda checkpoint api"]; ok {
		t.Error("checkpoint API checked without libcuda")
	}
	if _, ok := checks["cuda checkpoint backend"]; ok {
		t.Error("checkpoint backend checked without libcuda")
	}
	wantStatus(t, mustCheck(t, checks, "nvidia driver"), Missing)
}

func TestLibcudaNotELF(t *testing.T) {
	o := hermeticOptions(t)
	writeFile(t, filepath.Join(o.LibDirs[0], "libcuda.so.1"), "not a library\n", 0o644)
	api := mustCheck(t, runChecks(t, o), "cuda checkpoint api")
	wantStatus(t, api, Warn)
	wantDetail(t, api, "cannot read the symbol table")
}

func TestLibDirsSearchedInOrder(t *testing.T) {
	o := hermeticOptions(t)
	first, second := t.TempDir(), t.TempDir()
	buildSharedLib(t, filepath.Join(second, "libcuda.so.1"), cFunctions(checkpointSymbols...))
	o.LibDirs = []string{first, second}
	lib := mustCheck(t, runChecks(t, o), "libcuda")
	wantStatus(t, lib, OK)
	wantDetail(t, lib, second)

	buildSharedLib(t, filepath.Join(first, "libcuda.so.1"), cFunctions("cuInit"))
	checks := runChecks(t, o)
	wantDetail(t, mustCheck(t, checks, "libcuda"), first)
	wantStatus(t, mustCheck(t, checks, "cuda checkpoint api"), Warn)
}

func TestNvidiaDriverVersions(t *testing.T) {
	tests := []struct {
		name, file, libVersion string
		status                 Status
		detail                 string
	}{
		{"proprietary", driverVersionLine, "580.159.04", OK, "kernel module 580.159.04, matches libcuda"},
		{"open module", "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U16)  Thu Sep 18 2025\n", "580.95.05", OK, "kernel module 580.95.05 (open), matches libcuda"},
		{"mismatch", driverVersionLine, "575.57.08", Warn, "kernel module 580.159.04; libcuda is 575.57.08"},
		{"garbage", "hello\n", "580.159.04", Warn, `unrecognised`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := hermeticOptions(t)
			real := filepath.Join(o.LibDirs[0], "libcuda.so."+tt.libVersion)
			buildSharedLib(t, real, cFunctions(checkpointSymbols...))
			if err := os.Symlink(filepath.Base(real), filepath.Join(o.LibDirs[0], "libcuda.so.1")); err != nil {
				t.Fatal(err)
			}
			writeDriverVersion(t, o, tt.file)
			c := mustCheck(t, runChecks(t, o), "nvidia driver")
			wantStatus(t, c, tt.status)
			wantDetail(t, c, tt.detail)
		})
	}
}
