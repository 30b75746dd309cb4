package console

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/coder/websocket"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/wire"
)

// loginShell runs bash as a login shell where there is one, sh otherwise
// (as `paddock shell` does).
var loginShell = []string{"/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -l; fi; exec sh -l"}

// termControl is a text message from the page: a resize.
type termControl struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// terminal bridges a WebSocket to a login shell on a PTY in the sandbox:
// binary messages are keystrokes one way and terminal output the other,
// text messages are resizes ({"cols":N,"rows":N}) from the page and, last,
// the exit status ({"exit_code":N,...}) to it. The WebSocket handshake
// refuses another origin.
func (c *Console) terminal(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !api.IsSandboxID(id) {
		writeError(w, http.StatusBadRequest, errdefs.ErrInvalid, "not a sandbox id")
		return
	}
	if c.client == nil {
		writeError(w, http.StatusServiceUnavailable, errdefs.ErrUnavailable, "this daemon has no terminal: it cannot reach its own API")
		return
	}
	size := api.TTY{Cols: dimension(r, "cols", 80), Rows: dimension(r, "rows", 24)}
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		return // Accept answered
	}
	defer conn.CloseNow()
	conn.SetReadLimit(64 << 10)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	st, err := c.client.ExecStream(ctx, id, api.ExecRequest{Cmd: loginShell, TTY: &size}, true)
	if err != nil {
		conn.Close(websocket.StatusPolicyViolation, truncate(err.Error(), 120))
		return
	}
	defer st.Close()
	go func() {
		defer cancel()
		for {
			typ, b, err := conn.Read(ctx)
			if err != nil {
				return
			}
			if typ == websocket.MessageBinary {
				err = st.Send(wire.Stdin, b)
			} else {
				var m termControl
				if json.Unmarshal(b, &m) == nil && m.Cols > 0 && m.Rows > 0 {
					err = st.Resize(m.Cols, m.Rows)
				}
			}
			if err != nil {
				return
			}
		}
	}()
	out := wsWriter{ctx: ctx, conn: conn}
	exit, err := st.Wait(out, out)
	if err != nil {
		conn.Close(websocket.StatusGoingAway, truncate(err.Error(), 120))
		return
	}
	if b, err := json.Marshal(exit); err == nil {
		conn.Write(ctx, websocket.MessageText, b)
	}
	conn.Close(websocket.StatusNormalClosure, "exited")
}

type wsWriter struct {
	ctx  context.Context
	conn *websocket.Conn
}

func (w wsWriter) Write(p []byte) (int, error) {
	if err := w.conn.Write(w.ctx, websocket.MessageBinary, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// dimension reads a terminal size from the query, within 1..1000.
func dimension(r *http.Request, name string, def uint16) uint16 {
	n, err := strconv.Atoi(r.URL.Query().Get(name))
	if err != nil || n < 1 || n > 1000 {
		return def
	}
	return uint16(n)
}

// truncate keeps a close reason within the WebSocket's 123 bytes.
func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
