package s3

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stasis-ckpt/stasis/backend"
	"github.com/stasis-ckpt/stasis/internal/s3test"
)

func clearAWS(t *testing.T) {
	for _, k := range []string{"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE",
		"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY", "AWS_SECRET_KEY"} {
		t.Setenv(k, "")
	}
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(t.TempDir(), "none"))
}

func TestParseURL(t *testing.T) {
	for _, c := range []struct {
		url, bucket, prefix string
		plain               bool
		bad                 string
	}{
		{url: "s3://ckpt/cluster-a/run1/", bucket: "ckpt", prefix: "cluster-a/run1"},
		{url: "s3://ckpt", bucket: "ckpt"},
		{url: "s3+http://ckpt/x", bucket: "ckpt", prefix: "x", plain: true},
		{url: "https://ckpt/x", bad: "use s3://"},
		{url: "s3:///x", bad: "names no bucket"},
		{url: "s3://b/x", bad: "shorter than 3"},
		{url: "s3://ckpt/a/../b", bad: "clean path"},
		{url: "s3://AKIAKEY:supersecret@ckpt/x", bad: "credentials come from"},
	} {
		bucket, prefix, plain, err := ParseURL(c.url)
		if c.bad != "" {
			if !errors.Is(err, backend.ErrConfig) || !strings.Contains(err.Error(), c.bad) || strings.Contains(err.Error(), "supersecret") {
				t.Errorf("%s: %v, want ErrConfig saying %q (and no secret)", c.url, err, c.bad)
			}
			continue
		}
		if err != nil || bucket != c.bucket || prefix != c.prefix || plain != c.plain {
			t.Errorf("%s: %q %q %v %v", c.url, bucket, prefix, plain, err)
		}
	}
}

// TestTLSUnlessAsked: an http:// endpoint is refused unless the remote
// asks for plain HTTP (s3+http://, or Insecure); TLS is the default.
func TestTLSUnlessAsked(t *testing.T) {
	clearAWS(t)
	if _, err := Open(Config{URL: "s3://bkt/p", Endpoint: "http://127.0.0.1:9"}); !errors.Is(err, backend.ErrConfig) || !strings.Contains(err.Error(), "plain HTTP") {
		t.Fatalf("an http endpoint for s3://: %v", err)
	}
	for _, cfg := range []Config{{URL: "s3+http://bkt/p", Endpoint: "http://127.0.0.1:9"}, {URL: "s3://bkt/p", Endpoint: "http://127.0.0.1:9", Insecure: true}} {
		b, err := Open(cfg)
		if err != nil || b.Location() != "s3+http://bkt/p" {
			t.Fatalf("%+v: %v", cfg, err)
		}
	}
	b, err := Open(Config{URL: "s3://bkt/p", Endpoint: "127.0.0.1:9"})
	if err != nil || b.Location() != "s3://bkt/p" || b.client.EndpointURL().Scheme != "https" {
		t.Fatalf("a bare endpoint: %v", err)
	}
	t.Setenv("AWS_ENDPOINT_URL", "https://env.example:443")
	if b, err := Open(Config{URL: "s3://bkt", Endpoint: "https://config.example"}); err != nil || b.client.EndpointURL().Host != "env.example:443" {
		t.Fatalf("AWS_ENDPOINT_URL does not win over the configuration: %v", err)
	}
}

// TestNoCredentials: with none anywhere, every operation fails with
// ErrAuth before a request is sent.
func TestNoCredentials(t *testing.T) {
	clearAWS(t)
	b, err := Open(Config{URL: "s3+http://bkt/p", Endpoint: "http://127.0.0.1:9"})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Check(context.Background()); !errors.Is(err, backend.ErrAuth) || !strings.Contains(err.Error(), "AWS_ACCESS_KEY_ID") {
		t.Fatalf("%v", err)
	}
}

// TestProfileCredentials: a profile of the shared credentials file, named
// by AWS_PROFILE or by the configuration, reaches a real engine.
func TestProfileCredentials(t *testing.T) {
	srv := s3test.Start(t)
	clearAWS(t)
	file := filepath.Join(t.TempDir(), "credentials")
	ini := "[default]\naws_access_key_id = wrong\naws_secret_access_key = wrong-secret\n\n[ckpt]\naws_access_key_id = " + s3test.AccessKey + "\naws_secret_access_key = " + s3test.SecretKey + "\n"
	if err := os.WriteFile(file, []byte(ini), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", file)
	ctx := context.Background()
	b, err := Open(Config{URL: srv.Remote("p"), Endpoint: srv.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Check(ctx); !errors.Is(err, backend.ErrAuth) || strings.Contains(err.Error(), "wrong-secret") {
		t.Fatalf("the default profile's wrong keys: %v", err)
	}
	b, err = Open(Config{URL: srv.Remote("p"), Endpoint: srv.Endpoint, Profile: "ckpt"})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Check(ctx); err != nil {
		t.Fatalf("profile ckpt from the configuration: %v", err)
	}
	t.Setenv("AWS_PROFILE", "ckpt")
	b, err = Open(Config{URL: srv.Remote("p"), Endpoint: srv.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Save(ctx, "k", strings.NewReader("x"), 1, nil, true); err != nil {
		t.Fatalf("profile ckpt from AWS_PROFILE: %v", err)
	}
	if err := b.Save(ctx, "k", strings.NewReader("y"), 1, nil, true); !errors.Is(err, backend.ErrExists) {
		t.Fatalf("a conditional save over an object: %v", err)
	}
}
