package v1_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

func loadCRD(t *testing.T) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	b, err := os.ReadFile("../../config/crd/bases/db.example.com_postgresclusters.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(b, &crd); err != nil {
		t.Fatal(err)
	}
	return &crd
}

func submatches(ms [][]string) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m[1])
	}
	return out
}

// The CEL rule and its message must name exactly ManagedParameters.
func TestManagedParametersMatchTheCRDRule(t *testing.T) {
	crd := loadCRD(t)
	params := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["postgresql"].Properties["parameters"]
	i := slices.IndexFunc(params.XValidations, func(r apiextensionsv1.ValidationRule) bool {
		return strings.HasPrefix(r.Message, "parameters managed by pgpilot")
	})
	if i < 0 {
		t.Fatalf("no rule on spec.postgresql.parameters refuses the managed parameters: %+v", params.XValidations)
	}
	rule := params.XValidations[i]
	ruleNames := regexp.MustCompile(`'([a-z_]+)'`).FindAllStringSubmatch(rule.Rule, -1)
	_, listed, _ := strings.Cut(rule.Message, ": ")
	for what, names := range map[string][]string{"rule": submatches(ruleNames), "message": strings.Split(listed, ", ")} {
		got := names
		want := slices.Clone(dbv1.ManagedParameters)
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%s names %v, ManagedParameters are %v", what, got, want)
		}
	}
}

func TestCRDNamesAndColumns(t *testing.T) {
	crd := loadCRD(t)
	n := crd.Spec.Names
	if n.Kind != "PostgresCluster" || n.Plural != "postgresclusters" || !slices.Equal(n.ShortNames, []string{"pgc"}) ||
		crd.Spec.Scope != apiextensionsv1.NamespaceScoped {
		t.Errorf("names = %+v, scope %s", n, crd.Spec.Scope)
	}
	v := crd.Spec.Versions[0]
	var cols []string
	for _, c := range v.AdditionalPrinterColumns {
		cols = append(cols, strings.ToUpper(c.Name))
	}
	if want := []string{"VERSION", "INSTANCES", "READY", "PRIMARY", "PHASE", "POOLER", "AGE"}; !slices.Equal(cols, want) {
		t.Errorf("printer columns = %v, want %v", cols, want)
	}
	if v.Subresources == nil || v.Subresources.Status == nil {
		t.Error("the status subresource is not enabled")
	}
}

