// Package backend is where checkpoints go beyond the local store: a small
// interface over a flat key space of write-once objects, after restic's
// backend design, and its implementations (backend/s3: S3-compatible
// object stores). The package knows nothing of checkpoints; the remote
// package lays them out on a backend and keeps the commit rule
// (docs/format.md, "Object stores").
//
// Every error a backend returns for a condition a user can act on wraps
// one of the sentinels below, and no error, log line or Location carries
// a credential.
package backend

import (
	"context"
	"errors"
	"io"
	"time"
)

// Backend stores objects under keys (slash-separated, relative to the
// backend's own prefix). An object appears whole or not at all: a Save
// that fails leaves no object under its key (on S3, at most an incomplete
// multipart upload, which Uploads lists).
type Backend interface {
	// Location names the backend for people (s3://bucket/prefix), never
	// with a credential.
	Location() string
	// Check asks the engine whether the bucket (or place) is there and
	// the credentials are taken, before anything is written: ErrNoBucket,
	// ErrAuth, ErrUnreachable. (Some engines, SeaweedFS among them,
	// create a bucket on the first PUT into it, where AWS S3 refuses.)
	Check(ctx context.Context) error
	// Save stores size bytes from r under key. With ifAbsent, it fails
	// with ErrExists when key already holds an object (where the engine
	// offers conditional writes; otherwise it checks first). meta is
	// stored with the object and comes back in Stat.
	Save(ctx context.Context, key string, r io.Reader, size int64, meta map[string]string, ifAbsent bool) error
	// Load reads length bytes of key from offset (length < 0: to the end).
	Load(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error)
	// Stat describes key, or fails with ErrNotExist.
	Stat(ctx context.Context, key string) (Object, error)
	// List calls fn for every object whose key starts with prefix.
	List(ctx context.Context, prefix string, fn func(Object) error) error
	// Remove deletes key; a key that does not exist is no error.
	Remove(ctx context.Context, key string) error
	// Uploads lists the unfinished uploads (S3 multipart uploads) under
	// prefix; AbortUpload ends one and frees what it holds.
	Uploads(ctx context.Context, prefix string) ([]Upload, error)
	AbortUpload(ctx context.Context, u Upload) error
}

// Object is one stored object.
type Object struct {
	Key      string
	Size     int64
	Modified time.Time
	Meta     map[string]string // only from Stat
}

// Upload is one unfinished upload.
type Upload struct {
	Key       string
	ID        string
	Initiated time.Time
}

// Errors a backend's operations wrap.
var (
	// ErrNotExist: no object under the key.
	ErrNotExist = errors.New("no such object")
	// ErrExists: a conditional Save found an object under its key.
	ErrExists = errors.New("the object exists")
	// ErrUnreachable: the engine did not answer (connection refused or
	// reset, a timeout, a name that does not resolve); a retry may work.
	ErrUnreachable = errors.New("the object store cannot be reached")
	// ErrAuth: the engine refused the credentials (unknown key, bad
	// signature, expired token, access denied), or there were none.
	ErrAuth = errors.New("the object store refused the credentials")
	// ErrNoBucket: the bucket does not exist.
	ErrNoBucket = errors.New("no such bucket")
	// ErrConfig: the remote's address or settings cannot be used as
	// given (a bad URL, plain HTTP not asked for).
	ErrConfig = errors.New("bad remote configuration")
)
