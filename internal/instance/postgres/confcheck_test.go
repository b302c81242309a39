package postgres

import "testing"

func TestConfigComplaint(t *testing.T) {
	for _, tc := range []struct{ out, want string }{
		{`2026-11-28 10:17:51.629 UTC [7570] LOG:  invalid value for parameter "work_mem": "10000000000"
2026-11-28 10:17:51.629 UTC [7570] HINT:  Value exceeds integer range.
2026-11-28 10:17:51.629 UTC [7570] LOG:  invalid value for parameter "shared_buffers": "lots"
2026-11-28 10:17:51.629 UTC [7570] FATAL:  configuration file "/d/postgresql.conf" contains errors
`, `invalid value for parameter "work_mem": "10000000000" (Value exceeds integer range.); invalid value for parameter "shared_buffers": "lots"`},
		{`2026-11-28 10:17:51.814 GMT [7585] LOG:  unrecognized configuration parameter "no_such" in file "/d/postgresql.conf" line 819
2026-11-28 10:17:51.814 GMT [7585] FATAL:  configuration file "/d/postgresql.conf" contains errors`,
			`unrecognized configuration parameter "no_such" in file "/d/postgresql.conf" line 819`},
		{`FATAL:  could not access directory "/x": Permission denied`, `could not access directory "/x": Permission denied`},
		{"postgres: something else\n", "postgres: something else"},
	} {
		if got := ConfigComplaint(tc.out); got != tc.want {
			t.Errorf("ConfigComplaint(%q)\n got %q\nwant %q", tc.out, got, tc.want)
		}
	}
}
