package store

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/minio/minio-go/v7/pkg/s3utils"
)

const (
	// partSize is the size of the parts in which Put uploads an object larger than one
	// part; each Put holds at most 1 + uploadStreams buffers of about this size (what it
	// reads ahead to choose between one PUT request and a multipart upload, and the
	// parts being read and sent). S3 allows at most 10000 parts, so the largest object Put can store
	// is 10000 × 16 MiB = 156.25 GiB; Put fails, rather than store a truncated object, on
	// a larger one. (Base backups are stored in volumes well below it.)
	partSize = 16 << 20
	// uploadStreams is how many parts of one object are uploaded at once. Two let the
	// next part be read (compressed, from pg_basebackup) while the last one is sent;
	// one alone stopped the reader during every part's upload.
	uploadStreams = 2
	// maxParts is S3's limit on the parts of a multipart upload.
	maxParts = 10000
	// maxObjectSize is the largest object Put can store.
	maxObjectSize = partSize * maxParts

	defaultRegion = "us-east-1"
)

// s3Store keeps each object under key "a/b" as the S3 object <prefix>/a/b in its bucket.
type s3Store struct {
	client   *minio.Client
	endpoint string // scheme://host:port, for messages
	bucket   string
	region   string
	prefix   string // "" or "path/" (with the slash)
}

func newS3(cfg S3Config, prefix string) (*s3Store, error) {
	if strings.Contains(cfg.Endpoint, "@") {
		// Not repeated: it may hold a password, as in http://user:password@host.
		return nil, errors.New("S3 endpoint: must not hold credentials (user:password@): they belong in the credentials Secret")
	}
	u, err := url.Parse(cfg.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("S3 endpoint %q: must be http://host[:port] or https://host[:port]", cfg.Endpoint)
	}
	if strings.Trim(u.Path, "/") != "" || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("S3 endpoint %q: must have no path or query: give the bucket as the bucket and any path in it as the prefix", cfg.Endpoint)
	}
	if cfg.Bucket == "" {
		return nil, errors.New("S3 bucket: required")
	}
	if err := s3utils.CheckValidBucketName(cfg.Bucket); err != nil {
		return nil, fmt.Errorf("S3 bucket %q: %w", cfg.Bucket, err)
	}
	if cfg.AccessKeyID == "" || cfg.SecretAccessKey == "" {
		return nil, errors.New("S3 credentials: both an access key ID and a secret access key are required")
	}
	region := cfg.Region
	if region == "" {
		region = defaultRegion
	}
	secure := u.Scheme == "https"
	transport, err := minio.DefaultTransport(secure)
	if err != nil {
		return nil, err
	}
	if secure {
		if transport.TLSClientConfig == nil {
			transport.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		transport.TLSClientConfig.InsecureSkipVerify = cfg.InsecureSkipVerify
		if cfg.CAFile != "" {
			pool, err := caPool(cfg.CAFile)
			if err != nil {
				return nil, err
			}
			transport.TLSClientConfig.RootCAs = pool
		}
	}
	client, err := minio.New(u.Host, &minio.Options{
		Creds:  credentials.NewStaticV4(cfg.AccessKeyID, cfg.SecretAccessKey, ""),
		Secure: secure,
		Region: region,
		// Path-style requests (host/bucket/key) work with any endpoint; virtual-host style
		// needs a DNS name per bucket.
		BucketLookup: minio.BucketLookupPath,
		Transport:    transport,
	})
	if err != nil {
		return nil, fmt.Errorf("S3 endpoint %q: %w", cfg.Endpoint, err)
	}
	if prefix != "" {
		prefix += "/"
	}
	return &s3Store{
		client:   client,
		endpoint: u.Scheme + "://" + u.Host,
		bucket:   cfg.Bucket,
		region:   region,
		prefix:   prefix,
	}, nil
}

// caPool is the system's roots plus the certificates in file.
func caPool(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("S3 CA bundle: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("S3 CA bundle %s: holds no PEM certificate", file)
	}
	return pool, nil
}

func (s *s3Store) String() string {
	return strings.TrimSuffix("s3://"+s.bucket+"/"+s.prefix, "/")
}

// url names key's object, for messages.
func (s *s3Store) url(key string) string {
	return "s3://" + s.bucket + "/" + s.prefix + key
}

func (s *s3Store) Put(ctx context.Context, key string, r io.Reader) error {
	if err := checkKey(key); err != nil {
		return fmt.Errorf("put %s: %w", s, err)
	}
	src := &sourceReader{ctx: ctx, r: r}
	err := s.put(ctx, s.prefix+key, src)
	if src.err != nil {
		return readError(s.String(), key, src.err)
	}
	if err != nil {
		return s.error(ctx, "put", key, err)
	}
	return nil
}

