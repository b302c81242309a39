// Package logging holds the log options every pgpilot binary starts from, and Deferred,
// which puts off the cost of WithValues until a line is logged.
package logging

import (
	"go.uber.org/zap/zapcore"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// Options are JSON logs with millisecond timestamps, so that a failover's steps can be
// ordered across the agents' and the operator's logs. The --zap-* flags override them.
func Options() zap.Options {
	return zap.Options{TimeEncoder: zapcore.TimeEncoderOfLayout("2006-01-02T15:04:05.000Z07:00")}
}
