package cli

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/cluster"
)

// kubeNodes feeds a gateway's node table from the cluster's Kubernetes
// API (paddock gateway --cluster).
type kubeNodes struct {
	enabled    bool
	kubeconfig string
	namespace  string
}

// firstListWait bounds how long a gateway waits for its first node list
// before it gives up (wrong credentials, an API server that is down).
const firstListWait = 30 * time.Second

// watch starts watching the nodes, calling set with every change until
// ctx ends, and returns once set has had the first list.
func (k kubeNodes) watch(ctx context.Context, set func([]api.Node), log *slog.Logger) error {
	rc, err := cluster.RESTConfig(k.kubeconfig)
	if err != nil {
		return err
	}
	listed := make(chan struct{})
	var once sync.Once
	wctx, cancel := context.WithCancel(ctx)
	failed := make(chan error, 1)
	go func() {
		defer cancel()
		failed <- cluster.WatchNodes(wctx, rc, cluster.WatchConfig{Namespace: k.namespace, Logger: log.With("component", "cluster")}, func(nodes []api.Node) {
			set(nodes)
			once.Do(func() { close(listed) })
			log.Debug("nodes changed", "nodes", len(nodes))
		})
	}()
	select {
	case <-listed:
		return nil
	case err := <-failed:
		cancel()
		return err
	case <-time.After(firstListWait):
		cancel()
		<-failed
		return fmt.Errorf("no list of the cluster's nodes from %s after %v: check --kubeconfig and the gateway's RBAC (deploy/rbac.yaml)", rc.Host, firstListWait)
	}
}
