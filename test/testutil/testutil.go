// Package testutil holds helpers the test suites share.
package testutil

import (
	"testing"
	"time"
)

// Eventually polls check every 100 ms until it returns nil, or fails the test with
// check's last error once timeout has passed. Tests wait for conditions this way,
// never with a fixed sleep.
func Eventually(t testing.TB, timeout time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v", timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
