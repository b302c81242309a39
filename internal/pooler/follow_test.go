package pooler

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
)

func TestNext(t *testing.T) {
	on := func(pod string) State { return State{Pointed: pod} }
	paused := func(pod string) State { return State{Pointed: pod, Paused: true} }
	for _, tc := range []struct {
		name     string
		holder   string
		writable bool
		s        State
		want     Step
	}{
		{"settled", "db-0", true, on("db-0"), Step{}},
		{"the holder not accepting writes for a moment: nothing to move", "db-0", false, on("db-0"), Step{}},
		{"the role moving", "", false, on("db-0"), Step{Pause: true}},
		{"the role moving, paused", "", false, paused("db-0"), Step{}},
		{"a new holder: pause first, never send to the old one", "db-1", true, on("db-0"), Step{Pause: true}},
		{"a new holder not accepting writes yet", "db-1", false, paused("db-0"), Step{}},
		{"a new holder accepting writes", "db-1", true, paused("db-0"), Step{Point: "db-1", Resume: true}},
		{"the first holder", "db-0", true, paused(""), Step{Point: "db-0", Resume: true}},
		{"the same holder back (a switchover given back)", "db-0", true, paused("db-0"), Step{Resume: true}},
		{"the same holder back, not yet writable", "db-0", false, paused("db-0"), Step{}},
		{"held by the holder handing over", "db-0", true, State{Pointed: "db-0", Held: true}, Step{Pause: true}},
		{"held and paused: never resumed on the holder handing over", "db-0", true, State{Pointed: "db-0", Paused: true, Held: true}, Step{}},
	} {
		got := Next(tc.holder, tc.writable, tc.s)
		got.Why = ""
		if got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// fakePool records the steps a Follower takes; fail makes the next call of that name
// fail. Like PgBouncer's admin console behind Bouncer, it refuses to resume a pool that
// is not paused, and a pause or a resume is taken only while ordered so.
type fakePool struct {
	calls  []string
	fail   string
	paused bool
}

func (p *fakePool) do(name string) error {
	if p.fail == name {
		p.fail = ""
		return errors.New(name + " failed")
	}
	p.calls = append(p.calls, name)
	return nil
}
func (p *fakePool) Pause(context.Context) error {
	if p.paused {
		return errors.New("paused twice: the follower lost track of the pool")
	}
	err := p.do("pause")
	p.paused = p.paused || err == nil
	return err
}
func (p *fakePool) Resume(context.Context) error {
	if !p.paused {
		return errors.New("resumed a pool that is not paused")
	}
	err := p.do("resume")
	p.paused = p.paused && err != nil
	return err
}
func (p *fakePool) Point(_ context.Context, pod string) error { return p.do("point " + pod) }

// A move of the role, seen by a Follower's reads of the Lease: paused while no holder
// accepts writes, resumed on the new one, and a failed step taken again at the next read.
func TestFollowerFollowsAMove(t *testing.T) {
	holder, writable := "db-0", map[string]bool{"db-0": true}
	pool := &fakePool{}
	f := &Follower{
		Lease:    func(context.Context) (primarylease.Record, error) { return primarylease.Record{Holder: holder}, nil },
		Writable: func(_ context.Context, pod string) bool { return writable[pod] },
		Pool:     pool, Log: logr.Discard(),
	}
	ctx := context.Background()
	read := func() string {
		pool.calls = nil
		f.Once(ctx)
		return strings.Join(pool.calls, ", ")
	}
	for i, tc := range []struct {
		setup func()
		want  string
	}{
		{func() {}, "pause, point db-0, resume"}, // started: paused until a holder is writable
		{func() {}, ""},
		{func() { holder = "" }, "pause"},
		{func() { holder = "db-1" }, ""},
		{func() { writable["db-1"] = true; pool.fail = "point db-1" }, ""},
		{func() {}, "point db-1, resume"},
		{func() {}, ""},
	} {
		tc.setup()
		if got := read(); got != tc.want {
			t.Errorf("read %d: %q, want %q (state %+v)", i, got, tc.want, f.State())
		}
	}
	if s := f.State(); s != (State{Pointed: "db-1"}) {
		t.Errorf("state %+v", s)
	}
	f.Lease = func(context.Context) (primarylease.Record, error) {
		return primarylease.Record{}, fmt.Errorf("cut off")
	}
	if got := read(); got != "" {
		t.Errorf("with the Lease unreadable: %q, want nothing done", got)
	}
}

// A pause asked for by the primary's agent before its handover holds the pool while the
// Lease names that primary in the same term, though it still accepts writes, and ends
// when the Lease moves on, or when the hold's time is up (an abandoned handover).
func TestFollowerHoldsForAHandover(t *testing.T) {
	rec := primarylease.Record{Holder: "db-0", Term: 1}
	pool := &fakePool{}
	f := &Follower{
		Lease:    func(context.Context) (primarylease.Record, error) { return rec, nil },
		Writable: func(context.Context, string) bool { return true },
		Pool:     pool, Log: logr.Discard(),
	}
	ctx := context.Background()
	f.Once(ctx)
	pool.calls = nil
	if err := f.Hold(ctx, "db-0", 1, time.Minute); err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		setup func()
		want  string
	}{
		{func() {}, ""}, // held: db-0 is locking its clients out
		{func() { rec = primarylease.Record{Term: 1} }, ""},
		{func() { rec = primarylease.Record{Holder: "db-1", Term: 2} }, "point db-1, resume"},
		{func() { _ = f.Hold(ctx, "db-0", 1, time.Minute) }, ""}, // a late ask, for a term gone: nothing held
	} {
		tc.setup()
		pool.calls = nil
		f.Once(ctx)
		if got := strings.Join(pool.calls, ", "); got != tc.want {
			t.Errorf("step %d: %q, want %q (state %+v)", i, got, tc.want, f.State())
		}
	}
	// An abandoned handover: the hold ends with its time.
	if err := f.Hold(ctx, "db-1", 2, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(60 * time.Millisecond)
	pool.calls = nil
	f.Once(ctx)
	if got := strings.Join(pool.calls, ", "); got != "resume" {
		t.Errorf("after the hold's time: %q, want resume", got)
	}
}

func TestProbeSettings(t *testing.T) {
	ca := writeCA(t)
	p := Probe{Address: func(pod string) string { return pod + ".db-headless.ns.svc" }, Port: 5432, User: "pgpilot_pooler",
		Password: `pa'ss\word`, Database: "app", SSLMode: "verify-full", SSLRootCert: ca}
	cfg := p.config("db-1")
	if cfg == nil {
		t.Fatal("no configuration")
	}
	if cfg.Host != "db-1.db-headless.ns.svc" || cfg.Port != 5432 || cfg.User != "pgpilot_pooler" || cfg.Database != "app" || cfg.Password != `pa'ss\word` {
		t.Errorf("config %s:%d %s %s %q", cfg.Host, cfg.Port, cfg.User, cfg.Database, cfg.Password)
	}
	if cfg.TLSConfig == nil || cfg.TLSConfig.ServerName != "db-1.db-headless.ns.svc" || cfg.TLSConfig.InsecureSkipVerify || cfg.TLSConfig.RootCAs == nil {
		t.Errorf("TLS %+v: want the pod's name verified", cfg.TLSConfig)
	}
	if got := quote(`a'b\c`); got != `'a\'b\\c'` {
		t.Errorf("quote = %s", got)
	}
}

// writeCA writes a self-signed CA certificate (PEM) and returns its path.
func writeCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