func (s *s3Store) put(ctx context.Context, name string, src io.Reader) error {
	// An object that fits in one part goes up in one PUT request (WAL segments are 16 MiB).
	head, err := io.ReadAll(io.LimitReader(src, partSize+1))
	if err != nil {
		return err
	}
	if len(head) <= partSize {
		_, err := s.client.PutObject(ctx, s.bucket, name, bytes.NewReader(head), int64(len(head)),
			minio.PutObjectOptions{ContentType: "application/octet-stream"})
		return err
	}
	// A larger one goes up as a multipart upload, whose completion makes it visible at
	// once.
	return s.putMultipart(ctx, name, &sizeGuard{r: io.MultiReader(bytes.NewReader(head), src), left: maxObjectSize})
}

// putMultipart uploads body as name in parts of partSize, uploadStreams at a time, each
// read into a buffer of its own while the others are sent. On any failure it waits for
// every part request to end before it aborts the upload: a part the server was still
// writing after an abort brought the upload back, invisible but billed (minio-go's own
// parallel path cancels its part requests and aborts at once, and left uploads behind in
// TestStore).
func (s *s3Store) putMultipart(ctx context.Context, name string, body io.Reader) error {
	core := minio.Core{Client: s.client}
	opts := minio.PutObjectOptions{ContentType: "application/octet-stream"}
	uploadID, err := core.NewMultipartUpload(ctx, s.bucket, name, opts)
	if err != nil {
		return err
	}
	var (
		mu       sync.Mutex
		parts    []minio.CompletePart
		firstErr error
		wg       sync.WaitGroup
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if firstErr == nil {
			firstErr = err
		}
	}
	failed := func() error {
		mu.Lock()
		defer mu.Unlock()
		return firstErr
	}
	free := make(chan []byte, uploadStreams)
	for range uploadStreams {
		free <- make([]byte, partSize)
	}
	for number := 1; failed() == nil; number++ {
		buf := <-free
		if failed() != nil {
			break
		}
		n, rerr := io.ReadFull(body, buf)
		if n > 0 {
			wg.Add(1)
			go func(number int, data []byte) {
				defer wg.Done()
				part, err := core.PutObjectPart(ctx, s.bucket, name, uploadID, number, bytes.NewReader(data), int64(len(data)), minio.PutObjectPartOptions{})
				if err != nil {
					fail(err)
				} else {
					mu.Lock()
					parts = append(parts, minio.CompletePart{PartNumber: number, ETag: part.ETag})
					mu.Unlock()
				}
				free <- data[:cap(data)]
			}(number, buf[:n])
		} else {
			free <- buf
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			fail(rerr)
		}
	}
	wg.Wait()
	if err := failed(); err == nil {
		sort.Slice(parts, func(i, j int) bool { return parts[i].PartNumber < parts[j].PartNumber })
		if _, err = core.CompleteMultipartUpload(ctx, s.bucket, name, uploadID, parts, opts); err == nil {
			return nil
		}
		fail(err)
	}
	// Every part request has ended: abort with a context of its own (ctx may be the
	// reason for the failure), and again while the upload is still listed.
	cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	_ = core.AbortMultipartUpload(cleanup, s.bucket, name, uploadID)
	s.abortUpload(cleanup, name)
	return failed()
}

