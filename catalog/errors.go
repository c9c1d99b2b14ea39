package catalog

import "errors"

// ErrNotFound is returned when no checkpoint matches an ID, prefix or job.
var ErrNotFound = errors.New("no such checkpoint")

// ErrAmbiguous is returned when an ID prefix matches more than one
// checkpoint.
var ErrAmbiguous = errors.New("ambiguous checkpoint ID prefix")

// ErrBusy is returned when the index stays locked by another process for
// longer than the lock timeout.
var ErrBusy = errors.New("catalog is locked by another process")

// ErrBadManifest is wrapped by errors about manifests that do not parse, fail
// their checksum or describe an impossible checkpoint.
var ErrBadManifest = errors.New("invalid manifest")

// ErrInvalid is wrapped by errors about arguments a caller can fix: job
// names, kinds, tags.
var ErrInvalid = errors.New("invalid argument")

// ErrExists is returned when a checkpoint to be imported has an ID that the
// store already holds (complete, being written or being removed).
var ErrExists = errors.New("checkpoint ID already taken")

// ErrBadStream is wrapped by errors about an import stream that is not a
// stasis export: not a tar stream, truncated, or holding what an export may
// not hold (links, absolute or climbing paths, sizes that disagree with the
// manifest). Checksum failures wrap gdswriter.ErrCorrupt or ErrBadManifest
// instead.
var ErrBadStream = errors.New("not a valid stasis export stream")

// ErrDamaged is wrapped by errors about a catalog (catalog.db) that bbolt
// cannot read: it does not open, a read panicked or faulted, it is shorter
// than its own meta page says, it lacks its buckets, or a record does not
// decode. The store moved it aside and rebuilt the catalog from the
// manifests before returning such an error; the message says so.
var ErrDamaged = errors.New("the catalog is damaged")

// ErrNewerFormat is returned for a checkpoint written in a format newer
// than this stasis reads (docs/format.md): nothing is wrong with it, and a
// newer stasis reads it.
var ErrNewerFormat = errors.New("checkpoint of a newer format")
