package managerflags

import (
	"context"
	"errors"
	"testing"

	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// countingLock counts the writes that reach it.
type countingLock struct {
	resourcelock.Interface
	creates, updates int
}

func (l *countingLock) Create(context.Context, resourcelock.LeaderElectionRecord) error {
	l.creates++
	return nil
}

func (l *countingLock) Update(context.Context, resourcelock.LeaderElectionRecord) error {
	l.updates++
	return nil
}

// Until ready, a process neither takes nor renews the Lease; it may always release it.
func TestReadyLock(t *testing.T) {
	ready := false
	inner := &countingLock{}
	l := &readyLock{Interface: inner, ready: func() bool { return ready }}
	ctx := context.Background()
	held := resourcelock.LeaderElectionRecord{HolderIdentity: "pgpilot-controller-manager-0"}
	if err := l.Create(ctx, held); !errors.Is(err, errNotReady) {
		t.Errorf("Create before ready: %v, want errNotReady", err)
	}
	if err := l.Update(ctx, held); !errors.Is(err, errNotReady) {
		t.Errorf("Update before ready: %v, want errNotReady", err)
	}
	if err := l.Update(ctx, resourcelock.LeaderElectionRecord{}); err != nil {
		t.Errorf("a release before ready: %v", err)
	}
	ready = true
	if err := l.Create(ctx, held); err != nil {
		t.Errorf("Create once ready: %v", err)
	}
	if err := l.Update(ctx, held); err != nil {
		t.Errorf("Update once ready: %v", err)
	}
	if inner.creates != 1 || inner.updates != 2 {
		t.Errorf("%d creates and %d updates reached the lock, want 1 and 2 (the release and the renewal)", inner.creates, inner.updates)
	}
}
