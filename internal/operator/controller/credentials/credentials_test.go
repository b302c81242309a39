package credentials_test

import (
	"bytes"
	"crypto/rand"
	"regexp"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/controller/credentials"
	"github.com/pgpilot/pgpilot/internal/operator/secrets"
)

// --- fixtures ---------------------------------------------------------------------------

type clusterOption func(*dbv1.PostgresCluster)

// newCluster returns cluster "db" in namespace "prod" with the CRD's bootstrap defaults,
// as changed by opts.
func newCluster(opts ...clusterOption) *dbv1.PostgresCluster {
	c := &dbv1.PostgresCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "prod", UID: types.UID("0d5c1a52-cluster-db"), Generation: 1},
		Spec: dbv1.PostgresClusterSpec{
			Replicas:  3,
			Version:   "16",
			Bootstrap: dbv1.BootstrapSpec{Database: "app", Owner: "app"},
		},
	}
	for _, opt := range opts {
		opt(c)
	}
	return c
}

func withName(name string) clusterOption {
	return func(c *dbv1.PostgresCluster) { c.Name = name }
}

func withBootstrap(database, owner string) clusterOption {
	return func(c *dbv1.PostgresCluster) { c.Spec.Bootstrap = dbv1.BootstrapSpec{Database: database, Owner: owner} }
}

// newSecret returns Secret name in namespace "prod" holding data.
func newSecret(name string, data map[string]string) *corev1.Secret {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "prod"},
		Type:       corev1.SecretTypeBasicAuth,
	}
	if data != nil {
		s.Data = map[string][]byte{}
		for k, v := range data {
			s.Data[k] = []byte(v)
		}
	}
	return s
}

// --- Password ---------------------------------------------------------------------------

var passwordPattern = regexp.MustCompile(`^[A-Za-z0-9]*$`)

func TestPasswordFromCryptoRand(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 20; i++ {
		p, err := credentials.Password(rand.Reader, credentials.PasswordLength)
		if err != nil {
			t.Fatal(err)
		}
		if len(p) != credentials.PasswordLength || !passwordPattern.MatchString(p) {
			t.Fatalf("password %q: want %d characters of [A-Za-z0-9]", p, credentials.PasswordLength)
		}
		if seen[p] {
			t.Fatalf("password %q drawn twice", p)
		}
		seen[p] = true
	}
}

func TestPassword(t *testing.T) {
	sequence := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i)
		}
		return b
	}
	cases := []struct {
		name   string
		random []byte
		n      int
		want   string
	}{
		{
			name:   "one byte per character, low 6 bits index the alphabet",
			random: sequence(62),
			n:      62,
			want:   "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
		},
		{
			name:   "high bits are ignored",
			random: []byte{0x40, 0x80 | 25, 0xc0 | 26, 0xff &^ 0x02},
			n:      4,
			want:   "AZa9",
		},
		{
			name:   "values past the alphabet are drawn again, not wrapped",
			random: []byte{62, 63, 0xff, 1},
			n:      1,
			want:   "B",
		},
		{
			name:   "zero length reads nothing",
			random: nil,
			n:      0,
			want:   "",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := credentials.Password(bytes.NewReader(tc.random), tc.n)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("Password = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestPasswordIsDeterministic(t *testing.T) {
	random := make([]byte, 256)
	for i := range random {
		random[i] = byte(i * 37)
	}
	first, err := credentials.Password(bytes.NewReader(random), credentials.PasswordLength)
	if err != nil {
		t.Fatal(err)
	}
	second, err := credentials.Password(bytes.NewReader(random), credentials.PasswordLength)
	if err != nil {
		t.Fatal(err)
	}
	if first != second {
		t.Errorf("the same random bytes gave %q and %q", first, second)
	}
	if len(first) != credentials.PasswordLength || !passwordPattern.MatchString(first) {
		t.Errorf("password %q: want %d characters of [A-Za-z0-9]", first, credentials.PasswordLength)
	}
}

func TestPasswordWhenRandomRunsDry(t *testing.T) {
	cases := []struct {
		name   string
		random []byte
	}{
		{"empty", nil},
		{"too short", make([]byte, credentials.PasswordLength-1)},
		{"only rejected values", bytes.Repeat([]byte{63}, 100)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := credentials.Password(bytes.NewReader(tc.random), credentials.PasswordLength)
			if err == nil {
				t.Fatalf("Password = %q, want an error", p)
			}
			if p != "" {
				t.Errorf("Password returned %q along with error %v", p, err)
			}
		})
	}
}

// --- Wanted and Problem -----------------------------------------------------------------

func TestWanted(t *testing.T) {
	cases := []struct {
		name    string
		cluster *dbv1.PostgresCluster
		want    []secrets.Credential
	}{
		{
			name:    "defaults",
			cluster: newCluster(),
			want: []secrets.Credential{
				{Name: "db-superuser", Username: "postgres"},
				{Name: "db-replication", Username: "pgpilot_replication"},
				{Name: "db-app", Username: "app", App: true},
			},
		},
		{
			name:    "owner from spec.bootstrap.owner",
			cluster: newCluster(withName("shop"), withBootstrap("orders", "shopkeeper")),
			want: []secrets.Credential{
				{Name: "shop-superuser", Username: "postgres"},
				{Name: "shop-replication", Username: "pgpilot_replication"},
				{Name: "shop-app", Username: "shopkeeper", App: true},
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, secrets.Wanted(tc.cluster)); diff != "" {
				t.Errorf("Wanted (-want +got):\n%s", diff)
			}
		})
	}
}

func TestProblem(t *testing.T) {
	cases := []struct {
		name   string
		secret *corev1.Secret
		want   string
	}{
		{"fine", newSecret("db-app", map[string]string{"username": "app", "password": "s3cret"}), ""},
		{"fine with extra keys", newSecret("db-app", map[string]string{"username": "app", "password": "s3cret", "uri": "postgresql://x"}), ""},
		{"no data", newSecret("db-app", nil), `Secret db-app has no "username" key`},
		{"missing username", newSecret("db-app", map[string]string{"password": "s3cret"}), `Secret db-app has no "username" key`},
		{"empty username", newSecret("db-app", map[string]string{"username": "", "password": "s3cret"}), `Secret db-app has no "username" key`},
		{"missing password", newSecret("db-superuser", map[string]string{"username": "postgres"}), `Secret db-superuser has no "password" key`},
		{"empty password", newSecret("db-replication", map[string]string{"username": "pgpilot_replication", "password": ""}), `Secret db-replication has no "password" key`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := secrets.Problem(tc.secret); got != tc.want {
				t.Errorf("Problem = %q, want %q", got, tc.want)
			}
		})
	}
}
