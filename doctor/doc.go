// Package doctor inspects a machine for what stasis needs to checkpoint and
// restore GPU training jobs: the kernel, CRIU, the CUDA driver's checkpoint
// API, cuFile/GPUDirect Storage and the checkpoint store. Every check reports
// only what it actually probed; anything it cannot determine is said to be
// unknown rather than guessed.
package doctor
