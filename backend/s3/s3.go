// Package s3 is the backend for S3-compatible object stores (AWS S3,
// MinIO, Ceph RGW, SeaweedFS, ...), on minio-go v7: a well-kept client of
// modest size that does multipart uploads, ranged GETs and AWS Signature
// V4 itself, so stasis signs no request by hand.
//
// Credentials come as every S3 tool takes them: AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN, else a profile of
// ~/.aws/credentials (AWS_SHARED_CREDENTIALS_FILE; the profile AWS_PROFILE
// or Config.Profile names, else "default"). They are never part of a
// Config, a Location or an error.
package s3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path"
	"strings"
	"syscall"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/minio/minio-go/v7/pkg/s3utils"
	"github.com/stasis-ckpt/stasis/backend"
)

// Config says where the objects go; nothing secret is in it.
type Config struct {
	// URL is s3://bucket/prefix, or s3+http://bucket/prefix to ask for
	// plain HTTP.
	URL string
	// Endpoint is the engine's address (https://host:port, or host:port),
	// used where neither AWS_ENDPOINT_URL_S3 nor AWS_ENDPOINT_URL is set
	// (the environment wins, as with every AWS tool); with none of them,
	// AWS S3 itself (s3.amazonaws.com).
	Endpoint string
	// Region, where neither AWS_REGION nor AWS_DEFAULT_REGION is set;
	// with none, us-east-1 for an endpoint of one's own (AWS S3: asked
	// of the bucket).
	Region string
	// Profile of ~/.aws/credentials, when AWS_PROFILE is not set.
	Profile string
	// Insecure allows plain HTTP (as the s3+http scheme does).
	Insecure bool
	// MaxRetries bounds minio-go's retries of one request (3 when 0).
	MaxRetries int
}

// Backend is a bucket and a key prefix on an S3 endpoint.
type Backend struct {
	client   *minio.Client
	bucket   string
	prefix   string // "" or ends in "/"
	location string
}

var _ backend.Backend = (*Backend)(nil)

// ParseURL splits s3://bucket/prefix (or s3+http://...) into its parts.
func ParseURL(raw string) (bucket, prefix string, plainHTTP bool, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", "", false, fmt.Errorf("%w: remote %q is not a URL", backend.ErrConfig, raw)
	}
	switch u.Scheme {
	case "s3":
	case "s3+http":
		plainHTTP = true
	default:
		return "", "", false, fmt.Errorf("%w: remote %q: use s3://bucket/prefix (or s3+http://bucket/prefix for plain HTTP)", backend.ErrConfig, raw)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", "", false, fmt.Errorf("%w: remote %s: give only s3://bucket/prefix (credentials come from the environment or ~/.aws/credentials)", backend.ErrConfig, u.Scheme+"://"+u.Host+u.Path)
	}
	bucket = u.Host
	if bucket == "" {
		return "", "", false, fmt.Errorf("%w: remote %q names no bucket", backend.ErrConfig, raw)
	}
	if err := s3utils.CheckValidBucketName(bucket); err != nil {
		return "", "", false, fmt.Errorf("%w: remote %q: %v", backend.ErrConfig, raw, err)
	}
	prefix = strings.Trim(u.Path, "/")
	if prefix != "" && (path.Clean(prefix) != prefix || strings.Contains("/"+prefix+"/", "/../")) {
		return "", "", false, fmt.Errorf("%w: remote %q: the prefix must be a clean path", backend.ErrConfig, raw)
	}
	return bucket, prefix, plainHTTP, nil
}

// Open connects to the remote cfg names. It sends no request: a missing
// bucket or refused credentials show at the first operation.
func Open(cfg Config) (*Backend, error) {
	bucket, prefix, plainHTTP, err := ParseURL(cfg.URL)
	if err != nil {
		return nil, err
	}
	insecure := plainHTTP || cfg.Insecure
	endpoint := firstOf(os.Getenv("AWS_ENDPOINT_URL_S3"), os.Getenv("AWS_ENDPOINT_URL"), cfg.Endpoint)
	own := endpoint != ""
	if !own {
		endpoint = "s3.amazonaws.com"
	}
	secure := !insecure
	host := endpoint
	if strings.Contains(endpoint, "://") {
		u, err := url.Parse(endpoint)
		if err != nil || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return nil, fmt.Errorf("%w: endpoint %q: give scheme://host[:port]", backend.ErrConfig, endpoint)
		}
		host = u.Host
		switch u.Scheme {
		case "https":
			secure = true
		case "http":
			if !insecure {
				return nil, fmt.Errorf("%w: endpoint %s is plain HTTP, which stasis uses only when asked: name the remote s3+http://%s/%s or set insecure = true in [s3] of config.toml", backend.ErrConfig, endpoint, bucket, prefix)
			}
			secure = false
		default:
			return nil, fmt.Errorf("%w: endpoint %q: use https:// (or http:// with s3+http://)", backend.ErrConfig, endpoint)
		}
	}
	region := firstOf(os.Getenv("AWS_REGION"), os.Getenv("AWS_DEFAULT_REGION"), cfg.Region)
	if region == "" && own {
		region = "us-east-1"
	}
	profile := firstOf(os.Getenv("AWS_PROFILE"), cfg.Profile)
	creds := credentials.NewChainCredentials([]credentials.Provider{
		&credentials.EnvAWS{},
		&credentials.FileAWSCredentials{Profile: profile},
	})
	retries := cfg.MaxRetries
	if retries <= 0 {
		retries = 3
	}
	client, err := minio.New(host, &minio.Options{Creds: creds, Secure: secure, Region: region, MaxRetries: retries})
	if err != nil {
		return nil, fmt.Errorf("%w: endpoint %s: %v", backend.ErrConfig, host, err)
	}
	scheme := "s3"
	if !secure {
		scheme = "s3+http"
	}
	b := &Backend{client: client, bucket: bucket, location: scheme + "://" + bucket}
	if prefix != "" {
		b.prefix = prefix + "/"
		b.location += "/" + prefix
	}
	return b, nil
}

