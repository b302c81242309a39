package agentapi

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"
)

// fakeBackups serves the backup calls with nothing.
type fakeBackups struct{ *fakeInstance }

func (fakeBackups) StartBackup(context.Context, string) error { return nil }
func (fakeBackups) Backup(context.Context, string) (BackupStatus, error) {
	return BackupStatus{}, nil
}
func (fakeBackups) Retention(context.Context, RetentionRequest) (RetentionResult, error) {
	return RetentionResult{}, nil
}
func (fakeBackups) ApplyRoles(context.Context, RolesRequest) (RolesResult, error) {
	return RolesResult{}, nil
}

// Every endpoint but the probes needs a token, and each token opens only what its
// purpose needs: a pod's peer token cannot promote or delete backups, Prometheus's
// cannot confirm a primary or fence one.
func TestPurposes(t *testing.T) {
	creds := Tokens(map[Purpose]string{Control: "ctl", Peer: "peer", Metrics: "prom"})
	url := serve(t, fakeBackups{newFakeInstance(replicaStatus())}, ServerOptions{Credentials: creds})
	const (
		ok        = http.StatusOK
		forbidden = http.StatusForbidden
		noToken   = http.StatusUnauthorized
	)
	for _, tc := range []struct {
		method, path string
		// want is the status code for no token, the control, peer and metrics tokens;
		// 0 is anything but 401 and 403 (the call itself may fail on the fake).
		want [4]int
	}{
		{http.MethodGet, PathHealthz, [4]int{ok, ok, ok, ok}},
		{http.MethodGet, PathReadyz, [4]int{ok, ok, ok, ok}},
		{http.MethodGet, PathStatus, [4]int{noToken, ok, ok, ok}},
		{http.MethodGet, PathMetrics, [4]int{noToken, ok, forbidden, ok}},
		{http.MethodPost, PathConfirm, [4]int{noToken, forbidden, 0, forbidden}},
		{http.MethodPost, PathPromote, [4]int{noToken, 0, forbidden, forbidden}},
		{http.MethodPost, PathFence, [4]int{noToken, 0, forbidden, forbidden}},
		{http.MethodPost, PathDemote, [4]int{noToken, 0, forbidden, forbidden}},
		{http.MethodPost, PathFreeze, [4]int{noToken, 0, forbidden, forbidden}},
		{http.MethodPost, PathRestart, [4]int{noToken, 0, forbidden, forbidden}},
		{http.MethodPost, PathBackups, [4]int{noToken, 0, forbidden, forbidden}},
		{http.MethodGet, PathBackups + "/b1", [4]int{noToken, 0, forbidden, forbidden}},
		{http.MethodPost, PathRetention, [4]int{noToken, 0, forbidden, forbidden}},
		{http.MethodPut, PathRoles, [4]int{noToken, 0, forbidden, forbidden}},
	} {
		for i, auth := range []string{"", "Bearer ctl", "Bearer peer", "Bearer prom"} {
			code, _, body := request(t, tc.method, url+tc.path, auth)
			want := tc.want[i]
			if want == 0 && (code == http.StatusUnauthorized || code == http.StatusForbidden) || want != 0 && code != want {
				t.Errorf("%s %s with %q: %d %s, want %d (0: allowed)", tc.method, tc.path, auth, code, body, want)
			}
		}
	}
}

// Credentials are compared by digest: a digest is not a token.
func TestDigests(t *testing.T) {
	d := Digests{Control: {Digest("ctl")}}
	if d.PurposeOf("ctl") != Control || d.PurposeOf(Digest("ctl")) != "" || d.PurposeOf("") != "" {
		t.Errorf("PurposeOf: ctl %q, its digest %q, empty %q", d.PurposeOf("ctl"), d.PurposeOf(Digest("ctl")), d.PurposeOf(""))
	}
}

// Mounted with the peers' token's digest and not the token (the pooler's pods), the
// credentials check a peer's call and can make none.
func TestMountedPeerDigestOnly(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, FilePeerDigest), []byte(Digest("peer-token")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &MountedCredentials{Dir: dir}
	if got := c.PurposeOf("peer-token"); got != Peer {
		t.Errorf("the peers' token: %q, want %q", got, Peer)
	}
	if got := c.PurposeOf(Digest("peer-token")); got != "" {
		t.Errorf("the digest itself as a token: %q, want none", got)
	}
	if c.PeerToken() != "" {
		t.Error("a peer token without the token mounted")
	}
}
