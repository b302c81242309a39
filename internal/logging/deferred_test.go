package logging

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/google/go-cmp/cmp"
	uberzap "go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

var errBoom = errors.New("boom")

// newLogger is the binaries' logger (Options, the --zap-* flags' defaults) writing to
// out, with a fixed time so that two loggers' lines can be compared.
func newLogger(out io.Writer, opts ...zap.Opts) logr.Logger {
	o := Options()
	o.TimeEncoder = func(_ time.Time, enc zapcore.PrimitiveArrayEncoder) {
		enc.AppendString("2026-11-20T10:00:00.000Z")
	}
	return zap.New(append([]zap.Opts{zap.UseFlagOptions(&o), zap.WriteTo(out)}, opts...)...)
}

// Neither of controller-runtime's modes adds the caller (zap.Development only makes
// DPanic panic); both add stack traces, to errors in production and warnings in
// development. The stack traces and the caller count the frames Deferred adds.
var modes = []struct {
	name   string
	opts   []zap.Opts
	caller bool
}{
	{name: "production"},
	{name: "production with caller", opts: []zap.Opts{zap.RawZapOpts(uberzap.AddCaller())}, caller: true},
	{name: "production at V(2) with caller", opts: []zap.Opts{zap.Level(zapcore.Level(-2)), zap.RawZapOpts(uberzap.AddCaller())}, caller: true},
	{name: "development", opts: []zap.Opts{zap.UseDevMode(true)}},
	{name: "development with caller", opts: []zap.Opts{zap.UseDevMode(true), zap.RawZapOpts(uberzap.AddCaller())}, caller: true},
}

// phase is a value WithValues may keep: it is copied whole into the interface.
type phase struct{ name string }

func (p phase) MarshalLog() any { return map[string]string{"phase": p.name} }

func TestDeferredLogsAsZapr(t *testing.T) {
	for _, tc := range []struct {
		name string
		log  func(logr.Logger)
	}{
		{"info", func(l logr.Logger) { l.Info("Reconciled", "replicas", 3) }},
		{"no values", func(l logr.Logger) { l.WithValues().Info("Reconciled") }},
		{"values", func(l logr.Logger) {
			l.WithValues("a", 1).WithValues("b", "two", "c", 3.5).Info("Reconciled", "d", true)
		}},
		{"names between values", func(l logr.Logger) {
			l.WithValues("a", 1).WithName("failover").WithValues("b", 2).WithName("lease").Info("Promoted", "c", 3)
		}},
		{"verbosity", func(l logr.Logger) {
			l = l.WithValues("a", 1)
			l.V(1).Info("Checked")
			l.V(1).WithValues("b", 2).V(1).Info("Compared")
			l.V(1).Error(errBoom, "Failed")
			l.WithValues("c", 3).V(3).Info("Too verbose")
		}},
		{"error", func(l logr.Logger) {
			l.WithValues("a", 1).Error(errBoom, "Failed to promote", "pod", "db-1")
			l.Error(nil, "Failed without an error")
		}},
		{"nested children", func(l logr.Logger) {
			parent := l.WithValues("p", 1)
			parent.Info("Parent")
			child := parent.WithName("child").WithValues("c", 2)
			child.Info("Child")
			grandchild := child.WithValues("g", 3)
			grandchild.Error(errBoom, "Grandchild")
			parent.Info("Parent again")
			child.WithName("again").Info("Child again")
		}},
		{"siblings", func(l logr.Logger) {
			parent := l.WithValues("p", 1)
			a := parent.WithValues("a", 1)
			b := parent.WithValues("b", 2)
			a.Info("A")
			b.Info("B")
			parent.Info("Parent")
			// Made after the parent logged: from the sink its values were applied to.
			c := parent.WithValues("c", 3)
			d := parent.WithName("d")
			c.Info("C")
			d.Info("D")
			a.WithValues("a2", 1).Info("A again")
		}},
		{"caller's slice reused", func(l logr.Logger) {
			kv := make([]any, 2, 4) // room for an append to write into
			kv[0], kv[1] = "k", "first"
			first := l.WithValues(kv...)
			kv[1] = "changed"
			second := l.WithValues(append(kv, "x", 1)...)
			kv[1] = "changed again"
			first.Info("First")
			second.Info("Second")
		}},
		{"values changed after WithValues", func(l logr.Logger) {
			status := &phase{"Pending"}
			counts := map[string]int{"ready": 1}
			pods := []string{"db-0"}
			child := l.WithValues("status", status, "counts", counts, "pods", pods, "cause", errBoom)
			status.name, counts["ready"], pods[0] = "Ready", 2, "db-1"
			child.Info("Observed")
		}},
		{"values of plain types", func(l logr.Logger) {
			l.WithValues("phase", phase{"Ready"}, "ref", klog.KRef("prod", "db"), "uid", types.UID("1f0e"),
				"window", 90*time.Second, "ids", [2]int{1, 2}, "nothing", nil).Info("Plain")
		}},
		{"controller-runtime's values", func(l logr.Logger) {
			l = l.WithValues("controller", "postgrescluster", "controllerGroup", "db.example.com", "controllerKind", "PostgresCluster")
			l = l.WithValues("PostgresCluster", klog.KRef("prod", "db"), "namespace", "prod", "name", "db")
			l = l.WithValues("reconcileID", types.UID("0b5e6f2c-51a1-4d2e-9f43-8c1c2a7c9e10"))
			l.Info("Reconciled")
			l.Error(errBoom, "Reconciler error")
		}},
		{"call depth", func(l logr.Logger) { logFromHelper(l.WithValues("a", 1)) }},
		{"call stack helper", func(l logr.Logger) { logFromMarkedHelper(l.WithValues("a", 1)) }},
		// zapr reports these when WithValues is called: a DPanic, which panics in
		// development.
		{"odd count", func(l logr.Logger) {
			recovered(func() { l.WithValues("a", 1).WithValues("orphan").WithValues("b", 2).Info("Odd") })
		}},
		{"key not a string", func(l logr.Logger) {
			recovered(func() { l.WithValues("a", 1).WithValues(1, 2).WithValues("b", 2).Info("Bad key") })
		}},
		{"zap field", func(l logr.Logger) {
			recovered(func() { l.WithValues(uberzap.Int("k", 1), "v").Info("Zap field") })
		}},
	} {
		for _, m := range modes {
			t.Run(tc.name+"/"+m.name, func(t *testing.T) {
				var zaprOut, deferredOut bytes.Buffer
				loggers := []logr.Logger{newLogger(&zaprOut, m.opts...), Deferred(newLogger(&deferredOut, m.opts...))}
				// One call site for both, so that stack traces agree.
				for _, l := range loggers {
					tc.log(l)
				}
				if zaprOut.Len() == 0 {
					t.Fatal("Nothing was logged")
				}
				if diff := cmp.Diff(zaprOut.String(), deferredOut.String()); diff != "" {
					t.Errorf("Deferred's lines differ from zapr's (-zapr +deferred):\n%s", diff)
				}
				if m.caller && !strings.Contains(zaprOut.String(), "logging/deferred_test.go:") {
					t.Errorf("The caller is not this file:\n%s", zaprOut.String())
				}
			})
		}
	}
}

