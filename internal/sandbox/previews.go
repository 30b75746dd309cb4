package sandbox

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// A preview is a URL for a port of a sandbox, guarded by a token scoped to
// that sandbox and port; its record keeps the token's SHA-256 only, so it
// survives restarts and goes with the sandbox (record.Previews).
const (
	maxPreviews        = 64
	defaultPreviewLife = time.Hour
	maxPreviewLife     = 30 * 24 * time.Hour
)

// preview is a preview as the record keeps it.
type preview struct {
	ID        string    `json:"id"`
	Port      int       `json:"port"`
	TokenHash string    `json:"token_sha256,omitempty"` // hex; empty for a public one
	Public    bool      `json:"public,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
}

func (p preview) view(id string) api.Preview {
	return api.Preview{ID: p.ID, Sandbox: id, Port: p.Port, Path: PreviewPath(p.ID), Public: p.Public,
		CreatedAt: p.CreatedAt, ExpiresAt: p.ExpiresAt}
}

// PreviewPath is where preview pid is served on the daemon's listeners.
func PreviewPath(pid string) string { return "/preview/" + pid + "/" }

// CreatePreview makes a preview of a port of sandbox id. Its answer holds
// the token, which nothing can show again.
func (m *Manager) CreatePreview(ctx context.Context, id string, req api.PreviewRequest) (api.Preview, error) {
	life := time.Duration(req.ExpiresSeconds) * time.Second
	switch {
	case req.Port < 1 || req.Port > 65535:
		return api.Preview{}, errdefs.Invalid("port", "%d is not a port (1-65535)", req.Port)
	case req.ExpiresSeconds < 0 || life > maxPreviewLife:
		return api.Preview{}, errdefs.Invalid("expires_seconds", "must be 1 to %d", int64(maxPreviewLife/time.Second))
	case life == 0:
		life = defaultPreviewLife
	}
	b, err := m.lookup(id)
	if err != nil {
		return api.Preview{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	b.rec.Previews = slices.DeleteFunc(b.rec.Previews, func(p preview) bool { return !now.Before(p.ExpiresAt) })
	if len(b.rec.Previews) >= maxPreviews {
		return api.Preview{}, errdefs.New(errdefs.ErrTooMany, "sandbox %s has %d previews; revoke one first", id, len(b.rec.Previews))
	}
	p := preview{ID: id + "." + randomText(8), Port: req.Port, Public: req.Public, CreatedAt: now, ExpiresAt: now.Add(life)}
	token := ""
	if !req.Public {
		token = randomText(32)
		p.TokenHash = tokenHash(token)
	}
	b.rec.Previews = append(b.rec.Previews, p)
	m.persistLocked(b)
	m.log.Info("preview made", "sandbox", id, "preview", p.ID, "port", p.Port, "public", p.Public, "expires", p.ExpiresAt)
	out := p.view(id)
	out.Token = token
	return out, nil
}

// Previews lists sandbox id's previews not expired, without tokens.
func (m *Manager) Previews(ctx context.Context, id string) ([]api.Preview, error) {
	b, err := m.lookup(id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	out := []api.Preview{}
	for _, p := range b.rec.Previews {
		if now.Before(p.ExpiresAt) {
			out = append(out, p.view(id))
		}
	}
	return out, nil
}

// RevokePreviews revokes preview pid of sandbox id, or with pid empty
// every preview of port, and returns how many it revoked.
func (m *Manager) RevokePreviews(ctx context.Context, id, pid string, port int) (int, error) {
	b, err := m.lookup(id)
	if err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	n := len(b.rec.Previews)
	b.rec.Previews = slices.DeleteFunc(b.rec.Previews, func(p preview) bool {
		return p.ID == pid || pid == "" && p.Port == port
	})
	n -= len(b.rec.Previews)
	if n == 0 && pid != "" {
		return 0, errdefs.NotFound("preview", pid)
	}
	if n > 0 {
		m.persistLocked(b)
		m.log.Info("previews revoked", "sandbox", id, "preview", pid, "port", port, "count", n)
	}
	return n, nil
}

// errPreviewDenied is every refusal of a preview's token, alike: it does
// not tell whether the preview exists.
var errPreviewDenied = errdefs.New(errdefs.ErrDenied, "this preview needs its token (paddock port ID PORT --url), or has expired or been revoked")

// OpenPreview checks token against preview pid and returns the sandbox
// and port it reaches.
func (m *Manager) OpenPreview(pid, token string) (id string, port int, err error) {
	id, _, ok := strings.Cut(pid, ".")
	if !ok || !api.IsSandboxID(id) {
		return "", 0, errPreviewDenied
	}
	b, err := m.lookup(id)
	if err != nil {
		return "", 0, errPreviewDenied
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	i := slices.IndexFunc(b.rec.Previews, func(p preview) bool { return p.ID == pid })
	if i < 0 {
		return "", 0, errPreviewDenied
	}
	p := b.rec.Previews[i]
	if !time.Now().Before(p.ExpiresAt) {
		return "", 0, errPreviewDenied
	}
	if !p.Public && subtle.ConstantTimeCompare([]byte(tokenHash(token)), []byte(p.TokenHash)) != 1 {
		return "", 0, errPreviewDenied
	}
	return id, p.Port, nil
}

func tokenHash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// randomText is n random bytes in unpadded URL-safe base64, lower case
// for short ones (they name things in paths).
func randomText(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("reading random bytes: %v", err))
	}
	if n <= 16 {
		return strings.ToLower(hex.EncodeToString(b))
	}
	return base64.RawURLEncoding.EncodeToString(b)
}
