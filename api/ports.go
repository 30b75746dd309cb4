package api

import "time"

// PortRequest is the body of POST /v1/sandboxes/{id}/ports.
type PortRequest struct {
	// Port is the port in the sandbox to forward (1-65535); required, so
	// a missing one is told apart from 0.
	Port *int `json:"port"`
}

// PortForward is a host forward: a listener on the daemon host's loopback
// that carries each connection to a port in a sandbox.
type PortForward struct {
	// Port is the port in the sandbox.
	Port int `json:"port"`
	// HostAddress is where the forward listens: "127.0.0.1:N" on the
	// daemon's host.
	HostAddress string `json:"host_address"`
	// Connections is how many connections the forward carries now.
	Connections int       `json:"connections"`
	CreatedAt   time.Time `json:"created_at"`
}

// PreviewRequest is the body of POST /v1/sandboxes/{id}/previews.
type PreviewRequest struct {
	Port int `json:"port"`
	// ExpiresSeconds is the preview's life (default 3600; at most 30
	// days).
	ExpiresSeconds int64 `json:"expires_seconds,omitempty"`
	// Public previews need no token: whoever has the URL reaches the port.
	Public bool `json:"public,omitempty"`
}

// Preview is a URL on the daemon's TCP listener for a port of a sandbox:
// /preview/ID/PATH reaches PATH of the port, for holders of its token
// (the Paddock-Preview-Token header, the paddock_token query parameter,
// which also sets a cookie for the preview's path, or that cookie) until
// it expires or is revoked; a public one for anyone.
type Preview struct {
	// ID is SANDBOX.RANDOM; the path is /preview/ID/.
	ID      string `json:"id"`
	Sandbox string `json:"sandbox"`
	Port    int    `json:"port"`
	Path    string `json:"path"`
	// URL is Path on the daemon's preview listener, or with a preview
	// domain the root of the preview's own host name (with the token as
	// paddock_token for a private preview, in the create's answer only);
	// empty when the daemon has no preview listener.
	URL string `json:"url,omitempty"`
	// Token is set in the create's answer only: the daemon keeps its
	// SHA-256.
	Token     string    `json:"token,omitempty"`
	Public    bool      `json:"public,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
}
