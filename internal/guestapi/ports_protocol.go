package guestapi

import "github.com/paddock-dev/paddock/internal/errdefs"

// OpPortConnect connects to a TCP port on the sandbox's loopback. After a
// successful Response frame the guest connection stops being framed: it
// is a raw byte pipe to that TCP connection, half-closes included, until
// either side closes.
const OpPortConnect = "port.connect"

// PortRequest holds the arguments of the port ops.
type PortRequest struct {
	Port int `json:"port"`
}

// ValidPort checks that port names a TCP port (1-65535).
func ValidPort(port int) error {
	if port < 1 || port > 65535 {
		return errdefs.Invalid("port", "%d is not a port number (1-65535)", port)
	}
	return nil
}
