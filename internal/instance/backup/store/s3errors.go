package store

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"syscall"

	"github.com/minio/minio-go/v7"
)

// error turns err, from op on key, into an error that says what went wrong in terms an
// operator can act on. It never includes a credential.
func (s *s3Store) error(ctx context.Context, op, key string, err error) error {
	where := s.url(key)
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return fmt.Errorf("%s %s: %w", op, where, err)
	}
	return fmt.Errorf("%s %s: %w", op, where, s.explain(op, err))
}

func (s *s3Store) explain(op string, err error) error {
	var resp minio.ErrorResponse
	if errors.As(err, &resp) && resp.Code != "" {
		return s.explainResponse(op, resp)
	}
	var certErr *tls.CertificateVerificationError
	var recordErr tls.RecordHeaderError
	switch {
	case errors.As(err, &certErr):
		return fmt.Errorf("cannot verify the TLS certificate of the S3 endpoint %s: %v: trust the certificate authority that signed it (CA bundle), or correct the endpoint's host name", s.endpoint, certErr.Err)
	case errors.As(err, &recordErr) || strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		return fmt.Errorf("the S3 endpoint %s does not speak TLS: use an http:// endpoint", s.endpoint)
	}
	var urlErr *url.Error
	if !errors.As(err, &urlErr) {
		var netErr net.Error
		if !errors.As(err, &netErr) {
			return err
		}
	}
	// A failure to send the request or to read the answer.
	cause := err
	if urlErr != nil {
		cause = urlErr.Err // without the request's URL
	}
	var dnsErr *net.DNSError
	var netErr net.Error
	hint := ""
	switch {
	case errors.As(err, &dnsErr):
		hint = "; check the endpoint's host name"
	case errors.Is(err, syscall.ECONNREFUSED):
		hint = "; check the endpoint's host and port, and that the S3 service is up"
	case errors.As(err, &netErr) && netErr.Timeout():
		hint = "; check the endpoint, and the network policies and firewalls on the way"
	}
	return fmt.Errorf("cannot reach the S3 endpoint %s: %w%s", s.endpoint, cause, hint)
}

func (s *s3Store) explainResponse(op string, resp minio.ErrorResponse) error {
	switch resp.Code {
	case "NoSuchKey":
		return ErrNotFound
	case "NoSuchBucket":
		return fmt.Errorf("bucket %s does not exist at %s: create it, or correct the bucket's name", s.bucket, s.endpoint)
	case "InvalidAccessKeyId", "SignatureDoesNotMatch":
		return fmt.Errorf("the S3 store refused the credentials (%s): check the credentials Secret", resp.Code)
	case "AccessDenied", "AllAccessDisabled":
		return fmt.Errorf("the S3 store denied access (%s): the credentials need permission for %s on %s", resp.Code, action(op), s)
	case "AuthorizationHeaderMalformed", "InvalidRegion", "PermanentRedirect", "IllegalLocationConstraintException":
		return fmt.Errorf("the S3 store rejected the region %s (%s: %s): set the region the bucket is in", s.region, resp.Code, resp.Message)
	case "RequestTimeTooSkewed":
		return fmt.Errorf("the S3 store refused the request (%s): this machine's clock differs too much from the store's", resp.Code)
	}
	msg := resp.Message
	if msg == "" {
		msg = resp.Error()
	}
	if resp.StatusCode != 0 && !strings.HasPrefix(resp.Code, fmt.Sprint(resp.StatusCode)) {
		return fmt.Errorf("the S3 store answered %s (HTTP %d): %s", resp.Code, resp.StatusCode, msg)
	}
	return fmt.Errorf("the S3 store answered %s: %s", resp.Code, msg)
}

// action names the S3 permission op needs.
func action(op string) string {
	switch op {
	case "put":
		return "s3:PutObject"
	case "get", "stat":
		return "s3:GetObject"
	case "list":
		return "s3:ListBucket"
	case "delete":
		return "s3:DeleteObject"
	}
	return op
}