func logFromHelper(l logr.Logger) {
	l.WithCallDepth(1).Info("Logged for the caller")
}

func logFromMarkedHelper(l logr.Logger) {
	helper, l := l.WithCallStackHelper()
	helper()
	l.Info("Logged for the caller")
}

func recovered(f func()) {
	defer func() { _ = recover() }()
	f()
}

// ctrlOut is where ctrl.Log writes: it can be set once in a process, and go test
// -count=2 runs a test twice.
var (
	ctrlOut     bytes.Buffer
	setCtrlOnce sync.Once
)

// TestDeferredThroughControllerRuntime logs through ctrl.Log, as the binaries do: its
// delegating sink adds a frame, takes it off for its children, and fulfils the loggers
// made before SetLogger.
func TestDeferredThroughControllerRuntime(t *testing.T) {
	caller := zap.RawZapOpts(uberzap.AddCaller())
	early := ctrllog.Log.WithName("setup")
	setCtrlOnce.Do(func() { ctrllog.SetLogger(Deferred(newLogger(&ctrlOut, caller))) })
	ctrlOut.Reset()
	var zaprOut bytes.Buffer
	zapr := newLogger(&zaprOut, caller)

	for _, pair := range [][2]logr.Logger{
		{zapr.WithName("setup"), early},
		{zapr, ctrllog.Log},
		{zapr.WithValues("controller", "c").WithName("n"), ctrllog.Log.WithValues("controller", "c").WithName("n")},
	} {
		for _, l := range pair {
			l.WithValues("a", 1).Info("Logged")
			l.Error(errBoom, "Failed")
		}
	}
	if diff := cmp.Diff(zaprOut.String(), ctrlOut.String()); diff != "" {
		t.Errorf("ctrl.Log's lines differ from zapr's (-zapr +ctrl.Log):\n%s", diff)
	}
	if !strings.Contains(zaprOut.String(), "logging/deferred_test.go:") {
		t.Errorf("The caller is not this file:\n%s", zaprOut.String())
	}
}

// helperT does what testing.T does for testr: Helper marks its caller, and Log reports
// the first frame not marked, the line a test's failure points at.
type helperT struct {
	helpers  map[string]bool
	reported []string
}

