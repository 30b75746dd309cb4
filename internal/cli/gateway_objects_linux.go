package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/paddock-dev/paddock/internal/cluster"
	"github.com/paddock-dev/paddock/internal/reconcile"
)

// watchPresets watches the cluster's PolicyPresets until ctx ends and
// hands set their latest list. A gateway whose RBAC or API server lacks
// them serves on with the built-in presets only.
func (k kubeNodes) watchPresets(ctx context.Context, set func(func() []*cluster.PolicyPreset), log *slog.Logger) {
	rc, err := cluster.RESTConfig(k.kubeconfig)
	if err != nil {
		log.Warn("not watching PolicyPresets", "err", err)
		return
	}
	w, err := cluster.Watch(ctx, rc, cluster.WatchPresets)
	if err != nil {
		log.Warn("not watching PolicyPresets", "err", err)
		return
	}
	set(func() []*cluster.PolicyPreset { return w.Now().Presets })
}

// runController runs the gateways' controller (package reconcile) until
// ctx ends: the gateway that holds its Lease keeps the Sandbox objects'
// sandboxes through gw.
func (k kubeNodes) runController(ctx context.Context, gw reconcile.Gateway, log *slog.Logger) {
	rc, err := cluster.RESTConfig(k.kubeconfig)
	if err != nil {
		log.Warn("not running the Sandbox controller", "err", err)
		return
	}
	host, _ := os.Hostname()
	id := fmt.Sprintf("%s-%d-%x", host, os.Getpid(), time.Now().UnixNano()&0xffffff)
	err = reconcile.RunController(ctx, reconcile.ControllerConfig{Kube: rc, Namespace: k.namespace, Identity: id, Gateway: gw, Logger: log})
	if err != nil {
		log.Warn("not running the Sandbox controller", "err", err)
	}
}
