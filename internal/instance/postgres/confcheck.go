package postgres

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// CheckConfig asks postgres whether it would start with the configuration files as
// they are now: `postgres -C data_directory` reads postgresql.conf and its includes as a
// start does, prints one setting and exits, beside a running postmaster too. It
// returns what postgres says is wrong, in its own words ("invalid value for parameter
// \"work_mem\": \"lots\""), and "" when it accepts them. A running postmaster that
// reloads a file it refuses keeps the previous value of each setting it rejects (of
// every setting, for an unrecognized name), and the next start fails; a reload says so
// only in its log.
//
// Checks that need the whole server (superuser_reserved_connections below
// max_connections) are made at a start only; the operator refuses those before it
// renders.
func (p *Postgres) CheckConfig(ctx context.Context) (string, error) {
	out, err := p.run(ctx, "postgres", "-D", p.PGData, "-C", "data_directory")
	var exit *exec.ExitError
	if err == nil || !errors.As(err, &exit) || ctx.Err() != nil {
		return "", err
	}
	// Not a configuration it refuses (the data directory gone while it is replaced,
	// say): nothing to tell of the configuration.
	if !strings.Contains(string(out), "contains errors") {
		return "", err
	}
	return ConfigComplaint(string(out)), nil
}

// ConfigComplaint is the messages of postgres's output about its configuration: each
// LOG line with its HINT, without the log line prefix, and the FATAL line only when
// nothing else was said.
func ConfigComplaint(out string) string {
	var msgs []string
	fatal := ""
	for _, line := range strings.Split(out, "\n") {
		for _, level := range []string{"LOG:", "HINT:", "DETAIL:", "FATAL:"} {
			_, msg, ok := strings.Cut(line, level)
			if !ok {
				continue
			}
			msg = strings.TrimSpace(msg)
			switch {
			case level == "FATAL:":
				fatal = msg
			case level == "LOG:":
				msgs = append(msgs, msg)
			case len(msgs) > 0:
				msgs[len(msgs)-1] += " (" + msg + ")"
			}
			break
		}
	}
	if len(msgs) == 0 {
		if fatal == "" {
			return strings.TrimSpace(out)
		}
		return fatal
	}
	return strings.Join(msgs, "; ")
}

// SharedBuffers is the shared memory for buffers the configuration files give postgres
// at its next start, in bytes: shared_buffers in pages times the block size, as
// `postgres -C` reads them.
func (p *Postgres) SharedBuffers(ctx context.Context) (int64, error) {
	var v [2]int64
	for i, name := range []string{"shared_buffers", "block_size"} {
		out, err := p.run(ctx, "postgres", "-D", p.PGData, "-C", name)
		if err != nil {
			return 0, err
		}
		if v[i], err = strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64); err != nil {
			return 0, fmt.Errorf("postgres -C %s said %q", name, LastLines(out, 1))
		}
	}
	return v[0] * v[1], nil
}
