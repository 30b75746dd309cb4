package main

import (
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/clustertls"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/wire"
)

// simNode is a bench-only paddock node: it answers the part of the node
// API a gateway calls (create, get, list, exec, delete, version) as a
// node would, over the cluster's mutual TLS and behind the node token,
// with no kernel work behind it: a sandbox is an entry in a map. It never
// ships in the product; the simnodes section puts 1 to 100 of them
// behind one real `paddock gateway` to measure what the gateway itself
// sustains.
type simNode struct {
	name, tag string
	addr      string // https://127.0.0.1:PORT
	plainAddr string // http://127.0.0.1:PORT: the same node without TLS, for comparison
	token     string
	srv       *http.Server

	seq     atomic.Uint64
	creates atomic.Int64
	conns   atomic.Int64 // connections the gateway opened to it
	mu      sync.Mutex
	live    map[string]time.Time // sandbox id → created
}

// startSimNode serves a simulated node on a loopback port until stop.
func startSimNode(name, tag, token string, trust *clustertls.Node) (*simNode, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	n := &simNode{name: name, tag: tag, token: "Bearer " + token, addr: "https://" + l.Addr().String(), live: map[string]time.Time{}}
	n.srv = &http.Server{Handler: n, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(slog.DiscardHandler, slog.LevelDebug),
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				n.conns.Add(1)
			}
		}}
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		l.Close()
		return nil, err
	}
	n.plainAddr = "http://" + pl.Addr().String()
	go n.srv.Serve(tls.NewListener(l, trust.ServerConfig()))
	go n.srv.Serve(pl)
	return n, nil
}

func (n *simNode) stop() { n.srv.Close() }

// record is the node's record as the gateway's nodes file gives it:
// ready, with room for anything the bench creates.
func (n *simNode) record(plain bool) api.Node {
	addr := n.addr
	if plain {
		addr = n.plainAddr
	}
	return api.Node{Name: n.name, Tag: n.tag, Address: addr, State: api.NodeReady,
		Capacity: api.NodeResources{CPUs: 1e6, MemoryBytes: 1 << 50, DiskBytes: 1 << 60, Sandboxes: 1 << 30},
		Pools:    map[string]int{"image:host": 4}}
}

// newID mints a sandbox id as a node does: its tag, then characters of
// its own (12 in all).
func (n *simNode) newID() string {
	s := strconv.FormatUint(n.seq.Add(1), 36)
	return n.tag + strings.Repeat("0", max(0, 12-len(n.tag)-len(s))) + s
}

func (n *simNode) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte(n.token)) != 1 {
		simError(w, http.StatusUnauthorized, errdefs.New(errdefs.ErrDenied, "missing or wrong bearer token"))
		return
	}
	p := r.URL.Path
	switch {
	case p == "/v1/version":
		simJSON(w, http.StatusOK, api.VersionInfo{Version: "simnode", Runtime: "sim"})
	case p == "/v1/sandboxes" && r.Method == http.MethodPost:
		n.create(w, r)
	case p == "/v1/sandboxes" && r.Method == http.MethodGet:
		n.list(w)
	case strings.HasPrefix(p, "/v1/sandboxes/"):
		id, rest, _ := strings.Cut(strings.TrimPrefix(p, "/v1/sandboxes/"), "/")
		n.mu.Lock()
		created, ok := n.live[id]
		if ok && r.Method == http.MethodDelete && rest == "" {
			delete(n.live, id)
		}
		n.mu.Unlock()
		switch {
		case !ok:
			simError(w, http.StatusNotFound, errdefs.New(errdefs.ErrNotFound, "sandbox %s not found", id))
		case rest == "" && r.Method == http.MethodGet:
			simJSON(w, http.StatusOK, simSandbox(id, created))
		case rest == "" && r.Method == http.MethodDelete:
			w.WriteHeader(http.StatusNoContent)
		case rest == "exec" && r.Method == http.MethodPost:
			n.exec(w, r)
		default:
			simError(w, http.StatusNotFound, errdefs.New(errdefs.ErrNotFound, "the simulated node does not serve %s %s", r.Method, p))
		}
	default:
		simError(w, http.StatusNotFound, errdefs.New(errdefs.ErrNotFound, "the simulated node does not serve %s %s", r.Method, p))
	}
}

// create reads the request as a node does and answers a running sandbox.
func (n *simNode) create(w http.ResponseWriter, r *http.Request) {
	var req api.CreateRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		simError(w, http.StatusBadRequest, errdefs.Invalid("body", "%v", err))
		return
	}
	id, now := n.newID(), time.Now()
	n.mu.Lock()
	n.live[id] = now
	n.mu.Unlock()
	n.creates.Add(1)
	simJSON(w, http.StatusCreated, simSandbox(id, now))
}

func (n *simNode) list(w http.ResponseWriter) {
	n.mu.Lock()
	out := make([]api.Sandbox, 0, len(n.live))
	for id, t := range n.live {
		out = append(out, simSandbox(id, t))
	}
	n.mu.Unlock()
	simJSON(w, http.StatusOK, out)
}

// exec answers any command as if it printed its arguments and exited 0,
// in the frames a node streams; `zeros N` prints N zero bytes instead (a
// stream through the gateway, without a sandbox's cost behind it).
func (n *simNode) exec(w http.ResponseWriter, r *http.Request) {
	var req api.ExecRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil || len(req.Cmd) == 0 {
		simError(w, http.StatusBadRequest, errdefs.Invalid("cmd", "an exec needs a command"))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	fw := wire.NewWriter(w)
	fw.WriteJSON(wire.Started, map[string]int{"pid": 1})
	if size, err := strconv.ParseInt(strings.Join(req.Cmd[1:], ""), 10, 64); req.Cmd[0] == "zeros" && err == nil {
		chunk := make([]byte, 256<<10)
		for size > 0 {
			k := min(size, int64(len(chunk)))
			if fw.Write(wire.Stdout, chunk[:k]) != nil {
				return
			}
			size -= k
		}
	} else {
		fw.Write(wire.Stdout, []byte(strings.Join(req.Cmd[1:], " ")+"\n"))
	}
	fw.WriteJSON(wire.Exit, api.ExitStatus{})
}

func simSandbox(id string, created time.Time) api.Sandbox {
	return api.Sandbox{ID: id, State: api.StateRunning, Image: "host", Workdir: "/", CreatedAt: created,
		Resources: api.Resources{CPUs: 2, MemoryBytes: 1 << 30, DiskBytes: 10 << 30}}
}

func simJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func simError(w http.ResponseWriter, code int, err error) {
	simJSON(w, code, api.Error{Code: errdefs.Code(err), Message: err.Error()})
}
