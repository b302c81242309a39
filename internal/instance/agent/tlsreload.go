package agent

import (
	"context"
	"os"
	"time"
)

// keepTLS copies renewed certificates as their Secrets change and has postgres reload
// them (PostgreSQL reads its certificate files again on a reload; connections made
// before keep theirs). Kubelet updates a mounted Secret within a minute or so of its
// change; checking every few seconds adds little to that.
func (a *Agent) keepTLS(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	failing := ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		changed, err := a.cfg.TLS.Sync()
		if err != nil {
			if err.Error() != failing {
				a.log.Error(err, "Keeping the certificates in use: the mounted ones cannot be used")
				failing = err.Error()
			}
			continue
		}
		failing = ""
		if !changed {
			continue
		}
		if a.process() == nil {
			a.log.Info("Certificates changed; postgres reads them when it starts")
			continue
		}
		if err := a.db.Reload(ctx); err != nil {
			a.log.Error(err, "Certificates changed but postgres could not be asked to reload them; retrying")
			// Remove a copy so that the next check writes it again and retries.
			_ = os.Remove(a.cfg.TLS.ServerCert())
			continue
		}
		a.log.Info("Certificates changed; postgres reloaded them")
	}
}
