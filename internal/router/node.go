package router

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/clustertls"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/netpipe"
	"github.com/paddock-dev/paddock/internal/server"
)

// node is one node of the table: its record and the one way the gateway
// speaks to it (plain calls through a reverse proxy on kept connections,
// upgrades on a connection of their own, lanes from a pool).
type node struct {
	api.Node
	*conns // shared by the versions of one node's record
}

// conns is how the gateway reaches one node's data-plane address.
type conns struct {
	name   string
	base   *url.URL
	tokens *clustertls.Tokens  // the first is presented (a file that rotates)
	trust  *clustertls.Gateway // nil: TLS verified against the host's roots
	tr     *http.Transport
	proxy  *httputil.ReverseProxy
	lanes  *lanePool
	log    *slog.Logger
	// moved and e2bMoved serve a call the node answered with a
	// MovedError: a native one, an E2B one.
	moved, e2bMoved func(w http.ResponseWriter, r *http.Request, node string)

	// The node's E2B facade, if it serves one.
	e2bBase  *url.URL
	e2bProxy *httputil.ReverseProxy
}

// dialTimeout bounds connecting to a node: one on the same network
// answers in well under a millisecond; one that does not is down.
const dialTimeout = 3 * time.Second

func (rt *Router) newNode(an api.Node) (*node, error) {
	base, err := url.Parse(an.Address)
	if err != nil {
		return nil, err
	}
	base.Path = ""
	c := &conns{name: an.Name, base: base, tokens: rt.cfg.NodeTokens, trust: rt.cfg.TLS, log: rt.log.With("node", an.Name), lanes: &lanePool{},
		moved: rt.followMoved, e2bMoved: rt.e2bFollow}
	c.tr = &http.Transport{
		DialContext:         dialPlain,
		DialTLSContext:      c.dialTLS,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	c.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(c.base)
			pr.Out.Header.Set("Authorization", c.tokens.Authorization())
			sendLength(pr)
		},
		Transport:      c.tr,
		BufferPool:     bufferPool{},
		ModifyResponse: movedAnswer,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if mv := (*movedError)(nil); errors.As(err, &mv) {
				rt.followMoved(w, r, mv.node)
				return
			}
			if r.Context().Err() != nil {
				return // the client went away
			}
			server.WriteError(w, r, c.log, c.unreachable(err))
		},
		ErrorLog: slog.NewLogLogger(c.log.Handler(), slog.LevelDebug),
	}
	if an.E2BAddress != "" {
		if err := c.newE2BProxy(an.E2BAddress); err != nil {
			return nil, err
		}
	}
	return &node{Node: an, conns: c}, nil
}

// with is n with a newer record of the same node at the same address.
func (n *node) with(an api.Node) *node { return &node{Node: an, conns: n.conns} }

func (c *conns) close() {
	c.tr.CloseIdleConnections()
	c.lanes.close()
}

// unreachable is the error of a call the node did not answer.
func (c *conns) unreachable(err error) error {
	return errdefs.New(errdefs.ErrUnavailable, "node %s did not answer: %v", c.name, err)
}

// dial connects to the node's data-plane address, over TLS if it is https.
func (c *conns) dial(ctx context.Context) (net.Conn, error) {
	if c.base.Scheme == "https" {
		return c.dialTLS(ctx, "tcp", c.base.Host)
	}
	return dialPlain(ctx, "tcp", c.base.Host)
}

func dialPlain(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}
	return d.DialContext(ctx, network, addr)
}

// dialTLS connects over TLS: with the cluster's trust, the node must
// show a certificate of the cluster's naming the host dialled, and the
// gateway shows its own.
func (c *conns) dialTLS(ctx context.Context, network, addr string) (net.Conn, error) {
	host, _, _ := net.SplitHostPort(addr)
	cfg := &tls.Config{ServerName: host, NextProtos: []string{"http/1.1"}}
	if c.trust != nil {
		cfg = c.trust.Config(host)
	}
	td := &tls.Dialer{NetDialer: &net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}, Config: cfg}
	return td.DialContext(ctx, network, addr)
}

// serve passes one request for one of the node's sandboxes on.
func (c *conns) serve(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Upgrade") != "" && headerHas(r.Header, "Connection", "upgrade") {
		c.upgrade(w, r)
		return
	}
	c.proxy.ServeHTTP(w, r)
}

