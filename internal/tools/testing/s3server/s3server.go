// Package s3server runs a real S3-compatible server for tests: versitygw with its posix
// backend, built once from source by hack/versitygw.sh.
//
// The posix backend keeps objects as files and, by default, their metadata (ETags,
// checksums, multipart state) in user extended attributes, refusing to start on a
// filesystem without them (tmpfs before Linux 6.6, some overlay and network filesystems).
// The server runs with --sidecar instead, which keeps that metadata in files in a second
// directory, so any writable filesystem works, whatever TMPDIR points at.
package s3server

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Server is a running versitygw.
type Server struct {
	// Endpoint is the server's URL: http://127.0.0.1:<port>, or https:// from StartTLS.
	Endpoint string
	// AccessKeyID and SecretAccessKey are the root account's credentials, generated for
	// this server.
	AccessKeyID, SecretAccessKey string
	// Region is the server's region.
	Region string
	// CAFile, for a server that StartTLS started, is the PEM file of the certificate
	// authority that signed the server's certificate.
	CAFile string

	bin, data, meta, iam, addr string
	logFile                    string
	certFile, keyFile          string
	client                     *http.Client // trusts CAFile

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

const healthPath = "/health"

// Start runs a versitygw on 127.0.0.1 with a free port, keeping its objects under
// t.TempDir(), and stops it when the test ends. It fails the test if the server cannot be
// built or started.
func Start(t testing.TB) *Server {
	t.Helper()
	return start(t, false)
}

// StartTLS is Start for a server that speaks HTTPS, with a certificate for 127.0.0.1 signed
// by a certificate authority generated for it (Server.CAFile).
func StartTLS(t testing.TB) *Server {
	t.Helper()
	return start(t, true)
}

func start(t testing.TB, secure bool) *Server {
	t.Helper()
	bin, err := binary()
	if err != nil {
		t.Fatalf("s3server: %v", err)
	}
	dir := t.TempDir()
	s := &Server{
		AccessKeyID:     randomString(20, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"),
		SecretAccessKey: randomString(40, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"),
		Region:          "us-east-1",
		bin:             bin,
		data:            filepath.Join(dir, "data"),
		meta:            filepath.Join(dir, "meta"),
		iam:             filepath.Join(dir, "iam"),
		logFile:         filepath.Join(dir, "versitygw.log"),
		client:          &http.Client{Timeout: time.Second},
	}
	scheme := "http"
	if secure {
		scheme = "https"
		s.CAFile = filepath.Join(dir, "ca.pem")
		s.certFile = filepath.Join(dir, "cert.pem")
		s.keyFile = filepath.Join(dir, "key.pem")
		pool, err := writeCertificates(s.CAFile, s.certFile, s.keyFile)
		if err != nil {
			t.Fatalf("s3server: generating certificates: %v", err)
		}
		s.client.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	}
	for _, d := range []string{s.data, s.meta, s.iam} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatalf("s3server: %v", err)
		}
	}
	// Another process may take the free port before versitygw binds it: then try another.
	for attempt := 1; ; attempt++ {
		addr, err := freeAddr()
		if err != nil {
			t.Fatalf("s3server: finding a free port: %v", err)
		}
		s.addr = addr
		s.Endpoint = scheme + "://" + addr
		err = s.start()
		if err == nil {
			break
		}
		if attempt == 3 {
			t.Fatalf("s3server: %v", err)
		}
	}
	t.Cleanup(s.Stop)
	return s
}

// binary returns the path of versitygw, which hack/versitygw.sh builds once.
func binary() (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("bash", filepath.Join(root, "hack", "versitygw.sh"))
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building versitygw with hack/versitygw.sh: %w", err)
	}
	bin := strings.TrimSpace(out.String())
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("hack/versitygw.sh printed %q, which is not a file: %w", bin, err)
	}
	return bin, nil
}

// repoRoot walks up from the working directory to the directory holding go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod in the working directory or above it")
		}
		dir = parent
	}
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func randomString(n int, alphabet string) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// start runs versitygw and waits until it answers.
func (s *Server) start() error {
	logf, err := os.OpenFile(s.logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	args := []string{
		"--port", s.addr,
		"--region", s.Region,
		"--health", healthPath,
		// With an IAM service, as without, the root account is the one given here; but an
		// unknown access key is then refused with InvalidAccessKeyId, as S3 does, rather
		// than the single-account mode's XAdminUserNotFound, and CreateUser works.
		"--iam-dir", s.iam,
		"--quiet",
	}
	if s.certFile != "" {
		args = append(args, "--cert", s.certFile, "--key", s.keyFile)
	}
	args = append(args, "posix", "--sidecar", s.meta, s.data)
	cmd := exec.Command(s.bin, args...)
	// The credentials go in the environment, not on the command line other processes see.
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY="+s.AccessKeyID, "ROOT_SECRET_KEY="+s.SecretAccessKey)
	cmd.Stdout = logf
	cmd.Stderr = logf
	setProcAttr(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", s.bin, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()

	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-done:
			return fmt.Errorf("versitygw exited (%v) before answering on %s; its output:\n%s", cmd.ProcessState, s.addr, s.log())
		default:
		}
		resp, err := s.client.Get(s.Endpoint + healthPath)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			s.Stop()
			return fmt.Errorf("versitygw did not answer on %s within 30s (last: %v); its output:\n%s", s.addr, err, s.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *Server) log() string {
	b, _ := os.ReadFile(s.logFile)
	return string(b)
}

// Stop stops the server, if it runs, and waits for it to exit; the objects stay. Restart
// starts it again.
func (s *Server) Stop() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd, s.done = nil, nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(os.Interrupt)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Restart stops the server, if it runs, and starts it again with the same directory, port
// and credentials.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	if err := s.start(); err != nil {
		t.Fatalf("s3server: restarting: %v", err)
	}
}

// CreateUser adds an account with the role "user": it may create buckets of its own, but
// has no access to the root account's buckets.
func (s *Server) CreateUser(t testing.TB, accessKeyID, secretAccessKey string) {
	t.Helper()
	cmd := exec.Command(s.bin, "admin", "--endpoint-url", s.Endpoint, "--region", s.Region, "--allow-insecure",
		"create-user", "--access", accessKeyID, "--secret", secretAccessKey, "--role", "user")
	cmd.Env = append(os.Environ(), "ADMIN_ACCESS_KEY="+s.AccessKeyID, "ADMIN_SECRET_KEY="+s.SecretAccessKey)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("s3server: creating user %s: %v\n%s", accessKeyID, err, out)
	}
}

// Client returns a minio-go client for the server, with the root credentials.
func (s *Server) Client(t testing.TB) *minio.Client {
	t.Helper()
	c, err := minio.New(s.addr, &minio.Options{
		Creds:        credentials.NewStaticV4(s.AccessKeyID, s.SecretAccessKey, ""),
		Secure:       s.CAFile != "",
		Transport:    s.client.Transport,
		Region:       s.Region,
		BucketLookup: minio.BucketLookupPath,
	})
	if err != nil {
		t.Fatalf("s3server: %v", err)
	}
	return c
}

// CreateBucket creates a bucket.
func (s *Server) CreateBucket(t testing.TB, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Client(t).MakeBucket(ctx, name, minio.MakeBucketOptions{Region: s.Region}); err != nil {
		t.Fatalf("s3server: creating bucket %s: %v", name, err)
	}
}
