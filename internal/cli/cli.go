// Package cli is kubectl pgpilot, the kubectl plugin for PostgresClusters: status,
// switchover, backup, restart, psql and logs, with kubectl's own flags (kubeconfig,
// --context, --namespace, ...) and shell completion.
package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

// Options are what every command needs, made from kubectl's flags before it runs.
type Options struct {
	Flags   *genericclioptions.ConfigFlags
	Streams genericiooptions.IOStreams
	// Client reads and writes PostgresClusters and their objects; Namespace is the
	// namespace the flags and kubeconfig say.
	Client    client.Client
	Namespace string
	// Exec runs a command in an instance's postgres container and returns its output;
	// nil where pods cannot be reached.
	Exec func(ctx context.Context, namespace, pod string, command []string) (string, error)
	// Kubectl runs kubectl with the user's connection flags, attached to the terminal
	// (psql, logs). Tests replace it.
	Kubectl func(args ...string) error
	// Now is the clock.
	Now func() time.Time
}

// NewCommand returns kubectl pgpilot.
func NewCommand(streams genericiooptions.IOStreams) *cobra.Command {
	o := &Options{Flags: genericclioptions.NewConfigFlags(true), Streams: streams, Now: time.Now}
	root := &cobra.Command{
		// The binary's name, so that completion scripts define functions of their own
		// (not kubectl's); help shows it as kubectl shows plugins.
		Use:         "kubectl-pgpilot",
		Annotations: map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl pgpilot"},
		Short:       "Look after pgpilot's PostgresClusters",
		Long: `kubectl pgpilot shows and acts on pgpilot's PostgresClusters (db.example.com/v1).

It takes kubectl's connection flags (--kubeconfig, --context, --namespace, ...).
Shell completion: kubectl pgpilot completion bash|zsh|fish|powershell; for kubectl's own
completion of plugins, put kubectl_complete-pgpilot (make plugin builds it) on PATH.`,
		SilenceUsage: true,
	}
	o.Flags.AddFlags(root.PersistentFlags())
	root.SetIn(streams.In)
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)
	root.AddCommand(o.statusCommand(), o.switchoverCommand(), o.backupCommand(), o.restartCommand(), o.psqlCommand(), o.logsCommand())
	return root
}

// Scheme has the Kubernetes types and pgpilot's.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, dbv1.AddToScheme(s)
}

// connected connects before run runs: help and completion scripts need no cluster.
func (o *Options) connected(run func(*cobra.Command, []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		if err := o.complete(); err != nil {
			return err
		}
		return run(cmd, args)
	}
}

// complete connects, unless a test already did.
func (o *Options) complete() error {
	if o.Client != nil {
		return nil
	}
	cfg, err := o.Flags.ToRESTConfig()
	if err != nil {
		return err
	}
	ns, _, err := o.Flags.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return err
	}
	scheme, err := Scheme()
	if err != nil {
		return err
	}
	if o.Client, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return err
	}
	o.Namespace = ns
	o.Exec = execFunc(cfg)
	o.Kubectl = o.runKubectl
	return nil
}

// execFunc runs commands in the postgres container through the API server's exec.
func execFunc(cfg *rest.Config) func(ctx context.Context, namespace, pod string, command []string) (string, error) {
	return func(ctx context.Context, namespace, pod string, command []string) (string, error) {
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return "", err
		}
		req := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(namespace).Name(pod).SubResource("exec").
			VersionedParams(&corev1.PodExecOptions{Container: "postgres", Command: command, Stdout: true, Stderr: true}, clientgoscheme.ParameterCodec)
		ex, err := remotecommand.NewSPDYExecutor(cfg, "POST", req.URL())
		if err != nil {
			return "", err
		}
		var stdout, stderr bytes.Buffer
		if err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr}); err != nil {
			return "", fmt.Errorf("%s in %s: %w: %s", command[0], pod, err, strings.TrimSpace(stderr.String()))
		}
		return stdout.String(), nil
	}
}

