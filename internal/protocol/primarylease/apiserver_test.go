package primarylease_test

// The writes' tests run against a real kube-apiserver and etcd (hack/control-plane.sh,
// KUBEBUILDER_ASSETS), started once for the package at the first test that needs it:
// optimistic concurrency and its 409s are the API server's, not a fake's.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
	"github.com/pgpilot/pgpilot/internal/tools/devenv"
)

const namespace = "default"

// The times of the tests: the Lease is created at t0; the interloper of a conflict
// writes at interloperTime, the write under test at writeTime.
var (
	t0             = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	interloperTime = t0.Add(5 * time.Second)
	writeTime      = t0.Add(10 * time.Second)
)

var (
	controlPlane struct {
		once sync.Once
		env  *envtest.Environment
		err  error
		// agent is the agents' client (client-go), operator the operator's
		// (controller-runtime, uncached).
		agent    kubernetes.Interface
		operator client.Client
	}
	leases atomic.Int64
)

func TestMain(m *testing.M) {
	code := m.Run()
	if env := controlPlane.env; env != nil {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the control plane:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// apiServer starts the control plane once and returns the agents' and the operator's
// clients; without one the test fails, saying why.
func apiServer(t *testing.T) (kubernetes.Interface, client.Client) {
	t.Helper()
	cp := &controlPlane
	cp.once.Do(func() {
		root, err := devenv.RepoRoot()
		if err != nil {
			cp.err = err
			return
		}
		if cp.env, cp.err = devenv.StartControlPlane(root); cp.err != nil {
			return
		}
		if cp.agent, cp.err = kubernetes.NewForConfig(cp.env.Config); cp.err != nil {
			return
		}
		cp.operator, cp.err = client.New(cp.env.Config, client.Options{})
	})
	if cp.err != nil {
		t.Fatalf("these tests need a kube-apiserver and etcd (KUBEBUILDER_ASSETS=\"$(bash hack/control-plane.sh)\"): %v", cp.err)
	}
	return cp.agent, cp.operator
}

// writer names who writes: the holder's agent through client-go, or the operator
// through controller-runtime, as in production; each reads and writes through its own
// Store implementation.
type writer int

const (
	agent writer = iota
	operator
)

func (w writer) String() string { return [...]string{"agent", "operator"}[w] }

// other is the writer that races w.
func (w writer) other() writer { return 1 - w }

// testLease is one Lease on the API server, created for one test.
type testLease struct {
	t    *testing.T
	name string
}

var nonName = regexp.MustCompile(`[^a-z0-9]+`)

// create creates a Lease named after the test, seeded with seed.
func create(t *testing.T, seed *coordinationv1.Lease) (testLease, *coordinationv1.Lease) {
	t.Helper()
	kube, _ := apiServer(t)
	name := strings.Trim(nonName.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	name = fmt.Sprintf("%.200s-%d", name, leases.Add(1))
	l := seed.DeepCopy()
	l.Name, l.Namespace = name, namespace
	created, err := kube.CoordinationV1().Leases(namespace).Create(context.Background(), l, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating the Lease: %v", err)
	}
	return testLease{t: t, name: name}, created
}

// store is w's Store of the Lease.
func (tl testLease) store(w writer) primarylease.Store {
	kube, c := apiServer(tl.t)
	if w == agent {
		return primarylease.ClientsetStore{Client: kube, Namespace: namespace, Name: tl.name}
	}
	return primarylease.ClientStore{Reader: c, Writer: c, Namespace: namespace, Name: tl.name}
}

// get reads the Lease from the API server.
func (tl testLease) get() *coordinationv1.Lease {
	tl.t.Helper()
	l, err := tl.store(agent).Get(context.Background())
	if err != nil {
		tl.t.Fatalf("reading the Lease: %v", err)
	}
	return l
}

// apply is w applying change through Apply, at the time at.
func (tl testLease) apply(w writer, s primarylease.Store, change primarylease.Change, at time.Time) (*coordinationv1.Lease, error) {
	if s == nil {
		s = tl.store(w)
	}
	return primarylease.Apply(context.Background(), s, nil, func() time.Time { return at }, change)
}

// countingStore counts the reads and writes of a Store and runs beforeUpdate (when
// set) before each write: a hook for another writer to change the Lease between a
// read and a write.
type countingStore struct {
	primarylease.Store
	gets, updates int
	beforeUpdate  func(attempt int)
}

func (s *countingStore) Get(ctx context.Context) (*coordinationv1.Lease, error) {
	s.gets++
	return s.Store.Get(ctx)
}

func (s *countingStore) Update(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	s.updates++
	if s.beforeUpdate != nil {
		s.beforeUpdate(s.updates)
	}
	return s.Store.Update(ctx, l)
}

// state is what a test compares of a Lease: the Record read, but for its
// resourceVersion, with the spec fields Record leaves out.
type state struct {
	primarylease.Record
	Acquired        time.Time
	DurationSeconds int32
	// Legacy are the reports an older operator kept on the Lease.
	Legacy map[string]string
}

func stateOf(l *coordinationv1.Lease) state {
	s := state{Record: primarylease.Parse(l), Legacy: primarylease.LegacyReports(l)}
	s.ResourceVersion = ""
	if l.Spec.AcquireTime != nil {
		s.Acquired = l.Spec.AcquireTime.Time
	}
	if l.Spec.LeaseDurationSeconds != nil {
		s.DurationSeconds = *l.Spec.LeaseDurationSeconds
	}
	return s
}

// wantState fails the test unless l is in the state want makes of base (unchanged when
// want is nil).
func wantState(t *testing.T, l, base *coordinationv1.Lease, want func(*state)) {
	t.Helper()
	expected := stateOf(base)
	if want != nil {
		want(&expected)
	}
	if diff := cmp.Diff(expected, stateOf(l)); diff != "" {
		t.Errorf("the Lease after the write (-want +got):\n%s", diff)
	}
}

// wantErr fails the test unless err is want (nil: no error).
func wantErr(t *testing.T, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("error %v, want %v", err, want)
	}
}

// Seeds: Leases in the states the writes start from.

// syncJSON is the synchronous set the seeds record: db-1 in the holder's rule, db-2
// taken out at 0/3000060.
const syncJSON = `{"k":1,"members":{"db-1":"","db-2":"0/3000060"}}`

// held is a Lease that holder holds in term, renewed at t0, with a record of almost
// every kind a write must keep (a resuming hibernation while it names a holder), and
// three reports an older operator kept on the Lease.
func held(holder string, term int32) *coordinationv1.Lease {
	l := primarylease.New(namespace, "", "db", holder, t0)
	l.Spec.LeaseTransitions = &term
	l.Annotations = map[string]string{
		primarylease.LegacyDataGuard:       `{"refusals":{"db-2":"its data is another database's"}}`,
		dbv1.AnnotationBootstrapped:        "true",
		primarylease.AnnotationTimeline:    "4",
		primarylease.AnnotationSynchronous: syncJSON,
		primarylease.LegacyLastFailover:    `{"from":"db-1","to":"db-0","time":"2026-02-28T10:00:00Z","reason":"db-1 failed"}`,
		dbv1.AnnotationFenced:              `["db-2"]`,
		primarylease.LegacyDataVersion:     "17",
	}
	if holder != "" {
		l.Annotations[dbv1.AnnotationHibernation] = fmt.Sprintf(
			`{"phase":"resuming","holder":%q,"term":%d,"since":"2026-03-01T11:00:00Z"}`, holder, term)
	}
	return l
}

// vacant is the Lease after from's agent released it in term-1 (clean, at 0/5000028 on
// timeline 4): it names no holder in term.
func vacant(from string, term int32) *coordinationv1.Lease {
	l := held("", term)
	l.Annotations[primarylease.AnnotationHandover] = fmt.Sprintf(
		`{"from":%q,"term":%d,"reason":"stopping","clean":true,"finalLSN":"0/5000028","timeline":4,"released":true,"at":"2026-03-01T11:59:59Z"}`,
		from, term-1)
	return l
}

// with is l with the annotation key set to value ("" removes it).
func with(l *coordinationv1.Lease, key, value string) *coordinationv1.Lease {
	if value == "" {
		delete(l.Annotations, key)
	} else {
		l.Annotations[key] = value
	}
	return l
}
