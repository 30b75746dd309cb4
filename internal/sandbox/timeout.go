package sandbox

import (
	"context"
	"time"

	"github.com/paddock-dev/paddock/api"
)

// SetTimeout sets a sandbox's timeout to be up d from now (it is then
// removed or paused, as its OnTimeout says); 0 clears it.
func (m *Manager) SetTimeout(ctx context.Context, id string, d time.Duration) (api.Sandbox, error) {
	b, err := m.lookup(id)
	if err != nil {
		return api.Sandbox{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, err := m.lookup(id); err != nil {
		return api.Sandbox{}, err // deleted while we waited for the lock
	}
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	b.rec.ExpiresAt = nil
	if d > 0 {
		exp := time.Now().UTC().Add(d)
		b.rec.ExpiresAt = &exp
		m.armTimer(b)
	}
	m.persistLocked(b)
	return b.viewLocked(), nil
}
