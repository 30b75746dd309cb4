package e2b

import (
	"context"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/sandbox"
)

// Header secrets live as long as something refers to them. The values of
// E2B's header transforms are stored as paddock secrets named by a keyed
// hash of host, header and value (headerSecrets), so that sandboxes with
// the same transform share one. A sweep deletes each such secret that no
// sandbox's policy and no snapshot's names any more: after a kill, a
// network update or a snapshot's removal through the facade, and every
// sweepInterval for sandboxes that ended otherwise (a timeout, the native
// API).

// sweepInterval is how often secrets of sandboxes that ended without the
// facade are looked for.
const sweepInterval = 10 * time.Second

// secretUse marks header secrets a create or network update has stored
// but not yet recorded in a policy: a sweep spares them.
type secretUse struct {
	holds    int
	released time.Time
}

// holdSecret marks name as about to be recorded in a policy: a sweep
// spares it until releaseSecrets.
func (s *Server) holdSecret(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	u := s.secretUses[name]
	if u == nil {
		u = &secretUse{}
		s.secretUses[name] = u
	}
	u.holds++
}

// releaseSecrets ends the holds of a policy's header secrets once it is
// recorded (or refused).
func (s *Server) releaseSecrets(p *api.Policy) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for _, n := range bindingNames(p) {
		if u := s.secretUses[n]; u != nil && u.holds > 0 {
			u.holds--
			u.released = now
		}
	}
}

func bindingNames(p *api.Policy) []string {
	if p == nil {
		return nil
	}
	var out []string
	for _, b := range p.Secrets {
		if strings.HasPrefix(b.Name, secretNamePrefix) {
			out = append(out, b.Name)
		}
	}
	return out
}

// sweepSoon asks the sweeper for a sweep without waiting for it.
func (s *Server) sweepSoon() {
	select {
	case s.sweep <- struct{}{}:
	default:
	}
}

// Run sweeps header secrets until ctx ends.
func (s *Server) Run(ctx context.Context) {
	if s.secrets == nil {
		return
	}
	t := time.NewTicker(sweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.sweep:
		}
		if n, err := s.sweepSecrets(ctx); err != nil {
			s.log.Warn("sweeping E2B header secrets", "err", err)
		} else if n > 0 {
			s.log.Debug("swept E2B header secrets", "deleted", n)
		}
	}
}

// sweepSecrets deletes the header secrets nothing refers to and says how
// many. A sandbox whose policy cannot be seen yet (one being created by
// another caller) makes it keep everything until the next sweep.
func (s *Server) sweepSecrets(ctx context.Context) (int, error) {
	if s.secrets == nil {
		return 0, nil
	}
	var stored []string
	for _, n := range s.secrets.List() {
		if strings.HasPrefix(n, secretNamePrefix) {
			stored = append(stored, n)
		}
	}
	if len(stored) == 0 {
		return 0, nil
	}
	start := time.Now()
	used := map[string]bool{}
	for _, sb := range s.mgr.List(ctx, sandbox.Filter{}) {
		if sb.State == api.StateCreating {
			return 0, nil
		}
		for _, n := range bindingNames(sb.Policy) {
			used[n] = true
		}
	}
	snaps, err := s.mgr.Snapshots().List(ctx, "")
	if err != nil {
		return 0, err
	}
	for _, sn := range snaps {
		for _, n := range bindingNames(sn.Policy) {
			used[n] = true
		}
	}
	// Decided and deleted under s.mu, so that a create holding a name
	// either held it before (and is spared) or stores it again after.
	s.mu.Lock()
	defer s.mu.Unlock()
	deleted := 0
	for _, n := range stored {
		if used[n] {
			continue
		}
		if u := s.secretUses[n]; u != nil && (u.holds > 0 || !u.released.Before(start)) {
			continue
		}
		if err := s.secrets.Delete(n); err == nil {
			deleted++
		}
	}
	for n, u := range s.secretUses {
		if u.holds == 0 && u.released.Before(start) {
			delete(s.secretUses, n)
		}
	}
	return deleted, nil
}
