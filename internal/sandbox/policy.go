package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// Policy returns a sandbox's network policy (empty: nothing reachable).
func (m *Manager) Policy(ctx context.Context, id string) (api.Policy, error) {
	b, err := m.lookup(id)
	if err != nil {
		return api.Policy{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.rec.Policy == nil {
		return api.Policy{}, nil
	}
	return *b.rec.Policy, nil
}

// SetPolicy replaces a sandbox's network policy. A running sandbox's new
// connections and requests follow it at once; connections already
// spliced through keep going. Placeholders of newly bound secrets reach
// processes started after the sandbox is next resumed (and its
// /run/paddock tree at once).
func (m *Manager) SetPolicy(ctx context.Context, id string, p api.Policy) (api.Policy, error) {
	if m.cfg.Egress == nil {
		return api.Policy{}, errdefs.New(errdefs.ErrUnavailable, "this daemon has no network egress; a policy cannot be applied")
	}
	if err := m.cfg.Egress.ValidatePolicy(&p); err != nil {
		return api.Policy{}, err
	}
	b, err := m.lookup(id)
	if err != nil {
		return api.Policy{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	mv, err := next(b, actPolicy)
	if err != nil {
		return api.Policy{}, err
	}
	if mv.step == stepLive {
		if _, err := m.cfg.Egress.SetPolicy(id, withGrants(&p, b.rec.Requests, time.Now())); err != nil {
			return api.Policy{}, fmt.Errorf("applying policy: %w", err)
		}
	}
	b.rec.Policy = &p
	m.persistLocked(b)
	b.touch()
	m.notify(b).Event(id, "policy", "policy replaced", p)
	m.log.Info("policy replaced", "sandbox", id, "allow", len(p.Allow), "deny", len(p.Deny), "presets", p.Presets, "secrets", len(p.Secrets))
	return p, nil
}
