// Package gdswriter moves checkpoint bytes between memory and data files.
//
// A data file holds one logical byte stream cut into chunks of a fixed raw
// size (a few MiB). Every chunk is encoded on its own (raw, zstd, s2, or byte
// planes with entropy coding; see codec.go and docs/codecs.md), written at a
// 4096-byte aligned offset, padded with zeros to the next 4096 bytes, and
// described by a Chunk: where it lies, how long it is before and after
// decoding, its codec, and CRC32C checksums of the stored extent and of the
// decoded bytes. Chunks are independent, so several goroutines encode and
// write them at once (Writer) and read, verify and decode them at once
// (Reader).
//
// Files are opened with O_DIRECT where the file system allows it and with
// plain I/O where it does not (tmpfs, some network file systems); the choice
// is made per file and reported, never silently assumed.
//
// A caller with device memory and a library that moves it to and from
// files directly (cuFile) plugs it in as a DeviceIO (device.go): whole raw
// chunks then go straight between device memory and the file, checksummed
// where the bytes are, and the rest through host memory as usual.
//
// The package knows nothing of manifests, catalogs or processes: callers
// record the returned chunk tables.
package gdswriter
