package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/cli"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// plugin runs kubectl pgpilot in this process, as a cluster admin through a kubeconfig
// file (kubectl's flags), and returns what it printed.
func plugin(t *testing.T, kubeconfig string, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := cli.NewCommand(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	cmd.SetArgs(append([]string{"--kubeconfig", kubeconfig}, args...))
	err := cmd.ExecuteContext(context.Background())
	return out.String() + errOut.String(), err
}

// kubectl pgpilot on a real API server and the operator, for what needs no running
// pods: status (text and JSON; the replication part says why it is unknown, since no
// kubelet runs here), switchover, backup, restart (the operator puts the annotation
// into the pod template), errors, and shell completion.
func TestKubectlPlugin(t *testing.T) {
	admin, err := env.AddUser(envtest.User{Name: "plugin-user", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := admin.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t)
	withVolumeBackup := func(c *dbv1.PostgresCluster) {
		c.Spec.Backup = &dbv1.BackupSpec{Store: dbv1.BackupStore{Volume: &dbv1.VolumeStore{ClaimName: "backups"}}}
	}
	startHealthy(t, newCluster(ns, "plug", withVolumeBackup))
	create(t, newCluster(ns, "nobackup"))

	out, err := plugin(t, kubeconfig, "-n", ns, "status", "plug")
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	for _, want := range []string{"Cluster plug in " + ns + ": Healthy, PostgreSQL 16, 3 of 3 instances ready",
		"Primary:       plug-0", "Last failover: none", "Last backup:   none", "Replication:   unknown (",
		"plug-1    replica  true", "Ready"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	out, err = plugin(t, kubeconfig, "-n", ns, "status", "plug", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var st cli.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status -o json is not JSON: %v\n%s", err, out)
	}
	if st.Primary != "plug-0" || st.Phase != dbv1.PhaseHealthy || len(st.Instances) != 3 || st.Instances[0].Role != dbv1.RolePrimary {
		t.Errorf("status -o json: %+v", st)
	}

	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"status", "nope"}, "not found"},
		{[]string{"switchover", "plug", "plug-0"}, "plug-0 is the primary already"},
		{[]string{"switchover", "plug", "plug-7"}, "plug-7 is not an instance of plug"},
		{[]string{"backup", "nobackup"}, "nobackup has no spec.backup"},
		{[]string{"status", "plug", "-o", "yaml"}, `--output "yaml"`},
	} {
		if out, err := plugin(t, kubeconfig, append([]string{"-n", ns}, tc.args...)...); err == nil || !strings.Contains(out, tc.says) {
			t.Errorf("kubectl pgpilot %v: %v, printed %q; want an error saying %q", tc.args, err, out, tc.says)
		}
	}

	// backup: a PostgresBackup of the cluster.
	if out, err := plugin(t, kubeconfig, "-n", ns, "backup", "plug"); err != nil || !strings.Contains(out, "Created PostgresBackup plug-manual-") {
		t.Errorf("backup: %v\n%s", err, out)
	}
	var backups dbv1.PostgresBackupList
	if err := k8s.List(context.Background(), &backups, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(backups.Items) != 1 || backups.Items[0].Spec.Cluster.Name != "plug" || !strings.HasPrefix(backups.Items[0].Name, "plug-manual-") {
		t.Errorf("backups: %+v", backups.Items)
	}

	// restart: the annotation, then the StatefulSet's pod template carries it.
	if out, err := plugin(t, kubeconfig, "-n", ns, "restart", "plug"); err != nil {
		t.Fatalf("restart: %v\n%s", err, out)
	}
	var c dbv1.PostgresCluster
	if err := get(ns, "plug", &c); err != nil {
		t.Fatal(err)
	}
	at := c.Annotations[dbv1.AnnotationRestartedAt]
	if at == "" {
		t.Fatal("restart set no annotation")
	}
	testutil.Eventually(t, timeout, func() error {
		var sts appsv1.StatefulSet
		if err := get(ns, "plug", &sts); err != nil {
			return err
		}
		if got := sts.Spec.Template.Annotations[dbv1.AnnotationRestartedAt]; got != at {
			return fmt.Errorf("pod template restartedAt %q, want %q", got, at)
		}
		return nil
	})

	// Completion: cluster names, then the instances a switchover can go to.
	out, err = plugin(t, kubeconfig, "-n", ns, "__complete", "status", "")
	if err != nil || !strings.Contains(out, "plug\n") || !strings.Contains(out, "nobackup\n") {
		t.Errorf("completing a cluster: %v\n%s", err, out)
	}
	out, err = plugin(t, kubeconfig, "-n", ns, "__complete", "switchover", "plug", "")
	if err != nil || !strings.Contains(out, "plug-1\nplug-2\n") || strings.Contains(out, "plug-0\n") {
		t.Errorf("completing an instance: %v\n%s", err, out)
	}
	// switchover: the annotation the failover controller carries out (here it cannot
	// reach the agents, so it may refuse it at once: either shows the request arrived).
	if out, err := plugin(t, kubeconfig, "-n", ns, "switchover", "plug", "plug-2"); err != nil || !strings.Contains(out, "Asked for a switchover of plug to plug-2") {
		t.Fatalf("switchover: %v\n%s", err, out)
	}
	testutil.Eventually(t, timeout, func() error {
		if err := get(ns, "plug", &c); err != nil {
			return err
		}
		if c.Annotations[dbv1.AnnotationSwitchoverTo] == "plug-2" {
			return nil
		}
		var events corev1.EventList
		if err := k8s.List(context.Background(), &events, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range events.Items {
			if e.Reason == dbv1.ReasonSwitchoverRefused && strings.Contains(e.Message, "plug-2") {
				return nil
			}
		}
		return fmt.Errorf("neither the annotation nor a refusal of the switchover to plug-2")
	})

	// And the scripts for the shells.
	if out, err := plugin(t, kubeconfig, "completion", "bash"); err != nil || !strings.Contains(out, "__start_kubectl-pgpilot") {
		t.Errorf("completion bash: %v\n%.200s", err, out)
	}
}
