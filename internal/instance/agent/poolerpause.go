package agent

import (
	"context"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// poolerPauseTimeout bounds how long a primary's handover waits for its poolers to
// pause: the transactions in flight through them end meanwhile. Past it the handover
// goes on; a pooler that did not answer leaves its clients the errors they would have
// had without it.
const poolerPauseTimeout = 2 * time.Second

// pausePoolers asks every pod of the cluster's read-write pooler (spec.pooler) to hold
// its clients' queries while the Lease names this instance in term, and waits for
// their answers (docs/pooler.md, "The handover, seen from the pooler"). A pooler pauses
// once the transactions in flight through it end, and holds new queries; the lockout
// that follows then finds no session of a pooler to end, and the pooler resumes on the
// new primary. Best effort: a planned handover never waits on a pooler for long.
func (a *Agent) pausePoolers(ctx context.Context, term int32) {
	a.mu.Lock()
	pooler := a.cluster.Pooler
	a.mu.Unlock()
	// In session mode a PAUSE waits for every client to disconnect: it would only hold
	// the handover for poolerPauseTimeout, and the lockout ends the sessions anyway.
	if pooler == nil || pooler.Headless == "" || pooler.Mode == "session" {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, poolerPauseTimeout)
	defer cancel()
	start := time.Now()
	addresses, err := a.poolerAddresses(ctx, pooler.Headless)
	if err != nil {
		a.log.Info("Could not find the pooler's pods to pause them; handing over without", "service", pooler.Headless, "error", err.Error())
		return
	}
	serverName := pooler.Headless + "." + a.cfg.Namespace + ".svc"
	client := a.peerHTTP.For(serverName, "", a.cfg.TLS.Roots)
	req := agentapi.PoolerPauseRequest{Primary: a.cfg.PodName, Term: term}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		paused int
		failed []string
	)
	for _, addr := range addresses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := agentapi.NewClient("https://"+addr, a.cfg.Credentials.PeerToken(), client).PausePooler(ctx, req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed = append(failed, addr+": "+err.Error())
				return
			}
			paused++
		}()
	}
	wg.Wait()
	a.log.Info("Asked the pooler to hold its clients' queries before the handover", "paused", paused, "of", len(addresses),
		"took", time.Since(start).Round(time.Millisecond).String(), "failed", failed)
}

// poolerAddresses are the pooler pods' agent addresses (host:port): the cluster's
// override (tests), or every address behind the pooler's headless Service, which
// publishes them ready or not.
func (a *Agent) poolerAddresses(ctx context.Context, headless string) ([]string, error) {
	if a.cfg.PoolerAddresses != nil {
		return a.cfg.PoolerAddresses, nil
	}
	ips, err := net.DefaultResolver.LookupHost(ctx, headless+"."+a.cfg.Namespace+".svc")
	if err != nil {
		return nil, err
	}
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i] = net.JoinHostPort(ip, strconv.Itoa(agentapi.Port))
	}
	return out, nil
}
