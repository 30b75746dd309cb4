// Package guestapitest plays the guest's side of the protocol for tests
// of its clients elsewhere (the telemetry hub's exec copies), so that
// requests and ops stay named in the guest and guestapi alone.
package guestapitest

import (
	"encoding/json"
	"fmt"
	"net"

	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/wire"
)

// AcceptAttach reads one request from conn and, if it is an attach,
// answers it as the guest does; it returns the writer of the stream's
// frames and the process attached to. Any other request is an error
// (the caller closes conn).
func AcceptAttach(conn net.Conn) (*wire.Writer, int, error) {
	f, err := wire.NewReader(conn).Read()
	if err != nil {
		return nil, 0, err
	}
	if f.Type != wire.Request {
		return nil, 0, fmt.Errorf("frame of type %d, not a request", f.Type)
	}
	var req guestapi.Request
	if err := json.Unmarshal(f.Payload, &req); err != nil {
		return nil, 0, err
	}
	if req.Op != guestapi.OpAttach {
		return nil, 0, fmt.Errorf("op %q, not an attach", req.Op)
	}
	w := wire.NewWriter(conn)
	if err := w.WriteJSON(wire.Response, guestapi.Response{PID: req.PID}); err != nil {
		return nil, 0, err
	}
	return w, req.PID, nil
}