// abortUpload aborts the incomplete multipart uploads of name until none is listed: S3
// advises checking that no part is left after an abort, as a part still being written
// (a request cancelled by ctx) can bring the upload back.
func (s *s3Store) abortUpload(ctx context.Context, name string) {
	for wait := 100 * time.Millisecond; ; wait *= 2 {
		_ = s.client.RemoveIncompleteUpload(ctx, s.bucket, name)
		left := false
		for u := range s.client.ListIncompleteUploads(ctx, s.bucket, name, false) {
			if u.Err == nil && u.Key == name {
				left = true
			}
		}
		if !left {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// errTooLarge is the error of a Put whose object exceeds maxObjectSize.
var errTooLarge = fmt.Errorf("the object is larger than %d bytes (%d parts of %d bytes), the most one upload can hold", int64(maxObjectSize), maxParts, partSize)

// sizeGuard fails once its reader holds more than left bytes. minio-go stops reading after
// the last part S3 allows and completes the upload with what it has read, so without this a
// larger object would be stored truncated.
type sizeGuard struct {
	r    io.Reader
	left int64
}

func (g *sizeGuard) Read(p []byte) (int, error) {
	if g.left == 0 {
		return 0, g.probe()
	}
	if int64(len(p)) > g.left {
		p = p[:g.left]
	}
	n, err := g.r.Read(p)
	g.left -= int64(n)
	if g.left == 0 && err == nil {
		// The read that completes the last part: find out now, before that part is
		// uploaded and the upload completed, whether more follows. The error comes without
		// the data, as minio-go drops an error that comes with the data filling its buffer.
		if err := g.probe(); !errors.Is(err, io.EOF) {
			return 0, err
		}
		return n, io.EOF
	}
	return n, err
}

// probe returns io.EOF if the reader is at its end, errTooLarge if it is not.
func (g *sizeGuard) probe() error {
	var b [1]byte
	n, err := io.ReadFull(g.r, b[:])
	if n > 0 {
		return errTooLarge
	}
	return err
}

func (s *s3Store) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := checkKey(key); err != nil {
		return nil, fmt.Errorf("get %s: %w", s, err)
	}
	obj, err := s.client.GetObject(ctx, s.bucket, s.prefix+key, minio.GetObjectOptions{})
	if err != nil {
		return nil, s.error(ctx, "get", key, err)
	}
	// GetObject sends no request until the object is first read or described: describe it
	// now (with a HEAD request), so that a missing object or a refusal shows here rather
	// than in the first Read.
	if _, err := obj.Stat(); err != nil {
		_ = obj.Close()
		return nil, s.error(ctx, "get", key, s.headError(ctx, key, err))
	}
	return obj, nil
}

func (s *s3Store) Stat(ctx context.Context, key string) (Object, error) {
	if err := checkKey(key); err != nil {
		return Object{}, fmt.Errorf("stat %s: %w", s, err)
	}
	info, err := s.client.StatObject(ctx, s.bucket, s.prefix+key, minio.StatObjectOptions{})
	if err != nil {
		return Object{}, s.error(ctx, "stat", key, s.headError(ctx, key, err))
	}
	return Object{Key: key, Size: info.Size, Modified: info.LastModified}, nil
}

// headError refines err, the failure of a HEAD request for key. Its answer has no body, so
// it cannot say whether the object or the bucket is missing, nor whether the credentials
// are wrong or merely not allowed to read: the answer to a listing next to key, which has a
// body, tells.
func (s *s3Store) headError(ctx context.Context, key string, err error) error {
	if minio.ToErrorResponse(err).StatusCode == 0 {
		return err // not an answer from the store
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the listing after its first page
	if obj, ok := <-s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix + key, MaxKeys: 1}); ok && obj.Err != nil {
		return obj.Err
	}
	return err
}

func (s *s3Store) List(ctx context.Context, prefix string) ([]Object, error) {
	if err := checkListPrefix(prefix); err != nil {
		return nil, fmt.Errorf("list %s: %w", s, err)
	}
	lctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the listing if it ends early
	var objects []Object
	for obj := range s.client.ListObjects(lctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix + prefix, Recursive: true}) {
		if obj.Err != nil {
			return nil, s.error(ctx, "list", prefix+"*", obj.Err)
		}
		key := strings.TrimPrefix(obj.Key, s.prefix)
		if strings.HasSuffix(key, "/") {
			continue // a "directory" placeholder some tools create
		}
		objects = append(objects, Object{Key: key, Size: obj.Size, Modified: obj.LastModified})
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("list %s: %w", s.url(prefix+"*"), err)
	}
	sort.Slice(objects, func(i, j int) bool { return objects[i].Key < objects[j].Key })
	return objects, nil
}

func (s *s3Store) Delete(ctx context.Context, keys ...string) error {
	for _, key := range keys {
		if err := checkKey(key); err != nil {
			return fmt.Errorf("delete %s: %w", s, err)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	// RemoveObjects deletes up to 1000 objects per request.
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	names := make(chan minio.ObjectInfo)
	go func() {
		defer close(names)
		for _, key := range keys {
			select {
			case names <- minio.ObjectInfo{Key: s.prefix + key}:
			case <-rctx.Done():
				return
			}
		}
	}()
	var first error
	var firstKey string
	for res := range s.client.RemoveObjects(rctx, s.bucket, names, minio.RemoveObjectsOptions{}) {
		// S3 deletes a missing key successfully; a few implementations say NoSuchKey.
		if res.Err != nil && first == nil && minio.ToErrorResponse(res.Err).Code != "NoSuchKey" {
			first, firstKey = res.Err, strings.TrimPrefix(res.ObjectName, s.prefix)
			cancel() // stop sending keys; the rest of the results are drained
		}
	}
	if first != nil {
		return s.error(ctx, "delete", firstKey, first)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("delete %s: %w", s, err)
	}
	return nil
}
