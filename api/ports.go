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
