// Package s3test runs a real S3 engine for tests: SeaweedFS's `weed
// server` with its S3 gateway, on loopback ports of its own, in a
// temporary directory, with one identity and a bucket. Nothing is
// mocked. Tests that need it skip, saying why, only where no weed binary
// can be found (scripts/install-seaweedfs.sh builds one; `make` runs it).
package s3test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Version is the SeaweedFS module version scripts/install-seaweedfs.sh
// builds (keep the two equal).
const Version = "v0.0.0-20261109003541-7506e5f91cd6"

// Credentials the server accepts (a test identity, not a secret).
const (
	AccessKey = "stasis-test-access"
	SecretKey = "stasis-test-secret-0123456789abcdefghij"
)

// Weed finds the weed binary: $STASIS_WEED, the cache the install script
// builds into, then PATH.
func Weed() (string, error) {
	if p := os.Getenv("STASIS_WEED"); p != "" {
		return p, nil
	}
	var caches []string
	if c := os.Getenv("STASIS_WEED_CACHE"); c != "" {
		caches = append(caches, c)
	}
	caches = append(caches, "/var/cache/stasis")
	if home, err := os.UserHomeDir(); err == nil {
		caches = append(caches, filepath.Join(home, ".cache", "stasis"))
	}
	for _, c := range caches {
		p := filepath.Join(c, "seaweedfs-"+Version, "weed")
		if st, err := os.Stat(p); err == nil && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	if p, err := exec.LookPath("weed"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("no SeaweedFS weed binary (looked at $STASIS_WEED, /var/cache/stasis/seaweedfs-%s/weed, ~/.cache/stasis and PATH): run scripts/install-seaweedfs.sh (make does)", Version)
}

// Server is one running weed server.
type Server struct {
	Dir      string // its data
	Endpoint string // http://127.0.0.1:PORT, the S3 gateway
	Bucket   string // created at start
	// Args are added to weed server's command line at each (re)start.
	Args []string

	t     testing.TB
	weed  string
	ports map[string]int
	cmd   *exec.Cmd
	done  chan struct{}
	log   string
}

// Start starts a weed server with an S3 gateway (args added to its
// command line) and creates a bucket; the test's cleanup stops it. It
// skips the test where weed is missing.
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	weed, err := Weed()
	if err != nil {
		t.Skip(err.Error())
	}
	s := &Server{t: t, weed: weed, Dir: t.TempDir(), Bucket: "stasis-test", Args: args, ports: map[string]int{}}
	for _, name := range []string{"master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "s3", "s3.grpc", "debug"} {
		s.ports[name] = freePort(t)
	}
	s.Endpoint = "http://127.0.0.1:" + strconv.Itoa(s.ports["s3"])
	config := fmt.Sprintf(`{"identities":[{"name":"stasis","credentials":[{"accessKey":%q,"secretKey":%q}],"actions":["Admin","Read","List","Tagging","Write"]}]}`, AccessKey, SecretKey)
	if err := os.WriteFile(filepath.Join(s.Dir, "s3.json"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	s.Restart()
	c := s.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for {
		err := c.MakeBucket(ctx, s.Bucket, minio.MakeBucketOptions{})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("weed's S3 gateway did not take a bucket within 2 minutes: %v\n%s", err, s.LogTail())
		}
		time.Sleep(200 * time.Millisecond)
	}
	return s
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Restart starts the server (again, after Kill) on the same directory
// and ports, and waits until its S3 gateway answers a listing of the
// bucket (or, before the bucket exists, of the buckets).
func (s *Server) Restart() {
	s.t.Helper()
	if s.cmd != nil {
		s.t.Fatal("s3test: Restart while the server runs")
	}
	p := func(name string) string { return strconv.Itoa(s.ports[name]) }
	args := []string{"server", "-dir=" + filepath.Join(s.Dir, "data"), "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
		"-master.port=" + p("master"), "-master.port.grpc=" + p("master.grpc"), "-master.telemetry=false",
		"-master.volumeSizeLimitMB=1024",
		"-volume.port=" + p("volume"), "-volume.port.grpc=" + p("volume.grpc"),
		"-filer", "-filer.port=" + p("filer"), "-filer.port.grpc=" + p("filer.grpc"),
		"-s3", "-s3.port=" + p("s3"), "-s3.port.grpc=" + p("s3.grpc"), "-s3.config=" + filepath.Join(s.Dir, "s3.json"),
		"-s3.port.iceberg=0", "-s3.port.lance=0", "-debug.port=" + p("debug"),
	}
	args = append(args, s.Args...)
	if err := os.MkdirAll(filepath.Join(s.Dir, "data"), 0o700); err != nil {
		s.t.Fatal(err)
	}
	s.log = filepath.Join(s.Dir, "weed.log")
	logf, err := os.OpenFile(s.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		s.t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(s.weed, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start weed: %v", err)
	}
	s.cmd, s.done = cmd, make(chan struct{})
	go func(done chan struct{}) { cmd.Wait(); close(done) }(s.done)
	c := s.Client()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.ListBuckets(ctx)
		if err == nil {
			_, err = c.BucketExists(ctx, s.Bucket)
		}
		cancel()
		if err == nil {
			return
		}
		select {
		case <-s.done:
			s.cmd = nil
			s.t.Fatalf("weed server exited at start:\n%s", s.LogTail())
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("weed's S3 gateway did not answer within 2 minutes: %v\n%s", err, s.LogTail())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Kill ends the server at once (SIGKILL to its process group), as a
// crash or a power cut would.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.done
	s.cmd = nil
}

// Stop ends the server (the test's cleanup calls it).
func (s *Server) Stop() { s.Kill() }

// Client is a minio-go client of the server, as the test identity.
func (s *Server) Client() *minio.Client {
	c, err := minio.New(strings.TrimPrefix(s.Endpoint, "http://"), &minio.Options{
		Creds: credentials.NewStaticV4(AccessKey, SecretKey, ""), Region: "us-east-1", MaxRetries: 1,
	})
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

// Env is the environment a stasis process needs to reach the server as
// the test identity (with plain HTTP: the remote must be s3+http://).
func (s *Server) Env() []string {
	return []string{
		"AWS_ENDPOINT_URL=" + s.Endpoint,
		"AWS_ACCESS_KEY_ID=" + AccessKey,
		"AWS_SECRET_ACCESS_KEY=" + SecretKey,
		"AWS_REGION=us-east-1",
	}
}

// Remote is the remote URL of prefix in the server's bucket.
func (s *Server) Remote(prefix string) string {
	return "s3+http://" + s.Bucket + "/" + prefix
}

// LogTail is the end of the server's log, for failure messages.
func (s *Server) LogTail() string {
	b, _ := os.ReadFile(s.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}
