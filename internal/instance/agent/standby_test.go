package agent

import "testing"

func TestWALRemovedUpstream(t *testing.T) {
	const removed = `2026-11-23 07:29:37.349 GMT [530] LOG:  started streaming WAL from primary at 0/5000000 on timeline 2
2026-11-23 07:29:37.349 GMT [530] FATAL:  could not receive data from WAL stream: ERROR:  requested WAL segment 000000020000000000000005 has already been removed
2026-11-23 07:29:37.350 GMT [29] LOG:  waiting for WAL to become available at 0/50000B8
`
	for _, tc := range []struct {
		name, log string
		want      bool
	}{
		{"the primary removed the WAL", removed, true},
		{"then the primary went away", removed + `2026-11-23 07:29:38.100 GMT [533] FATAL:  could not connect to the primary server: connection to server at "my-db-2" failed: Connection refused
`, false},
		{"streaming again", removed + `2026-11-23 07:29:40.000 GMT [540] LOG:  started streaming WAL from primary at 0/6000000 on timeline 3
`, true},
		// Clients connecting while the standby is not consistent yet get FATALs of
		// their own, between the WAL receiver's (seen in test/pg under load: the standby
		// then waited for ever instead of being cloned again).
		{"clients refused meanwhile", removed + `2026-11-23 07:29:37.400 GMT [531] FATAL:  the database system is starting up
2026-11-23 07:29:37.500 GMT [532] FATAL:  the database system is not yet accepting connections
`, true},
		{"nothing wrong", "2026-11-23 07:29:40.000 GMT [540] LOG:  started streaming WAL from primary at 0/6000000 on timeline 3\n", false},
		{"empty", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := walRemovedUpstream(tc.log); got != tc.want {
				t.Errorf("walRemovedUpstream = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestLastFatal(t *testing.T) {
	log := "2026-11-24 LOG:  started streaming\n" +
		"2026-11-24 FATAL:  database system identifier differs between the primary and standby\n" +
		"2026-11-24 DETAIL:  The primary's identifier is 1, the standby's identifier is 2.\n"
	if got := lastFatal(log); got != "database system identifier differs between the primary and standby" {
		t.Errorf("lastFatal = %q", got)
	}
	if got := lastFatal("LOG: fine\n"); got != "" {
		t.Errorf("lastFatal without a FATAL = %q", got)
	}
}
