package agent

import (
	"context"
	"fmt"

	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
	"github.com/pgpilot/pgpilot/internal/protocol/tuning"
)

// configCheck is what postgres last said of the settings the agent wrote (guarded by
// mu): a value it rejects is kept out of the running server at a reload, with nothing
// but a line in its log, and makes the next start fail; a shared_buffers larger than
// the memory it has gets postgres killed later. The operator reports either and
// restarts no instance while it lasts.
type configCheck struct {
	// key is the settings last checked: spec.postgresql.parameters and what the tuned
	// ones follow. Only they can make the file invalid; the rest is the agent's own.
	key string
	// gen counts the checks started, done is the last one finished: while they differ
	// the agent reports no setting waiting for a restart, so that the restart
	// controller never restarts an instance with settings not yet checked.
	gen, done int
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

// fitsMemory says why shared_buffers as written cannot fit this container's memory, ""
// when it can. PostgreSQL accepts any value its shared memory can be mapped for, and
// with memory overcommitted that is more than the machine has: it would be killed once
// its buffers fill. The operator refuses it against a memory limit before it renders;
// this is for a container without one, and limits the operator does not know.
func (a *Agent) fitsMemory(ctx context.Context) (string, error) {
	mem, limited := memoryOf()
	if mem == 0 {
		return "", nil
	}
	buffers, err := a.pg.SharedBuffers(ctx)
	if err != nil || buffers < mem {
		return "", err
	}
	of := "the machine's: the container has no memory limit"
	if limited {
		of = "the container's memory limit"
	}
	return fmt.Sprintf("shared_buffers %s does not fit in the %s this instance has (%s): postgres would be killed once its buffers fill; "+
		"lower shared_buffers, or set spec.resources.limits.memory and leave shared_buffers to pgpilot (a quarter of the limit)", tuning.Memory(buffers), tuning.Memory(mem), of), nil
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
		if err == nil && problem == "" {
			problem, err = a.fitsMemory(ctx)
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.confCheck.gen != gen {
			return // a later write is being checked
		}
		a.confCheck.done = gen
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