func TestCheckParameters(t *testing.T) {
	tests := []struct {
		name    string
		pg      dbv1.PostgreSQLSpec
		wantErr string
	}{
		{name: "none", pg: dbv1.PostgreSQLSpec{}},
		{name: "settings and a module's", pg: dbv1.PostgreSQLSpec{Parameters: map[string]string{"work_mem": "8MB", "pg_stat_statements.max": "5000", "fsync": "ON"}}},
		{name: "synchronous_commit remote_apply, asynchronous", pg: dbv1.PostgreSQLSpec{Parameters: map[string]string{"synchronous_commit": "remote_apply"}}},
		{name: "remote_write, synchronous", pg: dbv1.PostgreSQLSpec{SynchronousReplicas: 1, Parameters: map[string]string{"synchronous_commit": "remote_write"}}},
		{name: "unsafe, allowed", pg: dbv1.PostgreSQLSpec{AllowUnsafeDurability: true, SynchronousReplicas: 1,
			Parameters: map[string]string{"fsync": "off", "full_page_writes": "false", "synchronous_commit": "local"}}},
		{name: "a newline in a name", pg: dbv1.PostgreSQLSpec{Parameters: map[string]string{"x = 1\narchive_command": "y"}},
			wantErr: `spec.postgresql.parameters: "x = 1\narchive_command" is not a setting name`},
		{name: "a managed name in capitals", pg: dbv1.PostgreSQLSpec{Parameters: map[string]string{"RESTORE_COMMAND": "touch /tmp/x"}},
			wantErr: "RESTORE_COMMAND is managed by pgpilot or runs a shell command"},
		{name: "a line break in a value", pg: dbv1.PostgreSQLSpec{Parameters: map[string]string{"application_name": "a\rb"}},
			wantErr: "the value of application_name must be one line"},
		{name: "fsync off", pg: dbv1.PostgreSQLSpec{Parameters: map[string]string{"Fsync": " OFF "}},
			wantErr: `Fsync = " OFF " can corrupt the data directory in a crash`},
		{name: "full_page_writes 0", pg: dbv1.PostgreSQLSpec{Parameters: map[string]string{"full_page_writes": "0"}},
			wantErr: `full_page_writes = "0" can corrupt`},
		{name: "synchronous_commit local, synchronous", pg: dbv1.PostgreSQLSpec{SynchronousReplicas: 2, Parameters: map[string]string{"synchronous_commit": "local"}},
			wantErr: `synchronous_commit = "local" acknowledges commits without the primary's commit gate`},
		{name: "synchronous_commit off, asynchronous", pg: dbv1.PostgreSQLSpec{Parameters: map[string]string{"synchronous_commit": "off"}},
			wantErr: `synchronous_commit = "off" acknowledges commits without the primary's commit gate`},
		{name: "libraries by name", pg: dbv1.PostgreSQLSpec{Parameters: map[string]string{"shared_preload_libraries": "pg_stat_statements, auto_explain",
			"dynamic_library_path": "$libdir", "session_preload_libraries": "auto_explain"}}},
		{name: "a preloaded library by path", pg: dbv1.PostgreSQLSpec{Parameters: map[string]string{"shared_preload_libraries": "pg_stat_statements,/var/lib/postgresql/data/evil"}},
			wantErr: `shared_preload_libraries = "pg_stat_statements,/var/lib/postgresql/data/evil" names a library by path`},
		{name: "a session library under $libdir, in capitals", pg: dbv1.PostgreSQLSpec{Parameters: map[string]string{"Session_Preload_Libraries": "$libdir/../../tmp/x"}},
			wantErr: `Session_Preload_Libraries = "$libdir/../../tmp/x" names a library by path`},
		{name: "a local library by path", pg: dbv1.PostgreSQLSpec{Parameters: map[string]string{"local_preload_libraries": "../x"}},
			wantErr: `local_preload_libraries = "../x" names a library by path`},
		{name: "a JIT provider by path", pg: dbv1.PostgreSQLSpec{Parameters: map[string]string{"jit_provider": "../../../tmp/llvmjit"}},
			wantErr: `jit_provider = "../../../tmp/llvmjit" names a library by path`},
		{name: "a library directory", pg: dbv1.PostgreSQLSpec{Parameters: map[string]string{"dynamic_library_path": "/tmp:$libdir"}},
			wantErr: `dynamic_library_path = "/tmp:$libdir" loads libraries from outside PostgreSQL's library directory`},
		{name: "a library directory under $libdir", pg: dbv1.PostgreSQLSpec{Parameters: map[string]string{"dynamic_library_path": "$libdir/plugins"}},
			wantErr: `dynamic_library_path = "$libdir/plugins" loads libraries from outside`},
		{name: "two problems, both said", pg: dbv1.PostgreSQLSpec{Parameters: map[string]string{"fsync": "off", "archive_cleanup_command": "rm -rf /"}},
			wantErr: `spec.postgresql.parameters: archive_cleanup_command is managed by pgpilot or runs a shell command, in any case: remove it; fsync = "off"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.pg.CheckParameters()
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("CheckParameters() = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestParameterName(t *testing.T) {
	for name, ok := range map[string]bool{
		"work_mem": true, "pg_stat_statements.max": true, "_x$1": true, "a.b.c": true,
		"1abc": false, "work-mem": false, "x = 1\narchive_command": false, "": false, "a.": false, ".a": false,
	} {
		if dbv1.ParameterName.MatchString(name) != ok {
			t.Errorf("ParameterName.MatchString(%q) = %v, want %v", name, !ok, ok)
		}
	}
}

// The CEL rule on spec.roles[].inRoles names exactly UnsafeMemberships and pgpilot's
// prefix, and IsUnsafeMembership refuses what the rule does.
func TestUnsafeMembershipsMatchTheCRDRule(t *testing.T) {
	crd := loadCRD(t)
	role := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["roles"].Items.Schema
	i := slices.IndexFunc(role.XValidations, func(r apiextensionsv1.ValidationRule) bool {
		return strings.HasPrefix(r.Message, "inRoles cannot name")
	})
	if i < 0 {
		t.Fatalf("no rule on spec.roles[] refuses unsafe memberships: %+v", role.XValidations)
	}
	rule := role.XValidations[i].Rule
	listed, _, _ := strings.Cut(rule, "&&")
	got := submatches(regexp.MustCompile(`'([a-z_]+)'`).FindAllStringSubmatch(listed, -1))
	if want := dbv1.UnsafeMemberships; !slices.Equal(got, want) {
		t.Errorf("the rule names %v, UnsafeMemberships are %v", got, want)
	}
	if !strings.Contains(rule, "startsWith('"+dbv1.OwnRolePrefix+"')") {
		t.Errorf("the rule does not refuse %s*: %s", dbv1.OwnRolePrefix, rule)
	}
	for role, unsafe := range map[string]bool{"postgres": true, "pg_execute_server_program": true, "pg_read_server_files": true,
		"pg_write_server_files": true, "pgpilot_monitor": true, "pgpilot_replication": true, "pg_monitor": false, "readers": false, "pg_read_all_data": false} {
		if got := dbv1.IsUnsafeMembership(role); got != unsafe {
			t.Errorf("IsUnsafeMembership(%s) = %v, want %v", role, got, unsafe)
		}
	}
}

// The CEL rule on parameters allows for dynamic_library_path what DynamicLibraryPath does.
func TestDynamicLibraryPathMatchesTheCRDRule(t *testing.T) {
	crd := loadCRD(t)
	params := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["postgresql"].Properties["parameters"]
	if !slices.ContainsFunc(params.XValidations, func(r apiextensionsv1.ValidationRule) bool {
		return strings.Contains(r.Rule, "matches('"+dbv1.DynamicLibraryPath.String()+"')")
	}) {
		t.Errorf("no rule on parameters matches dynamic_library_path with %s: %+v", dbv1.DynamicLibraryPath, params.XValidations)
	}
	for _, p := range dbv1.LibraryParameters {
		if !slices.ContainsFunc(params.XValidations, func(r apiextensionsv1.ValidationRule) bool { return strings.Contains(r.Rule, "'"+p+"'") }) {
			t.Errorf("no rule on parameters names %s", p)
		}
	}
}
