// Package cuda binds the CUDA driver (libcuda.so.1) at run time: the
// process checkpoint API (cuCheckpointProcess*), which moves a process's
// GPU state into its host memory and back, and the little else stasis needs
// (driver version, devices and their UUIDs). libcuda is opened with dlopen,
// never linked, so stasis builds and runs on machines without CUDA; there
// Load returns an error wrapping ErrUnavailable that says why. No other
// package knows a C symbol.
package cuda
