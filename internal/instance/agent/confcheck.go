package agent

import (
	"fmt"

	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
)

// configCheck is what postgres last said of the settings the agent wrote (guarded by
// mu): a value it rejects is kept out of the running server at a reload, with nothing
// but a line in its log, and makes the next start fail. The operator reports it and
// restarts no instance while it lasts.
type configCheck struct {
	// key is the settings last checked: spec.postgresql.parameters and what the tuned
	// ones follow. Only they can make the file invalid; the rest is the agent's own.
	key string
	gen int
	// problem is postgres's words, "" when it accepts the file.
	problem string
}

// writeConfig writes the configuration files for in, then has them checked in the
// background when the settings changed: the check runs a postgres process (tens of
// milliseconds), which a promotion or a lockout must not wait for.
func (a *Agent) writeConfig(in pgconf.ConfInput) error {
	if err := a.pg.WriteConfig(in); err != nil {
		return err
	}
	a.checkConfig(fmt.Sprintf("%v %+v %d", in.Cluster.Parameters, in.Cluster.Resources, in.VolumeBytes))
	return nil
}

func (a *Agent) checkConfig(key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if key == a.confCheck.key {
		return
	}
	a.confCheck.key = key
	a.confCheck.gen++
	gen, ctx := a.confCheck.gen, a.runCtx
	go func() {
		problem, err := a.pg.CheckConfig(ctx)
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.confCheck.gen != gen {
			return // a later write is being checked
		}
		if err != nil {
			a.confCheck.key = "" // unknown: check at the next write
			if ctx.Err() == nil {
				a.log.Error(err, "Could not check the configuration")
			}
			return
		}
		if problem == a.confCheck.problem {
			return
		}
		a.confCheck.problem = problem
		if problem != "" {
			a.log.Info("PostgreSQL rejects settings of the configuration: the running server keeps their previous values, and a restart would fail",
				"problem", problem)
		} else {
			a.log.Info("PostgreSQL accepts the configuration")
		}
	}()
}
