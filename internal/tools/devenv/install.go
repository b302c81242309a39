package devenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sort"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// OperatorServiceAccount is the ServiceAccount config/default runs the operator as.
const (
	OperatorNamespace      = "pgpilot-system"
	OperatorServiceAccount = "pgpilot-controller-manager"
)

// BuildKustomization renders a kustomization directory, as `kustomize build` does, into
// its objects.
func BuildKustomization(dir string) ([]*unstructured.Unstructured, error) {
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	out, err := resources.AsYaml()
	if err != nil {
		return nil, err
	}
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, err
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

// InstallOperator applies config/default, except its Deployment (the operator runs in
// this process instead), and returns cfg impersonating the operator's ServiceAccount:
// run with it, the operator has exactly the permissions config/ grants it.
func InstallOperator(ctx context.Context, cfg *rest.Config, root string) (*rest.Config, error) {
	objs, err := BuildKustomization(filepath.Join(root, "config", "default"))
	if err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return nil, err
	}
	// Namespaces and CRDs before what lives in them.
	sort.SliceStable(objs, func(i, j int) bool { return applyRank(objs[i]) < applyRank(objs[j]) })
	for _, o := range objs {
		if o.GetKind() == "Deployment" {
			continue
		}
		if err := c.Patch(ctx, o, client.Apply, client.FieldOwner("pgpilot-devenv"), client.ForceOwnership); err != nil {
			return nil, fmt.Errorf("applying %s %s: %w", o.GetKind(), o.GetName(), err)
		}
	}
	as := rest.CopyConfig(cfg)
	as.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + OperatorNamespace + ":" + OperatorServiceAccount,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + OperatorNamespace, "system:authenticated"},
	}
	return as, nil
}

func applyRank(o *unstructured.Unstructured) int {
	switch o.GetKind() {
	case "Namespace":
		return 0
	case "CustomResourceDefinition":
		return 1
	}
	return 2
}
