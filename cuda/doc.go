// Package cuda binds the CUDA driver (libcuda.so.1) at run time: the
// process checkpoint calls, which move a process's GPU state into its host
// memory and back, the memory calls of the tensor path, and the little else
// stasis needs (driver version, devices and their UUIDs). libcuda is opened
// with dlopen, never linked, so stasis builds and runs on machines without
// CUDA; there Load returns an error wrapping ErrUnavailable that says why.
// No other package knows a C symbol.
//
// cufile.go binds NVIDIA's cuFile (libcufile.so.0, also dlopened) for the
// tensor path's cuFile I/O, and kernel.go runs stasis's one GPU kernel,
// the CRC32C of kernels/crc32c.cu, embedded as PTX, which checksums GPU
// memory that cuFile moves without it passing through host memory.
//
// The process checkpoint calls have two backends behind one Driver:
// libcuda's checkpoint API (cuCheckpointProcess*, drivers 570 and later),
// and, where libcuda lacks it, NVIDIA's cuda-checkpoint binary (tool.go),
// found through $STASIS_CUDA_CHECKPOINT, beside the stasis binary, or on
// PATH. Driver.Backend says which and why; the callers do not care. The
// memory calls are libcuda's alone (LoadLibrary needs no backend).
package cuda
