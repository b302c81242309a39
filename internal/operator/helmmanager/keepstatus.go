package helmmanager

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

// helmConditions are the condition types helm-operator-plugins writes; every other
// condition, and every status field but deployedRelease, belongs to the controller.
var helmConditions = map[string]bool{
	dbv1.ConditionInitialized:    true,
	dbv1.ConditionDeployed:       true,
	dbv1.ConditionReleaseFailed:  true,
	dbv1.ConditionIrreconcilable: true,
}

// keepStatus is c as the Helm reconciler of gvk writes with it: a status update of a
// custom resource of gvk changes what helm-operator-plugins owns (its four conditions
// and status.deployedRelease) and keeps the rest of the status as the server has it.
//
// helm-operator-plugins v0.8.0 decodes the status into its own struct and writes that
// struct back as the whole status, so each of its writes used to blank the phase, the
// primary and the instances until the controller wrote them again: `kubectl get pgc` showed
// empty columns, and anything watching the cluster saw it lose its primary for a moment.
// The update still carries the resourceVersion the reconciler read: a status that
// changed since is a conflict, as it was, and the reconciler tries again.
//
// status.deployedRelease is written with the release's name only, not its manifest
// (see mergeHelmStatus), and an update that would leave the status as the cache has it
// is not sent.
func keepStatus(c client.Client, reader client.Reader, gvk schema.GroupVersionKind) client.Client {
	return statusKeepingClient{Client: c, reader: reader, gvk: gvk}
}

type statusKeepingClient struct {
	client.Client
	reader client.Reader
	gvk    schema.GroupVersionKind
}

func (c statusKeepingClient) Status() client.SubResourceWriter {
	return statusKeepingWriter{SubResourceWriter: c.Client.Status(), cached: c.Client, reader: c.reader, gvk: c.gvk}
}

type statusKeepingWriter struct {
	client.SubResourceWriter
	cached client.Reader
	reader client.Reader
	gvk    schema.GroupVersionKind
}

// unchanged reports whether the status helm would merge into u's is the one the cache
// holds at u's resourceVersion. helm-operator-plugins compares its status with the
// release it reads, manifest included, so without the manifest in the status it asks
// for an update at every reconcile; one that changes nothing is not sent.
func (w statusKeepingWriter) unchanged(ctx context.Context, u *unstructured.Unstructured, helm map[string]any) bool {
	cached := &unstructured.Unstructured{}
	cached.SetGroupVersionKind(w.gvk)
	if err := w.cached.Get(ctx, client.ObjectKeyFromObject(u), cached); err != nil || cached.GetResourceVersion() != u.GetResourceVersion() {
		return false
	}
	server, _ := cached.Object["status"].(map[string]any)
	return equality.Semantic.DeepEqual(mergeHelmStatus(server, helm), server)
}

func (w statusKeepingWriter) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok || u.GroupVersionKind() != w.gvk {
		return w.SubResourceWriter.Update(ctx, obj, opts...)
	}
	helm, _ := u.Object["status"].(map[string]any)
	if w.unchanged(ctx, u, helm) {
		return nil
	}
	current := &unstructured.Unstructured{}
	current.SetGroupVersionKind(w.gvk)
	if err := w.reader.Get(ctx, client.ObjectKeyFromObject(u), current); err != nil {
		return err
	}
	if current.GetResourceVersion() != u.GetResourceVersion() {
		return conflict(w.gvk, u)
	}
	server, _ := current.Object["status"].(map[string]any)
	u.Object["status"] = mergeHelmStatus(server, helm)
	return w.SubResourceWriter.Update(ctx, u, opts...)
}

func conflict(gvk schema.GroupVersionKind, u *unstructured.Unstructured) error {
	return apierrors.NewConflict(schema.GroupResource{Group: gvk.Group, Resource: u.GetKind()}, u.GetName(),
		fmt.Errorf("the object has been modified since resourceVersion %s; please apply your changes to the latest version and try again", u.GetResourceVersion()))
}

// mergeHelmStatus is the status on the server with what the Helm reconciler owns taken
// from helm: its conditions (replaced, added, or removed when helm lacks them) and
// deployedRelease. The controller's conditions keep their place and every field.
func mergeHelmStatus(server, helm map[string]any) map[string]any {
	out := runtime.DeepCopyJSON(server)
	if out == nil {
		out = map[string]any{}
	}
	if r, ok := helm["deployedRelease"].(map[string]any); ok {
		out["deployedRelease"] = withoutManifest(r)
	} else {
		delete(out, "deployedRelease")
	}

	owned := map[string]any{}
	var order []string
	for _, c := range conditionList(helm) {
		if t := conditionType(c); helmConditions[t] {
			if _, seen := owned[t]; !seen {
				order = append(order, t)
			}
			owned[t] = runtime.DeepCopyJSONValue(c)
		}
	}
	var conditions []any
	placed := map[string]bool{}
	for _, c := range conditionList(out) {
		t := conditionType(c)
		if !helmConditions[t] {
			conditions = append(conditions, c)
			continue
		}
		if h, ok := owned[t]; ok && !placed[t] {
			conditions = append(conditions, h)
			placed[t] = true
		}
	}
	for _, t := range order {
		if !placed[t] {
			conditions = append(conditions, owned[t])
		}
	}
	if conditions == nil {
		delete(out, "conditions")
	} else {
		out["conditions"] = conditions
	}
	return out
}

// withoutManifest is a deployedRelease without its manifest: the rendered chart, about
// 15 KB a cluster, which the release Secret already holds (helm get manifest), and which
// in the status was stored again in etcd, held in every cache of the custom resource
// (the Helm manager's, the controller's, every client's) and sent with every watch
// event of it: every status write of the controller.
func withoutManifest(r map[string]any) map[string]any {
	out := runtime.DeepCopyJSON(r)
	delete(out, "manifest")
	return out
}

func conditionList(status map[string]any) []any {
	l, _ := status["conditions"].([]any)
	return l
}

func conditionType(c any) string {
	m, _ := c.(map[string]any)
	t, _ := m["type"].(string)
	return t
}
