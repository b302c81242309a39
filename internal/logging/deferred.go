package logging

import (
	"reflect"
	"sync"
	"sync/atomic"

	"github.com/go-logr/logr"
)

// Deferred returns l with WithValues put off until a line is logged. zapr's WithValues
// clones zap's encoder for every call, and controller-runtime calls it three times for
// each reconcile, whose logger rarely logs: at 1,000 clusters that was a tenth of the
// controller's allocations. The lines logged are the same, byte for byte: pairs zapr
// would treat differently later (malformed ones, values that refer to memory) are
// handed over at once.
func Deferred(l logr.Logger) logr.Logger {
	sink := l.GetSink()
	if sink == nil {
		return l
	}
	if _, ok := sink.(*deferredSink); ok {
		return l
	}
	return logr.New(&deferredSink{sink: sink}).V(l.GetV())
}

// deferredSink keeps WithValues' pairs and hands them to its sink, in one WithValues,
// the first time a line is logged.
type deferredSink struct {
	sink logr.LogSink
	// values are the pairs not handed to sink yet. The slice is never written after it
	// is made: WithValues copies it, so a child, a sibling or the caller's own slice
	// never sees another's pairs.
	values []any
	// applied is sink with values, once a line was logged. Two goroutines logging at
	// once may both make it; either result is the same.
	applied atomic.Pointer[logr.LogSink]
}

var (
	_ logr.CallDepthLogSink       = (*deferredSink)(nil)
	_ logr.CallStackHelperLogSink = (*deferredSink)(nil)
)

// Init adds this sink's own frame. The wrapped sink was initialised for logr.Logger's
// frame when its logr.Logger was made; without this, the caller it reports would be a
// line of this file.
func (d *deferredSink) Init(logr.RuntimeInfo) {
	d.sink = withCallDepth(d.sink, 1)
}

func (d *deferredSink) Enabled(level int) bool {
	return d.sink.Enabled(level)
}

// Info and Error call the sink, and mark themselves as helpers (testr's t.Helper), from
// their own frame and not through a function: the sink's caller depth counts one frame
// here, as Init said, and t.Helper marks the function that calls it.
func (d *deferredSink) Info(level int, msg string, keysAndValues ...any) {
	if h, ok := d.sink.(logr.CallStackHelperLogSink); ok {
		h.GetCallStackHelper()()
	}
	d.withValues().Info(level, msg, keysAndValues...)
}

func (d *deferredSink) Error(err error, msg string, keysAndValues ...any) {
	if h, ok := d.sink.(logr.CallStackHelperLogSink); ok {
		h.GetCallStackHelper()()
	}
	d.withValues().Error(err, msg, keysAndValues...)
}

func (d *deferredSink) WithValues(keysAndValues ...any) logr.LogSink {
	if !deferrable(keysAndValues) {
		// Called from this frame, as Info is, so that zapr's report of a malformed pair
		// names the caller's line.
		return &deferredSink{sink: d.withValues().WithValues(keysAndValues...)}
	}
	sink, values := d.state()
	all := make([]any, 0, len(values)+len(keysAndValues))
	all = append(all, values...)
	return &deferredSink{sink: sink, values: append(all, keysAndValues...)}
}

func (d *deferredSink) WithName(name string) logr.LogSink {
	sink, values := d.state()
	return &deferredSink{sink: sink.WithName(name), values: values}
}

// WithCallDepth passes on controller-runtime's delegating sink's adjustments (ctrl.Log
// adds one frame, its children take it off) and logr.Logger.WithCallDepth.
func (d *deferredSink) WithCallDepth(depth int) logr.LogSink {
	sink, values := d.state()
	return &deferredSink{sink: withCallDepth(sink, depth), values: values}
}

// GetCallStackHelper returns the sink's helper (testr's t.Helper), so that a test's
// failure points at its own line.
func (d *deferredSink) GetCallStackHelper() func() {
	if h, ok := d.sink.(logr.CallStackHelperLogSink); ok {
		return h.GetCallStackHelper()
	}
	return func() {}
}

// state is the sink and the pairs still to hand it, from the applied sink when a line
// was logged already, so that a child does not apply them again.
func (d *deferredSink) state() (logr.LogSink, []any) {
	if s := d.applied.Load(); s != nil {
		return *s, nil
	}
	return d.sink, d.values
}

// withValues is the sink with every pair handed to it.
func (d *deferredSink) withValues() logr.LogSink {
	sink, values := d.state()
	if len(values) == 0 {
		return sink
	}
	sink = sink.WithValues(values...)
	d.applied.Store(&sink)
	return sink
}

func withCallDepth(sink logr.LogSink, depth int) logr.LogSink {
	if s, ok := sink.(logr.CallDepthLogSink); ok {
		return s.WithCallDepth(depth)
	}
	return sink
}

// deferrable reports whether handing keysAndValues to zapr later gives what handing them
// now does. zapr reports an odd count or a key that is not a string when WithValues is
// called (a DPanic, which panics in development mode), and encodes each value then: a
// value that refers to memory (a pointer, slice, map, interface, ...) may have changed
// by the time a line is logged.
func deferrable(keysAndValues []any) bool {
	if len(keysAndValues)%2 != 0 {
		return false
	}
	for i := 0; i < len(keysAndValues); i += 2 {
		if _, ok := keysAndValues[i].(string); !ok {
			return false
		}
		if v := keysAndValues[i+1]; v != nil && !plainType(reflect.TypeOf(v)) {
			return false
		}
	}
	return true
}

// plainTypes caches plainType's answer for structs and arrays (klog.ObjectRef, which
// controller-runtime adds to every reconcile's logger, is one).
var plainTypes sync.Map // reflect.Type → bool

// plainType reports whether a value of type t is copied whole into an interface: it
// holds no pointer, slice, map, channel, function or interface.
func plainType(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Bool, reflect.String,
		reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128:
		return true
	case reflect.Array, reflect.Struct:
		if plain, ok := plainTypes.Load(t); ok {
			return plain.(bool)
		}
		plain := plainComposite(t)
		plainTypes.Store(t, plain)
		return plain
	default:
		return false
	}
}

func plainComposite(t reflect.Type) bool {
	if t.Kind() == reflect.Array {
		return plainType(t.Elem())
	}
	for i := range t.NumField() {
		if !plainType(t.Field(i).Type) {
			return false
		}
	}
	return true
}
