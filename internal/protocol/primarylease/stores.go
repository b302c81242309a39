package primarylease

import (
	"context"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ClientsetStore is the Lease namespace/name through client-go (the agent's client: it
// may get, watch and update that one Lease, nothing else).
type ClientsetStore struct {
	Client          kubernetes.Interface
	Namespace, Name string
}

// Get implements Store.
func (s ClientsetStore) Get(ctx context.Context) (*coordinationv1.Lease, error) {
	return s.Client.CoordinationV1().Leases(s.Namespace).Get(ctx, s.Name, metav1.GetOptions{})
}

// Update implements Store.
func (s ClientsetStore) Update(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	return s.Client.CoordinationV1().Leases(s.Namespace).Update(ctx, l, metav1.UpdateOptions{})
}

// ClientStore is the Lease namespace/name through a controller-runtime client (the
// operator's). Reads come from what Reader reads: pass the manager's API reader for a
// fresh read, its cached client otherwise.
type ClientStore struct {
	Reader          client.Reader
	Writer          client.Writer
	Namespace, Name string
}

// Get implements Store.
func (s ClientStore) Get(ctx context.Context) (*coordinationv1.Lease, error) {
	var l coordinationv1.Lease
	if err := s.Reader.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: s.Name}, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// Update implements Store.
func (s ClientStore) Update(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	l = l.DeepCopy()
	err := s.Writer.Update(ctx, l)
	return l, err
}