// headerHas reports whether any comma-separated value of header key is
// token (case-insensitively).
func headerHas(h http.Header, key, token string) bool {
	for _, v := range h.Values(key) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// upgrade passes on a request that asks to switch protocols (an exec or
// process stream with input, a lane bound to a sandbox, a port's raw
// connection or WebSocket): on a connection of its own to the node; once
// the node answers 101 the two connections are spliced, and the gateway
// reads none of the bytes. Any other answer goes to the client as it is.
func (c *conns) upgrade(w http.ResponseWriter, r *http.Request) {
	up, br, resp, err := c.open(r.Context(), r)
	if err != nil {
		if r.Context().Err() == nil {
			server.WriteError(w, r, c.log, c.unreachable(err))
		}
		return
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer up.Close()
		if err := movedAnswer(resp); err != nil {
			resp.Body.Close()
			c.moved(w, r, err.(*movedError).node)
			return
		}
		copyResponse(w, resp)
		return
	}
	down, bufrw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		up.Close()
		c.log.Warn("hijacking an upgraded connection", "err", err)
		return
	}
	// A stream waits as long as its peers keep it, as on the node.
	down.SetDeadline(time.Time{})
	bufrw.WriteString("HTTP/1.1 101 Switching Protocols\r\n")
	resp.Header.Write(bufrw)
	bufrw.WriteString("\r\n")
	// What either side sent past its HTTP part goes first.
	if n := br.Buffered(); n > 0 {
		b, _ := br.Peek(n)
		bufrw.Write(b)
	}
	if bufrw.Flush() != nil {
		up.Close()
		down.Close()
		return
	}
	if n := bufrw.Reader.Buffered(); n > 0 {
		b, _ := bufrw.Reader.Peek(n)
		if _, err := up.Write(b); err != nil {
			up.Close()
			down.Close()
			return
		}
	}
	t0 := time.Now()
	in, out := netpipe.Splice(down, up)
	c.log.Debug("upgraded connection ended", "path", r.URL.Path, "in", in, "out", out, "took", time.Since(t0))
}

// open sends r's request line and headers (and body) to the node on a new
// connection and reads its answer. The node's token replaces the client's.
func (c *conns) open(ctx context.Context, r *http.Request) (net.Conn, *bufio.Reader, *http.Response, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	out := r.Clone(ctx)
	out.URL.Scheme, out.URL.Host = c.base.Scheme, c.base.Host
	out.Host = c.base.Host
	out.RequestURI = ""
	out.Header.Set("Authorization", c.tokens.Authorization())
	bw := bufio.NewWriterSize(conn, 4<<10)
	br := bufio.NewReaderSize(conn, 32<<10)
	err = out.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	var resp *http.Response
	if err == nil {
		resp, err = http.ReadResponse(br, out)
	}
	if !stop() {
		err = errors.Join(ctx.Err(), err)
	}
	if err != nil {
		conn.Close()
		return nil, nil, nil, err
	}
	return conn, br, resp, nil
}

// copyResponse sends a node's whole answer to the client.
func copyResponse(w http.ResponseWriter, resp *http.Response) {
	defer resp.Body.Close()
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.Header().Del("Connection")
	w.WriteHeader(resp.StatusCode)
	io.Copy(w, resp.Body)
}

// sendLength makes the body a proxied request of known length sends on
// end after that length, without reading the client's body to its end or
// closing it (the server does both once the handler returns). The
// Transport writes a body to the node as it reads it, then reads on for
// the end and closes it; a node that answers once it has the bytes can
// have its answer start to the client first, and the server, seeing the
// body unfinished, then finishes and closes it under the Transport, whose
// next read fails and ends the node's connection, and the answer streaming
// on it: a 1 GiB exec output through the gateway was cut ("unexpected
// EOF") about once in ten over plain HTTP.
func sendLength(pr *httputil.ProxyRequest) {
	if n := pr.In.ContentLength; n > 0 && pr.Out.Body != nil {
		pr.Out.Body = io.NopCloser(io.LimitReader(pr.Out.Body, n))
	}
}

// bufferPool lends the reverse proxy its copy buffers.
type bufferPool struct{}

var buffers = sync.Pool{New: func() any { return make([]byte, 64<<10) }}

func (bufferPool) Get() []byte { return buffers.Get().([]byte) }

//lint:ignore SA6002 a slice header is three words; the buffer is what is kept
func (bufferPool) Put(b []byte) { buffers.Put(b) }
