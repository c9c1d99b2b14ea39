// Package cuda binds the CUDA driver (libcuda.so.1) at run time: the
// process checkpoint calls, which move a process's GPU state into its host
// memory and back, the memory calls of the tensor path, and the little else
// stasis needs (driver version, devices and their UUIDs). libcuda is opened
// with dlopen, never linked, so stasis builds and runs on machines without
// CUDA; there Load returns an error wrapping ErrUnavailable that says why.
// No other package knows a C symbol.
//
// The process checkpoint calls have two backends behind one Driver:
// libcuda's checkpoint API (cuCheckpointProcess*, drivers 570 and later),
// and, where libcuda lacks it, NVIDIA's cuda-checkpoint binary (tool.go),
// found through $STASIS_CUDA_CHECKPOINT, beside the stasis binary, or on
// PATH. Driver.Backend says which and why; the callers do not care. The
// memory calls are libcuda's alone (LoadLibrary needs no backend).
package cuda
