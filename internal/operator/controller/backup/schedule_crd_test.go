package backup

import (
	"os"
	"regexp"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// scheduleRule is the regular expression of the CRD's rule on spec.backup.schedule.
func scheduleRule(t *testing.T) *regexp.Regexp {
	t.Helper()
	b, err := os.ReadFile("../../../../config/crd/bases/db.example.com_postgresclusters.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(b, &crd); err != nil {
		t.Fatal(err)
	}
	schedule := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["backup"].Properties["schedule"]
	if len(schedule.XValidations) != 1 {
		t.Fatalf("spec.backup.schedule has %d rules, want 1", len(schedule.XValidations))
	}
	rule := schedule.XValidations[0].Rule
	re, prefixed := strings.CutPrefix(rule, "self.matches('")
	re, suffixed := strings.CutSuffix(re, "')")
	if !prefixed || !suffixed {
		t.Fatalf("the rule is not self.matches('...'): %s", rule)
	}
	// CEL's matches is RE2, as Go's regexp is.
	return regexp.MustCompile(re)
}

// Admission (the CRD's rule) refuses what the controller's parser refuses, but for a
// range that runs backwards, which only the parser tells; and it never refuses what the
// parser takes.
func TestScheduleRuleAgreesWithTheParser(t *testing.T) {
	re := scheduleRule(t)
	valid := []string{
		"0 3 * * *", "@daily", "@hourly", "@weekly", "@monthly", "@yearly", "@annually", "@midnight",
		"@every 6h", "@every 1h30m", "@every 90s", "*/15 * * * *", "0 0 1 * *", "0 0 * * 0",
		"0 3 * * SUN", "0 3 * * mon-fri", "0 3 1 JAN,jul *", "5,35 1-5/2 * * *", "59 23 31 12 6",
		"0 3 ? * *", " 0 3 * * * ", "0 0/6 * * *", "00 03 01 01 0",
	}
	invalid := []string{
		"", "daily", "@sometimes", "@every", "@every six hours", "0 3 * *", "0 3 * * * *",
		"60 3 * * *", "0 24 * * *", "0 3 32 * *", "0 3 0 * *", "0 3 * 13 *", "0 3 * * 7",
		"0 3 * * funday", "*/0 * * * *", "0 3 * * * # nightly", "TZ=Europe/Paris 0 3 * * *",
		"CRON_TZ=UTC 0 3 * * *", "0 3 * * *\n0 4 * * *", "- * * * *",
	}
	for _, s := range valid {
		if _, err := ParseSchedule(s); err != nil {
			t.Errorf("%q: the parser refuses it: %v", s, err)
		}
		if !re.MatchString(s) {
			t.Errorf("%q: admission refuses a schedule the controller takes", s)
		}
	}
	for _, s := range invalid {
		if _, err := ParseSchedule(s); err == nil {
			t.Errorf("%q: the parser takes it", s)
		}
		if re.MatchString(s) {
			t.Errorf("%q: admission takes a schedule the controller refuses", s)
		}
	}
	// Only the parser tells a range that runs backwards.
	if _, err := ParseSchedule("0 5-3 * * *"); err == nil || !re.MatchString("0 5-3 * * *") {
		t.Errorf("a backwards range: parser %v, admission takes it %v; want the parser alone to refuse it", err, re.MatchString("0 5-3 * * *"))
	}
}
