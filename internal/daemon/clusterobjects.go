package daemon

import (
	"context"
	"log/slog"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/cluster"
	"github.com/paddock-dev/paddock/internal/egress"
	"github.com/paddock-dev/paddock/internal/reconcile"
	"github.com/paddock-dev/paddock/internal/sandbox"
)

// reconcileObjects runs the node's part of the cluster's declarative
// objects (package reconcile) until ctx ends: its SandboxTemplates
// built, its share of the SandboxWarmPools, the Secrets of
// cluster.SecretsNamespace in its secret store.
func reconcileObjects(ctx context.Context, cfg *Config, node *cluster.Node, mgr *sandbox.Manager, secrets *egress.SecretStore, log *slog.Logger) {
	rc := reconcile.NodeConfig{
		Name:      node.Name(),
		Labels:    node.Labels(),
		Kube:      node.Config(),
		Namespace: cfg.Cluster.Namespace,
		Manager:   managerObjects{mgr},
		StateDir:  cfg.StateDir,
		Logger:    log,
	}
	if secrets != nil {
		rc.Secrets = secrets
	}
	if err := reconcile.RunNode(ctx, rc); err != nil {
		log.Error("the node does not act on the cluster's SandboxTemplates, SandboxWarmPools and Secrets", "err", err)
	}
}

// managerObjects is the sandbox manager as the reconciler sees it.
type managerObjects struct{ m *sandbox.Manager }

func (o managerObjects) BuildTemplate(ctx context.Context, spec api.TemplateSpec) (api.Template, error) {
	return o.m.Templates().Build(ctx, spec, nil, func(api.TemplateEvent) {})
}

func (o managerObjects) Template(ctx context.Context, name string) (api.Template, error) {
	return o.m.Templates().Get(ctx, name)
}

func (o managerObjects) RemoveTemplate(ctx context.Context, name string) error {
	return o.m.Templates().Remove(ctx, name)
}

func (o managerObjects) SetPool(ctx context.Context, name string, size int) (api.Pool, error) {
	return o.m.Pools().Set(ctx, name, size)
}

func (o managerObjects) Pools(ctx context.Context) api.Pools { return o.m.Pools().List(ctx) }
