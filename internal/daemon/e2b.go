package daemon

import (
	"context"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"

	"github.com/paddock-dev/paddock/internal/clustertls"
	"github.com/paddock-dev/paddock/internal/e2b"
	"github.com/paddock-dev/paddock/internal/egress"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/sandbox"
	"github.com/paddock-dev/paddock/internal/server"
	"github.com/paddock-dev/paddock/internal/store"
	"github.com/paddock-dev/paddock/internal/telemetry/hub"
)

// listenE2B opens the E2B facade's listener (tcp://HOST:PORT), early with
// the others so that a taken port fails the start before any reconcile.
func listenE2B(cfg Config, tokens *clustertls.Tokens, log *slog.Logger) (net.Listener, *clustertls.Tokens, error) {
	if cfg.E2BListen == "" {
		return nil, nil, nil
	}
	u, err := url.Parse(cfg.E2BListen)
	if err != nil || u.Scheme != "tcp" || u.Host == "" {
		return nil, nil, fmt.Errorf("--e2b-listen %q is not tcp://HOST:PORT", cfg.E2BListen)
	}
	if cfg.TokenFile == "" {
		return nil, nil, fmt.Errorf("--e2b-listen needs --token-file: the E2B API key is derived from the daemon's token")
	}
	if tokens == nil {
		if tokens, err = clustertls.LoadTokens(cfg.TokenFile, log); err != nil {
			return nil, nil, fmt.Errorf("--token-file: %w", err)
		}
	}
	l, err := net.Listen("tcp", u.Host)
	if err != nil {
		return nil, nil, fmt.Errorf("listening on %s: %w", cfg.E2BListen, err)
	}
	return l, tokens, nil
}

// serveE2B serves the E2B facade on l over the same manager as the
// native API.
func serveE2B(l net.Listener, trust *clustertls.Node, tokens *clustertls.Tokens, cfg Config, mgr *sandbox.Manager, st *store.Store, secrets *egress.SecretStore, tel *hub.Hub, log *slog.Logger, errc chan<- error) (*http.Server, error) {
	key, err := e2bKey(st, secrets)
	if err != nil {
		return nil, err
	}
	ecfg := e2b.Config{
		Manager:       mgr,
		Key:           key,
		Token:         tokens.Present(),
		Tokens:        tokens.All,
		Telemetry:     tel,
		DefaultEgress: cfg.E2BDefaultEgress,
		Domain:        cfg.E2BDomain,
		Logger:        log,
	}
	if secrets != nil {
		ecfg.Secrets = secrets
	}
	srv, err := e2b.New(ecfg)
	if err != nil {
		return nil, err
	}
	if (cfg.E2BTLSCert == "") != (cfg.E2BTLSKey == "") {
		return nil, errors.New("--e2b-tls-cert and --e2b-tls-key go together")
	}
	if cfg.E2BTLSCert != "" && trust != nil {
		return nil, errors.New("--e2b-tls-cert: this node's facade already speaks the cluster's TLS (gateways serve E2B clients)")
	}
	hs := server.NewHTTPServer(srv.Handler(), cfg.HTTP, log)
	l = guardTCP(hs, l, trust, cfg.HTTP, log)
	if cfg.E2BTLSCert != "" {
		// Loaded now, so that a bad pair fails the start.
		if _, err := tls.LoadX509KeyPair(cfg.E2BTLSCert, cfg.E2BTLSKey); err != nil {
			return nil, fmt.Errorf("the E2B facade's TLS certificate: %w", err)
		}
		go func() { errc <- hs.ServeTLS(l, cfg.E2BTLSCert, cfg.E2BTLSKey) }()
	} else {
		go func() { errc <- hs.Serve(l) }()
	}
	sweepCtx, stopSweeps := context.WithCancel(context.Background())
	hs.RegisterOnShutdown(stopSweeps)
	go srv.Run(sweepCtx)
	log.Info("E2B facade listening", "addr", "tcp://"+l.Addr().String(), "tls", cfg.E2BTLSCert != "", "domain", cfg.E2BDomain)
	return hs, nil
}

// e2bKey is the key the facade derives envd access tokens from: the one
// daemons before this one made at random and kept in the store's "e2b"
// bucket, so that the sandboxes made then keep their tokens, else one the
// secret store derives.
func e2bKey(st *store.Store, secrets *egress.SecretStore) ([]byte, error) {
	var legacy struct {
		Secret string `json:"secret"`
	}
	err := st.Get("e2b", "secret", &legacy)
	if err == nil {
		if b, err := hex.DecodeString(legacy.Secret); err == nil && len(b) == 32 {
			return b, nil
		}
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return nil, fmt.Errorf("reading the E2B facade's key: %w", err)
	}
	return secrets.DerivedKey("e2b envd access tokens"), nil
}