func firstOf(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

// Location is s3://bucket/prefix (s3+http:// for plain HTTP).
func (b *Backend) Location() string { return b.location }

func (b *Backend) key(k string) string { return b.prefix + k }

// haveCredentials fails with ErrAuth when no provider found any.
func (b *Backend) haveCredentials() error {
	v, err := b.client.GetCreds()
	if err != nil || v.AccessKeyID == "" || v.SecretAccessKey == "" {
		return fmt.Errorf("%w: no S3 credentials found for %s: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile in ~/.aws/credentials (AWS_PROFILE)", backend.ErrAuth, b.location)
	}
	return nil
}

// Check fails with ErrNoBucket when the bucket does not exist (HEAD on
// the bucket), and as every operation does for refused credentials or an
// engine that does not answer.
func (b *Backend) Check(ctx context.Context) error {
	if err := b.haveCredentials(); err != nil {
		return err
	}
	ok, err := b.client.BucketExists(ctx, b.bucket)
	if err != nil {
		return b.wrap(err, "")
	}
	if !ok {
		return fmt.Errorf("%w: bucket %s does not exist on the endpoint %s: create it (or correct the remote's bucket)", backend.ErrNoBucket, b.bucket, b.client.EndpointURL().Host)
	}
	return nil
}

// Save stores an object; with ifAbsent, conditionally (If-None-Match: *)
// after a look (for engines that ignore the condition).
func (b *Backend) Save(ctx context.Context, key string, r io.Reader, size int64, meta map[string]string, ifAbsent bool) error {
	if err := b.haveCredentials(); err != nil {
		return err
	}
	// Parts of a larger object go up uploadThreads at a time, each read
	// into a buffer of its own first (uploadThreads x partSize of memory).
	opts := minio.PutObjectOptions{UserMetadata: meta, ContentType: "application/octet-stream", PartSize: partSize,
		NumThreads: uploadThreads, ConcurrentStreamParts: true}
	if ifAbsent {
		if _, err := b.Stat(ctx, key); err == nil {
			return fmt.Errorf("%w: %s/%s", backend.ErrExists, b.location, key)
		} else if !errors.Is(err, backend.ErrNotExist) {
			return err
		}
		opts.SetMatchETagExcept("*")
	}
	_, err := b.client.PutObject(ctx, b.bucket, b.key(key), r, size, opts)
	return b.wrap(err, key)
}

// partSize is what an upload is cut into: larger objects go as multipart
// uploads of parts this size.
const (
	partSize      = 16 << 20
	uploadThreads = 4
)

// Load reads a range of an object.
func (b *Backend) Load(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	if err := b.haveCredentials(); err != nil {
		return nil, err
	}
	var opts minio.GetObjectOptions
	if length >= 0 {
		if err := opts.SetRange(offset, offset+length-1); err != nil {
			return nil, err
		}
	} else if offset > 0 {
		if err := opts.SetRange(offset, 0); err != nil {
			return nil, err
		}
	}
	obj, err := b.client.GetObject(ctx, b.bucket, b.key(key), opts)
	if err != nil {
		return nil, b.wrap(err, key)
	}
	// GetObject sends its request at the first read: make it now, so
	// that a missing object fails here.
	if _, err := obj.Stat(); err != nil {
		obj.Close()
		return nil, b.wrap(err, key)
	}
	return &reader{obj: obj, b: b, key: key}, nil
}

type reader struct {
	obj *minio.Object
	b   *Backend
	key string
}

func (r *reader) Read(p []byte) (int, error) {
	n, err := r.obj.Read(p)
	if err != nil && err != io.EOF {
		err = r.b.wrap(err, r.key)
	}
	return n, err
}

func (r *reader) Close() error { return r.obj.Close() }

// Stat describes an object.
func (b *Backend) Stat(ctx context.Context, key string) (backend.Object, error) {
	if err := b.haveCredentials(); err != nil {
		return backend.Object{}, err
	}
	info, err := b.client.StatObject(ctx, b.bucket, b.key(key), minio.StatObjectOptions{})
	if err != nil {
		return backend.Object{}, b.wrap(err, key)
	}
	meta := map[string]string{}
	for k, v := range info.UserMetadata {
		meta[strings.ToLower(k)] = v
	}
	return backend.Object{Key: key, Size: info.Size, Modified: info.LastModified, Meta: meta}, nil
}

// List lists objects under a prefix.
func (b *Backend) List(ctx context.Context, prefix string, fn func(backend.Object) error) error {
	if err := b.haveCredentials(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for info := range b.client.ListObjects(ctx, b.bucket, minio.ListObjectsOptions{Prefix: b.key(prefix), Recursive: true}) {
		if info.Err != nil {
			return b.wrap(info.Err, prefix)
		}
		if err := fn(backend.Object{Key: strings.TrimPrefix(info.Key, b.prefix), Size: info.Size, Modified: info.LastModified}); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// Remove deletes an object.
func (b *Backend) Remove(ctx context.Context, key string) error {
	if err := b.haveCredentials(); err != nil {
		return err
	}
	err := b.wrap(b.client.RemoveObject(ctx, b.bucket, b.key(key), minio.RemoveObjectOptions{}), key)
	if errors.Is(err, backend.ErrNotExist) {
		return nil
	}
	return err
}

// Uploads lists the multipart uploads under prefix that were never
// completed nor aborted.
func (b *Backend) Uploads(ctx context.Context, prefix string) ([]backend.Upload, error) {
	if err := b.haveCredentials(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var out []backend.Upload
	for u := range b.client.ListIncompleteUploads(ctx, b.bucket, b.key(prefix), true) {
		if u.Err != nil {
			return nil, b.wrap(u.Err, prefix)
		}
		out = append(out, backend.Upload{Key: strings.TrimPrefix(u.Key, b.prefix), ID: u.UploadID, Initiated: u.Initiated})
	}
	return out, ctx.Err()
}

// AbortUpload aborts one multipart upload.
func (b *Backend) AbortUpload(ctx context.Context, u backend.Upload) error {
	if err := b.haveCredentials(); err != nil {
		return err
	}
	core := minio.Core{Client: b.client}
	err := b.wrap(core.AbortMultipartUpload(ctx, b.bucket, b.key(u.Key), u.ID), u.Key)
	if errors.Is(err, backend.ErrNotExist) {
		return nil
	}
	return err
}

// wrap turns minio-go's and the network's errors into one line wrapping
// a backend sentinel where one applies. minio-go's errors carry the
// engine's code and message, never a credential.
func (b *Backend) wrap(err error, key string) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	where := b.location
	if key != "" {
		where += "/" + key
	}
	resp := minio.ToErrorResponse(err)
	switch resp.Code {
	case "NoSuchKey", "NoSuchUpload":
		return fmt.Errorf("%w: %s", backend.ErrNotExist, where)
	case "NoSuchBucket":
		return fmt.Errorf("%w: %s does not exist on the endpoint %s: create it (or correct the remote's bucket)", backend.ErrNoBucket, "bucket "+b.bucket, b.client.EndpointURL().Host)
	case "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken", "TokenRefreshRequired", "InvalidSecurity", "AuthorizationHeaderMalformed":
		return fmt.Errorf("%w: %s: %s (%s): check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or the profile in ~/.aws/credentials", backend.ErrAuth, where, resp.Code, oneLine(resp.Message))
	case "PreconditionFailed":
		return fmt.Errorf("%w: %s", backend.ErrExists, where)
	}
	if resp.Code == "" && resp.StatusCode == 0 && unreachable(err) {
		return fmt.Errorf("%w: %s (endpoint %s): %s", backend.ErrUnreachable, where, b.client.EndpointURL().Host, oneLine(rootCause(err)))
	}
	if resp.StatusCode >= 500 {
		return engineFailed{fmt.Sprintf("the object store failed the request: %s: the engine answered %d %s (%s; an engine out of disk space answers so too): run the command again once it is mended",
			where, resp.StatusCode, resp.Code, oneLine(resp.Message))}
	}
	if resp.Code != "" {
		return fmt.Errorf("%s: %s (%s)", where, resp.Code, oneLine(resp.Message))
	}
	return fmt.Errorf("%s: %s", where, oneLine(err.Error()))
}

// engineFailed is an engine's 5xx answer: counted as ErrUnreachable (a
// retry later may work), said as what it is.
type engineFailed struct{ msg string }

func (e engineFailed) Error() string        { return e.msg }
func (e engineFailed) Is(target error) bool { return target == backend.ErrUnreachable }

// unreachable says whether err is the network failing: refused, reset,
// closed early, timed out, not resolved.
func unreachable(err error) bool {
	var ne net.Error
	var oe *net.OpError
	var de *net.DNSError
	var ue *url.Error
	return errors.As(err, &ne) || errors.As(err, &oe) || errors.As(err, &de) || errors.As(err, &ue) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
}

// rootCause is the innermost message of a network error (the dial's
// "connection refused" rather than the whole request line).
func rootCause(err error) string {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return oe.Op + ": " + oe.Err.Error()
	}
	for {
		u := errors.Unwrap(err)
		if u == nil {
			return err.Error()
		}
		err = u
	}
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