// kubectlFlags are the user's connection flags, for a kubectl run by the plugin.
func (o *Options) kubectlFlags() []string {
	var out []string
	for _, f := range []struct {
		name string
		v    *string
	}{
		{"--kubeconfig", o.Flags.KubeConfig}, {"--context", o.Flags.Context}, {"--cluster", o.Flags.ClusterName},
		{"--user", o.Flags.AuthInfoName}, {"--server", o.Flags.APIServer}, {"--token", o.Flags.BearerToken},
		{"--as", o.Flags.Impersonate}, {"--certificate-authority", o.Flags.CAFile},
		{"--client-certificate", o.Flags.CertFile}, {"--client-key", o.Flags.KeyFile}, {"--request-timeout", o.Flags.Timeout},
	} {
		if f.v != nil && *f.v != "" && (f.name != "--request-timeout" || *f.v != "0") {
			out = append(out, f.name+"="+*f.v)
		}
	}
	if o.Flags.Insecure != nil && *o.Flags.Insecure {
		out = append(out, "--insecure-skip-tls-verify")
	}
	return append(out, "--namespace="+o.Namespace)
}

// runKubectl runs kubectl (the one that runs this plugin, else the one on PATH) with the
// user's flags, attached to the terminal.
func (o *Options) runKubectl(args ...string) error {
	kubectl := "kubectl"
	if p, err := exec.LookPath("kubectl"); err == nil {
		kubectl = p
	}
	cmd := exec.Command(kubectl, append(o.kubectlFlags(), args...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = o.Streams.In, o.Streams.Out, o.Streams.ErrOut
	return cmd.Run()
}

func (o *Options) cluster(ctx context.Context, name string) (*dbv1.PostgresCluster, error) {
	var c dbv1.PostgresCluster
	if err := o.Client.Get(ctx, client.ObjectKey{Namespace: o.Namespace, Name: name}, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// completeClusters completes a cluster name in the namespace.
func (o *Options) completeClusters(_ *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 || o.complete() != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var list dbv1.PostgresClusterList
	if err := o.Client.List(context.Background(), &list, client.InNamespace(o.Namespace)); err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	for _, c := range list.Items {
		out = append(out, c.Name)
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// instances are the cluster's instance pods' names, by ordinal.
func instances(c *dbv1.PostgresCluster) []string {
	var out []string
	for i := range int(c.Spec.Replicas) {
		out = append(out, c.InstanceName(i))
	}
	return out
}

func (o *Options) statusCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "status CLUSTER",
		Short: "Show a cluster's instances, roles, replication lag, timeline, last failover, backups and conditions",
		Example: `  kubectl pgpilot status my-db
  kubectl pgpilot status my-db -o json`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: o.completeClusters,
		RunE: o.connected(func(cmd *cobra.Command, args []string) error {
			obs, err := o.observe(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			st := Summarize(obs)
			switch output {
			case "json":
				return printJSON(o.Streams.Out, st)
			case "":
				return printStatus(o.Streams.Out, st, o.Now())
			}
			return fmt.Errorf("--output %q: want json, or nothing for a table", output)
		}),
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "Output format: json, or a table for people when empty.")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"json"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

func (o *Options) switchoverCommand() *cobra.Command {
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "switchover CLUSTER INSTANCE",
		Short: "Move the primary to another instance (db.example.com/switchover-to), without losing an acknowledged commit",
		Long: `switchover asks the operator to move the primary to INSTANCE, as the annotation
db.example.com/switchover-to does: the primary hands over, INSTANCE is promoted once it has
the primary's final WAL, else the old primary resumes (docs/failover.md). With --wait it
waits until INSTANCE is the primary, or the operator refused.`,
		Example:           `  kubectl pgpilot switchover my-db my-db-2 --wait 1m`,
		Args:              cobra.ExactArgs(2),
		ValidArgsFunction: o.completeInstance,
		RunE: o.connected(func(cmd *cobra.Command, args []string) error {
			return o.switchover(cmd.Context(), args[0], args[1], wait)
		}),
	}
	cmd.Flags().DurationVar(&wait, "wait", 0, "How long to wait for the switchover to finish; 0 does not wait.")
	return cmd
}

// completeInstance completes a cluster, then one of its instances.
func (o *Options) completeInstance(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) == 0 {
		return o.completeClusters(cmd, args, toComplete)
	}
	if len(args) > 1 || o.complete() != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	c, err := o.cluster(context.Background(), args[0])
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return slices.DeleteFunc(instances(c), func(s string) bool { return s == c.Status.CurrentPrimary }), cobra.ShellCompDirectiveNoFileComp
}

func (o *Options) backupCommand() *cobra.Command {
	var wait time.Duration
	cmd := &cobra.Command{
		Use:               "backup CLUSTER",
		Short:             "Take a base backup now (creates a PostgresBackup)",
		Example:           `  kubectl pgpilot backup my-db --wait 10m`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: o.completeClusters,
		RunE: o.connected(func(cmd *cobra.Command, args []string) error {
			return o.backup(cmd.Context(), args[0], wait)
		}),
	}
	cmd.Flags().DurationVar(&wait, "wait", 0, "How long to wait for the backup to complete; 0 does not wait.")
	return cmd
}

func (o *Options) restartCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "restart CLUSTER",
		Short: "Restart every instance, one at a time: replicas first, then a switchover, then the old primary",
		Long: `restart sets the cluster's db.example.com/restartedAt annotation to now; the operator
copies it into the pod template, and the rolling update restarts the instances in its
safe order (docs/operations.md), as kubectl rollout restart does for a Deployment.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: o.completeClusters,
		RunE: o.connected(func(cmd *cobra.Command, args []string) error {
			return o.restart(cmd.Context(), args[0])
		}),
	}
}

func (o *Options) psqlCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "psql CLUSTER [-- PSQL ARGS...]",
		Short: "Open psql on the cluster's read-write Service as the application owner",
		Long: `psql runs psql in one of the cluster's instances (kubectl exec), connected to the
<cluster>-rw Service over TLS (verify-full, the cluster's CA) as the application owner,
with the password the pod mounts from <cluster>-app: the password never leaves the pod.
Arguments after -- go to psql.`,
		Example: `  kubectl pgpilot psql my-db
  kubectl pgpilot psql my-db -- -c 'SELECT 1'`,
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: o.completeClusters,
		RunE: o.connected(func(cmd *cobra.Command, args []string) error {
			return o.psql(cmd.Context(), args[0], args[1:])
		}),
	}
}

func (o *Options) logsCommand() *cobra.Command {
	var follow bool
	var since time.Duration
	var tail int
	cmd := &cobra.Command{
		Use:   "logs CLUSTER [INSTANCE]",
		Short: "Show the postgres container's logs (the agent and PostgreSQL) of every instance, or of one",
		Example: `  kubectl pgpilot logs my-db -f
  kubectl pgpilot logs my-db my-db-1 --since 10m`,
		Args:              cobra.RangeArgs(1, 2),
		ValidArgsFunction: o.completeInstance,
		RunE: o.connected(func(cmd *cobra.Command, args []string) error {
			c, err := o.cluster(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return o.Kubectl(logsArgs(c, args[1:], follow, since, tail)...)
		}),
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "Follow the logs.")
	cmd.Flags().DurationVar(&since, "since", 0, "Only logs newer than this.")
	cmd.Flags().IntVar(&tail, "tail", -1, "Lines of each instance's recent log to show; -1 for all.")
	return cmd
}

// logsArgs are kubectl logs' arguments for the cluster's instances, or one of them.
func logsArgs(c *dbv1.PostgresCluster, instance []string, follow bool, since time.Duration, tail int) []string {
	args := []string{"logs", "--container=postgres", fmt.Sprintf("--tail=%d", tail)}
	if len(instance) == 1 {
		args = append(args, instance[0])
	} else {
		args = append(args, "--selector="+dbv1.LabelCluster+"="+c.Name, "--prefix", fmt.Sprintf("--max-log-requests=%d", max(c.Spec.Replicas, 5)))
	}
	if follow {
		args = append(args, "--follow")
	}
	if since > 0 {
		args = append(args, "--since="+since.String())
	}
	return args
}

// Main runs kubectl pgpilot with os.Args and returns the exit code.
func Main() int {
	// controller-runtime's client logs nothing a user of the plugin needs.
	ctrllog.SetLogger(logr.Discard())
	cmd := NewCommand(genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr})
	if err := cmd.Execute(); err != nil {
		return 1
	}
	return 0
}
