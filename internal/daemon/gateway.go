package daemon

import (
	"crypto/x509"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/paddock-dev/paddock/internal/egress"
	"github.com/paddock-dev/paddock/internal/gateway"
	"github.com/paddock-dev/paddock/internal/runtime"
	"github.com/paddock-dev/paddock/internal/sandbox"
)

// gatewayDir holds the gateway's state: its secrets, CAs and sandboxes'
// trees.
func gatewayDir(cfg Config) string { return filepath.Join(cfg.StateDir, "gateway") }

// openSecrets opens the daemon's secret store, which the gateway's
// bindings and the E2B facade's key share.
func openSecrets(cfg Config) (*egress.SecretStore, error) {
	return egress.OpenSecretStore(filepath.Join(gatewayDir(cfg), "secrets"))
}

// startGateway starts the egress gateway, or returns nil when the network
// is disabled.
func startGateway(cfg Config, secrets *egress.SecretStore, log *slog.Logger) (*gateway.Gateway, error) {
	n := cfg.Network
	if n.Disabled {
		log.Warn("network egress disabled: sandboxes have loopback only")
		return nil, nil
	}
	gc := gateway.Config{
		Dir:      gatewayDir(cfg),
		Secrets:  secrets,
		Name:     n.Name,
		Upstream: n.DNS,
		Logger:   log,
	}
	if n.Subnet != "" {
		p, err := netip.ParsePrefix(n.Subnet)
		if err != nil {
			return nil, fmt.Errorf("network subnet %q: %w", n.Subnet, err)
		}
		gc.Subnet = p
	}
	if n.RootCA != "" {
		b, err := os.ReadFile(n.RootCA)
		if err != nil {
			return nil, fmt.Errorf("reading the egress root CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("%s holds no PEM certificate", n.RootCA)
		}
		gc.RootCAs = pool
	}
	gw, err := gateway.Start(gc)
	if err != nil {
		return nil, fmt.Errorf("starting the egress gateway: %w", err)
	}
	return gw, nil
}

// egressOf and networkOf keep a nil gateway a nil interface.
func egressOf(gw *gateway.Gateway) sandbox.Egress {
	if gw == nil {
		return nil
	}
	return gw
}

func networkOf(gw *gateway.Gateway) runtime.Network {
	if gw == nil {
		return nil
	}
	return gw
}