func (t *helperT) Helper() {
	var pc [1]uintptr
	runtime.Callers(2, pc[:])
	f, _ := runtime.CallersFrames(pc[:]).Next()
	t.helpers[f.Function] = true
}

func (t *helperT) Log(...any) {
	pcs := make([]uintptr, 32)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	for {
		f, more := frames.Next()
		if !t.helpers[f.Function] || !more {
			t.reported = append(t.reported, f.Function)
			return
		}
	}
}

func TestDeferredMarksItsFramesAsHelpers(t *testing.T) {
	var zaprT, deferredT helperT
	for _, ht := range []*helperT{&zaprT, &deferredT} {
		ht.helpers = map[string]bool{}
		l := testr.NewWithInterface(ht, testr.Options{})
		if ht == &deferredT {
			l = Deferred(l)
		}
		l.WithValues("a", 1).Info("Logged")
		l.Error(errBoom, "Failed")
		logFromMarkedHelper(l)
	}
	const test = "github.com/pgpilot/pgpilot/internal/logging.TestDeferredMarksItsFramesAsHelpers"
	if diff := cmp.Diff([]string{test, test, test}, deferredT.reported); diff != "" {
		t.Errorf("Lines reported through Deferred (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(zaprT.reported, deferredT.reported); diff != "" {
		t.Errorf("Lines reported differ from testr's own (-testr +deferred):\n%s", diff)
	}
}

func TestDeferrable(t *testing.T) {
	for _, tc := range []struct {
		name          string
		keysAndValues []any
		want          bool
	}{
		{"none", nil, true},
		{"scalars", []any{"a", 1, "b", "two", "c", 3.5, "d", true, "e", uint8(5)}, true},
		{"named scalars", []any{"uid", types.UID("1f0e"), "window", time.Second}, true},
		{"struct of strings", []any{"ref", klog.KRef("prod", "db")}, true},
		{"array", []any{"ids", [2]int{1, 2}}, true},
		{"nil", []any{"nothing", nil}, true},
		{"odd count", []any{"a", 1, "orphan"}, false},
		{"key not a string", []any{1, 2}, false},
		{"zap field as a key", []any{uberzap.Int("k", 1), "v"}, false},
		{"pointer", []any{"status", &phase{"Ready"}}, false},
		{"slice", []any{"pods", []string{"db-0"}}, false},
		{"map", []any{"counts", map[string]int{}}, false},
		{"error", []any{"cause", errBoom}, false},
		{"struct with a pointer", []any{"at", time.Now()}, false},
		{"struct with an interface", []any{"field", uberzap.String("k", "v")}, false},
		{"array of pointers", []any{"ptrs", [1]*int{}}, false},
		{"func", []any{"f", func() {}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := deferrable(tc.keysAndValues); got != tc.want {
				t.Errorf("deferrable(%v) = %v, want %v", tc.keysAndValues, got, tc.want)
			}
		})
	}
}

// The loggers controller-runtime makes for each reconcile: the controller's, made once;
// builder's LogConstructor's values for the request; reconcileHandler's reconcileID.
// The binaries' options, so zap's sampler drops most lines logged, as it would at this
// rate.
func benchmarkReconciles(b *testing.B, use func(logr.Logger)) {
	requests := make([]types.NamespacedName, 1000)
	uids := make([]types.UID, len(requests))
	for i := range requests {
		requests[i] = types.NamespacedName{Namespace: fmt.Sprintf("team-%d", i%50), Name: fmt.Sprintf("db-%d", i)}
		uids[i] = types.UID(fmt.Sprintf("0b5e6f2c-51a1-4d2e-9f43-%012d", i))
	}
	for _, bc := range []struct {
		name string
		wrap func(logr.Logger) logr.Logger
	}{
		{"zapr", func(l logr.Logger) logr.Logger { return l }},
		{"deferred", Deferred},
	} {
		b.Run(bc.name, func(b *testing.B) {
			o := Options()
			log := bc.wrap(zap.New(zap.UseFlagOptions(&o), zap.WriteTo(io.Discard))).
				WithValues("controller", "postgrescluster", "controllerGroup", "db.example.com", "controllerKind", "PostgresCluster")
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				req := requests[i%len(requests)]
				l := log.WithValues("PostgresCluster", klog.KRef(req.Namespace, req.Name))
				l = l.WithValues("namespace", req.Namespace, "name", req.Name)
				l = l.WithValues("reconcileID", uids[i%len(uids)])
				use(l)
			}
		})
	}
}

func BenchmarkWithValuesNotLogged(b *testing.B) {
	benchmarkReconciles(b, func(logr.Logger) {})
}

func BenchmarkWithValuesLogged(b *testing.B) {
	benchmarkReconciles(b, func(l logr.Logger) { l.Info("Reconciled") })
}
