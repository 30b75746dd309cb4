package test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
	kube "github.com/paddock-dev/paddock/internal/cluster"
	"github.com/paddock-dev/paddock/internal/cluster/kubetest"
)

// nodeWatch is a gateway's view of the cluster's nodes.
type nodeWatch struct {
	mu    sync.Mutex
	nodes map[string]api.Node
}

func watchNodes(t *testing.T, kc *kubetest.Cluster) *nodeWatch {
	t.Helper()
	w := &nodeWatch{nodes: map[string]api.Node{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := kube.WatchNodes(ctx, kc.Config(kubetest.Gateway), kube.WatchConfig{}, func(ns []api.Node) {
			m := map[string]api.Node{}
			for _, n := range ns {
				m[n.Name] = n
			}
			w.mu.Lock()
			w.nodes = m
			w.mu.Unlock()
		})
		if err != nil {
			t.Errorf("WatchNodes: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

// wait waits until the node named name is in state, and returns it with
// how long that took.
func (w *nodeWatch) wait(t *testing.T, name, state string, limit time.Duration) (api.Node, time.Duration) {
	t.Helper()
	start := time.Now()
	n := w.waitFor(t, name, limit, func(n api.Node) bool { return n.State == state })
	return n, time.Since(start)
}

// TestClusterNode: `paddock serve --cluster` against a real kube-apiserver
// and etcd registers the node (a Lease, a PaddockNode with its status),
// mints ids that start with its tag, writes nothing to the API per
// create, is seen lost when killed with SIGKILL and ready again, with its
// sandboxes, when it restarts.
func TestClusterNode(t *testing.T) {
	t.Parallel()
	kc := kubetest.Start(t)
	kc.Apply(t, "../deploy/crd-paddocknode.yaml", "../deploy/rbac.yaml")
	w := watchNodes(t, kc)
	kubeconfig := kc.Kubeconfig(t, kubetest.Node)
	d := newDaemon(t, "--cluster", "--kubeconfig", kubeconfig,
		"--node-name", "e2e-node", "--node-address", "http://127.0.0.1:7777",
		"--node-labels", "zone=test,disk=ssd")
	n, _ := w.wait(t, "e2e-node", api.NodeReady, 30*time.Second)
	if !kube.ValidTag(n.Tag) || n.Address != "http://127.0.0.1:7777" || n.Labels["zone"] != "test" ||
		n.Labels["disk"] != "ssd" || n.Capacity.CPUs <= 0 || n.Capacity.MemoryBytes <= 0 || n.Capacity.DiskBytes <= 0 {
		t.Fatalf("node as published: %+v", n)
	}

	// Creates write nothing to the API server: the node's only writes
	// are its Lease renewals and its status, on their own clocks.
	const creates = 20
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	before := kubetest.Writes(kc.Requests(t))
	start := time.Now()
	var ids []string
	for range creates {
		sb, err := d.Client().Create(ctx, api.CreateRequest{})
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		if !strings.HasPrefix(sb.ID, n.Tag) || len(sb.ID) != 12 {
			t.Errorf("sandbox id %q: want 12 characters starting with the node's tag %q", sb.ID, n.Tag)
		}
		ids = append(ids, sb.ID)
	}
	elapsed := time.Since(start)
	delta := kubetest.Delta(before, kubetest.Writes(kc.Requests(t)))
	t.Logf("%d creates in %v; API writes meanwhile: %s", creates, elapsed.Round(time.Millisecond), kubetest.String(delta))
	ticks := int(elapsed/kube.StatusInterval) + 1
	var status float64
	for k, v := range delta {
		if strings.Contains(k, "paddocknodes") {
			status += v
		}
	}
	if status > float64(ticks) {
		t.Errorf("%v writes to PaddockNodes during %d creates in %v: want at most %d (one per %v)", status, creates, elapsed, ticks, kube.StatusInterval)
	}
	// Within a status interval the node publishes what it holds.
	n = w.waitFor(t, "e2e-node", 20*time.Second, func(n api.Node) bool { return n.Allocated.Sandboxes >= creates })
	if n.Allocated.CPUs <= 0 || n.Allocated.MemoryBytes <= 0 {
		t.Errorf("allocation published: %+v", n.Allocated)
	}

	// kill -9: the Lease expires, the node is lost.
	d.Kill9()
	_, lost := w.wait(t, "e2e-node", api.NodeLost, kube.LeaseDuration+15*time.Second)
	t.Logf("node seen lost %v after its kill -9 (Lease duration %v)", lost.Round(100*time.Millisecond), kube.LeaseDuration)
	if lost < kube.LeaseDuration-2*kube.RenewInterval {
		t.Errorf("node lost after %v: before its Lease could expire", lost)
	}

	// Back: the same tag, ready, its sandboxes served.
	d.Start()
	n2, back := w.wait(t, "e2e-node", api.NodeReady, 30*time.Second)
	t.Logf("node ready %v after its restart", back.Round(100*time.Millisecond))
	if n2.Tag != n.Tag {
		t.Errorf("tag after restart %q, was %q", n2.Tag, n.Tag)
	}
	if r := d.sh(ids[0], "echo back"); r.ExitCode != 0 || r.Stdout != "back\n" {
		t.Errorf("exec in %s after the node's restart: %s", ids[0], r)
	}
	ls, err := d.Client().List(ctx, client.ListOptions{})
	if err != nil || len(ls) != creates {
		t.Errorf("after restart the node lists %d sandboxes (%v), want %d", len(ls), err, creates)
	}

	// A graceful stop releases the Lease: lost at once.
	d.Stop()
	_, gone := w.wait(t, "e2e-node", api.NodeLost, 5*time.Second)
	t.Logf("node seen lost %v after its stop", gone.Round(time.Millisecond))

	// The API server out of reach as the node starts: it serves its
	// sandboxes and mints ids with the tag it kept.
	good, err := os.ReadFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	dead := "apiVersion: v1\nkind: Config\ncurrent-context: x\n" +
		"clusters: [{name: x, cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}}]\n" +
		"users: [{name: x, user: {token: x}}]\ncontexts: [{name: x, context: {cluster: x, user: x}}]\n"
	if err := os.WriteFile(kubeconfig, []byte(dead), 0o600); err != nil {
		t.Fatal(err)
	}
	d.Start()
	if r := d.sh(ids[1], "echo alone"); r.ExitCode != 0 || r.Stdout != "alone\n" {
		t.Errorf("exec with the API server out of reach: %s", r)
	}
	sb, err := d.Client().Create(ctx, api.CreateRequest{})
	if err != nil || !strings.HasPrefix(sb.ID, n.Tag) {
		t.Errorf("create with the API server out of reach: %v, %v (tag %q)", sb, err, n.Tag)
	}
	if !strings.Contains(d.Log(), "does not answer") {
		t.Errorf("the daemon did not say the API server is out of reach:\n%s", d.Log())
	}
	d.Stop()
	if err := os.WriteFile(kubeconfig, good, 0o600); err != nil {
		t.Fatal(err)
	}
}

// waitFor waits until cond holds of the node named name.
func (w *nodeWatch) waitFor(t *testing.T, name string, limit time.Duration, cond func(api.Node) bool) api.Node {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		w.mu.Lock()
		n, ok := w.nodes[name]
		w.mu.Unlock()
		if ok && cond(n) {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s: condition not met after %v: %+v", name, limit, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestClusterGatewayWatch: a gateway started with --cluster takes its
// nodes from the API server: it routes to a node that registered, sees
// it lost after a kill -9 (its sandboxes answer 503 naming it) and
// serves it again once it restarts.
func TestClusterGatewayWatch(t *testing.T) {
	t.Parallel()
	kc := kubetest.Start(t)
	kc.Apply(t, "../deploy/crd-paddocknode.yaml", "../deploy/rbac.yaml")
	dir := t.TempDir()
	nodeTokenFile, tokenFile := filepath.Join(dir, "node.token"), filepath.Join(dir, "client.token")
	token := "client-token-" + randHex(8)
	os.WriteFile(nodeTokenFile, []byte("node-token-"+randHex(8)+"\n"), 0o600)
	os.WriteFile(tokenFile, []byte(token+"\n"), 0o600)

	addr := freeHostPort(t)
	d := newDaemon(t, "--listen", "tcp://"+addr, "--token-file", nodeTokenFile,
		"--cluster", "--kubeconfig", kc.Kubeconfig(t, kubetest.Node),
		"--node-name", "gw-node", "--node-address", "http://"+addr)

	gwAddr := freeHostPort(t)
	gwLog := startGatewayProc(t, "--listen", "tcp://"+gwAddr, "--token-file", tokenFile,
		"--node-token-file", nodeTokenFile, "--cluster", "--kubeconfig", kc.Kubeconfig(t, kubetest.Gateway))
	cl, err := client.New("tcp://"+gwAddr, client.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	nodeState := func() api.Node {
		nodes, err := cl.Nodes(ctx)
		if err != nil || len(nodes) != 1 {
			return api.Node{}
		}
		return nodes[0]
	}
	waitState := func(state string, limit time.Duration) (api.Node, time.Duration) {
		t.Helper()
		start := time.Now()
		var n api.Node
		if !waitFor(limit, 50*time.Millisecond, func() bool { n = nodeState(); return n.State == state }) {
			t.Fatalf("gateway: node not %s after %v: %+v\n%s", state, limit, n, gwLog)
		}
		return n, time.Since(start)
	}
	n, _ := waitState(api.NodeReady, 30*time.Second)
	if n.Name != "gw-node" || n.Address != "http://"+addr {
		t.Fatalf("the gateway's node: %+v", n)
	}

	sb, err := cl.Create(ctx, api.CreateRequest{})
	if err != nil {
		t.Fatalf("create through the gateway: %v", err)
	}
	if !strings.HasPrefix(sb.ID, n.Tag) {
		t.Errorf("id %q lacks the node's tag %q", sb.ID, n.Tag)
	}
	echo := func() (string, error) {
		var out strings.Builder
		_, err := cl.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"echo", "through"}}, client.ExecIO{Stdout: &out})
		return out.String(), err
	}
	if out, err := echo(); err != nil || out != "through\n" {
		t.Fatalf("exec through the gateway: %q, %v", out, err)
	}

	d.Kill9()
	_, lost := waitState(api.NodeLost, kube.LeaseDuration+15*time.Second)
	t.Logf("gateway saw the node lost %v after its kill -9", lost.Round(100*time.Millisecond))
	_, err = cl.Get(ctx, sb.ID)
	if !errors.Is(err, client.ErrUnavailable) || !strings.Contains(err.Error(), "gw-node") {
		t.Errorf("get of a lost node's sandbox: %v, want unavailable naming gw-node", err)
	}

	d.Start()
	_, back := waitState(api.NodeReady, 30*time.Second)
	t.Logf("gateway saw the node ready %v after its restart", back.Round(100*time.Millisecond))
	if out, err := echo(); err != nil || out != "through\n" {
		t.Errorf("exec through the gateway after the node's restart: %q, %v", out, err)
	}
}
