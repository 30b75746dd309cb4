package server

import (
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/paddock-dev/paddock/internal/connlimit"
)

// HTTPConfig bounds the connections of an HTTP server (the daemon's API
// and E2B facade, a gateway's listeners; see package connlimit for what
// counts as authenticated).
type HTTPConfig struct {
	// ReadTimeout bounds reading a request on a TCP listener until its
	// credentials are checked (headers alone: at most 10 s); an
	// authenticated request may then stream for as long as it lasts.
	// Default 30 s. Negative: none, for a listener whose callers are
	// known authenticated only after their bodies (a gateway's E2B
	// listener, which learns it from the node's answer).
	ReadTimeout time.Duration
	// IdleTimeout closes a connection that waits this long for its next
	// request. Default 2 minutes.
	IdleTimeout time.Duration
	// Limits bound each TCP listener's connections (zero fields: the
	// defaults of connlimit.Limits).
	Limits connlimit.Limits
}

func (c HTTPConfig) withDefaults() HTTPConfig {
	if c.ReadTimeout == 0 {
		c.ReadTimeout = 30 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 2 * time.Minute
	}
	return c
}

// NewHTTPServer is an API server for h with cfg's timeouts. The read
// timeout is left to Guard: a unix socket's requests are all trusted,
// and a read deadline would cut their streams.
func NewHTTPServer(h http.Handler, cfg HTTPConfig, log *slog.Logger) *http.Server {
	cfg = cfg.withDefaults()
	header := 10 * time.Second
	if cfg.ReadTimeout > 0 {
		header = min(header, cfg.ReadTimeout)
	}
	return &http.Server{Handler: h, ReadHeaderTimeout: header, IdleTimeout: cfg.IdleTimeout,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
}

// Guard bounds a TCP listener's connections and gives its server the
// read timeout that holds until a request is authenticated
// (connlimit.Authenticated lifts it), and its handler connlimit.Handler. hs then serves the listener Guard
// returns (or a TLS listener over it).
func Guard(hs *http.Server, l net.Listener, cfg HTTPConfig, log *slog.Logger) net.Listener {
	cl := connlimit.New(l, cfg.Limits, log)
	hs.Handler = connlimit.Handler(hs.Handler)
	hs.ReadTimeout = max(cfg.withDefaults().ReadTimeout, 0)
	hs.ConnState = cl.ConnState
	hs.ConnContext = connlimit.ConnContext
	return cl
}
