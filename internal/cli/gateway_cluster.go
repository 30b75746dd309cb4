package cli

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/cluster"
	"github.com/paddock-dev/paddock/internal/clustertls"
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

// clusterTLSCmd writes the files of the cluster's mutual TLS between
// gateways and nodes (package clustertls).
func clusterTLSCmd() *cobra.Command {
	var newCA bool
	cmd := &cobra.Command{
		Use:   "cluster-tls DIR",
		Short: "Write the cluster's TLS files: a root CA, the gateways' client certificate, the nodes' issuing CA",
		Long: `Write into DIR the files of the mutual TLS between a cluster's gateways and nodes:
ca.crt and ca.key (the root; keep ca.key out of the cluster), gateway.crt and gateway.key
(the gateways' client certificate), node-ca.crt and node-ca.key (the CA each node issues
itself a server certificate for its address from). A root already in DIR is kept, and the
other files are issued again: a rotation gateways and nodes take up without a restart.

  kubectl -n paddock create secret generic paddock-gateway-tls --from-file=DIR/ca.crt --from-file=DIR/gateway.crt --from-file=DIR/gateway.key
  kubectl -n paddock create secret generic paddock-node-tls --from-file=DIR/ca.crt --from-file=DIR/node-ca.crt --from-file=DIR/node-ca.key

Then: paddock gateway --cluster-tls DIR, paddock serve --cluster-tls DIR --node-address https://HOST:PORT.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := clustertls.Generate(args[0], clustertls.GenerateOptions{NewCA: newCA}); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote the cluster's TLS files to %s\n", args[0])
			return nil
		},
	}
	cmd.Flags().BoolVar(&newCA, "new-ca", false, "make a new root even if DIR holds one (nodes and gateways then need the new ca.crt, or both old and new in one file while they change over)")
	return cmd
}

// drainer marks nodes draining through the cluster's API (the gateway's
// POST /v1/nodes/NAME/drain).
func (k kubeNodes) drainer() (func(context.Context, string, bool) error, error) {
	rc, err := cluster.RESTConfig(k.kubeconfig)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, name string, draining bool) error {
		return cluster.SetDraining(ctx, rc, name, draining)
	}, nil
}
