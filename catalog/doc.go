// Package catalog owns the checkpoint store: its layout on disk, the
// manifest format, the commit protocol that makes a checkpoint complete, the
// integrity checks, the bbolt index over manifests, retention and garbage
// collection.
//
// The store is the truth and the index is derived from it. A checkpoint is
// complete exactly when its directory sits under checkpoints/ with a manifest
// whose own checksum holds; it gets there by one rename, after every data
// file and the manifest are durable. The index (catalog.db) lists what is
// complete and is rebuilt from the manifests by Rebuild. docs/format.md
// specifies all of it.
//
// Every operation opens the index for one short transaction and closes it,
// waiting at most Options.LockTimeout for the file lock, so the CLI and
// several training processes can share one store.
package catalog
