package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
	kube "github.com/paddock-dev/paddock/internal/cluster"
	"github.com/paddock-dev/paddock/internal/cluster/kubetest"
)

// kubeCluster is a cluster as deployed: a real kube-apiserver and etcd,
// nodes that register themselves (`paddock serve --cluster`) and
// gateways that watch them (`paddock gateway --cluster`).
type kubeCluster struct {
	t         *testing.T
	nodes     []*Daemon
	names     []string
	gateways  []*kubeGateway
	token     string
	tokenFile string
}

// kubeGateway is one `paddock gateway --cluster` process.
type kubeGateway struct {
	addr   string
	cmd    *exec.Cmd
	log    *syncBuffer
	client *client.Client
}

// startKubeCluster starts the control plane with deploy/'s CRD and RBAC,
// len(nodeFlags) nodes (named f1, f2, ...; each with its own dirs,
// network, uid range and cgroup parent, and its extra flags) and
// gateways gateways, and waits until every gateway sees every node
// ready. Everything goes when the test ends.
func startKubeCluster(t *testing.T, gateways int, nodeFlags ...[]string) *kubeCluster {
	t.Helper()
	kc := kubetest.Start(t)
	kc.Apply(t, "../deploy/crd-paddocknode.yaml", "../deploy/rbac.yaml")
	dir := t.TempDir()
	c := &kubeCluster{t: t, token: "client-token-" + randHex(8), tokenFile: filepath.Join(dir, "client.token")}
	nodeTokenFile := filepath.Join(dir, "node.token")
	os.WriteFile(nodeTokenFile, []byte("node-token-"+randHex(8)+"\n"), 0o600)
	os.WriteFile(c.tokenFile, []byte(c.token+"\n"), 0o600)
	nodeKube := kc.Kubeconfig(t, kubetest.Node)
	slot := takeSlot(t)
	for i, extra := range nodeFlags {
		name := fmt.Sprintf("f%d", i+1)
		addr := freeHostPort(t)
		d := prepareDaemon(t)
		d.NetName = slot.name("hf", i+1)
		d.Cgroup = "paddock-" + d.NetName
		d.UIDStart = slot.uidStart(i + 1)
		d.args = append(d.args, "--listen", "tcp://"+addr, "--token-file", nodeTokenFile,
			"--network-name", d.NetName, "--network-subnet", slot.subnet(i+1),
			"--cgroup-parent", d.Cgroup, "--uid-start", fmt.Sprint(d.UIDStart),
			"--cluster", "--kubeconfig", nodeKube, "--node-name", name, "--node-address", "http://"+addr)
		d.args = append(d.args, extra...)
		d.Start()
		c.nodes = append(c.nodes, d)
		c.names = append(c.names, name)
	}
	gwKube := kc.Kubeconfig(t, kubetest.Gateway)
	for range gateways {
		g := &kubeGateway{addr: freeHostPort(t), log: &syncBuffer{}}
		g.cmd = exec.Command(paddockBin, "gateway", "--listen", "tcp://"+g.addr, "--token-file", c.tokenFile,
			"--node-token-file", nodeTokenFile, "--cluster", "--kubeconfig", gwKube, "--log-level", "debug")
		g.cmd.Stdout, g.cmd.Stderr = g.log, g.log
		if err := g.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if g.cmd.ProcessState == nil {
				g.cmd.Process.Signal(syscall.SIGTERM)
				g.cmd.Wait()
			}
			if t.Failed() {
				t.Logf("gateway %s log:\n%s", g.addr, g.log)
			}
		})
		cl, err := client.New("tcp://"+g.addr, client.WithToken(c.token))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		g.client = cl
		c.gateways = append(c.gateways, g)
	}
	for _, name := range c.names {
		c.waitState(name, api.NodeReady, 60*time.Second)
	}
	return c
}

// nodes is what gateway g says of the nodes, by name.
func (c *kubeCluster) nodesAt(g int) map[string]api.Node {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	list, err := c.gateways[g].client.Nodes(ctx)
	m := map[string]api.Node{}
	if err == nil {
		for _, n := range list {
			m[n.Name] = n
		}
	}
	return m
}

// waitState waits until every live gateway sees node name in state, and
// returns how long that took.
func (c *kubeCluster) waitState(name, state string, limit time.Duration) time.Duration {
	c.t.Helper()
	return c.waitNode(name, limit, state, func(n api.Node) bool { return n.State == state })
}

func (c *kubeCluster) waitNode(name string, limit time.Duration, what string, cond func(api.Node) bool) time.Duration {
	c.t.Helper()
	start := time.Now()
	ok := waitFor(limit, 50*time.Millisecond, func() bool {
		for g, gw := range c.gateways {
			if gw.cmd.ProcessState != nil {
				continue
			}
			if n, found := c.nodesAt(g)[name]; !found || !cond(n) {
				return false
			}
		}
		return true
	})
	if !ok {
		c.t.Fatalf("node %s not %s at every gateway after %v: %+v", name, what, limit, c.nodesAt(0)[name])
	}
	return time.Since(start)
}

// cli runs the CLI against gateway g.
func (c *kubeCluster) cli(g int, args ...string) Result {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, paddockBin, args...)
	cmd.Env = append(os.Environ(), "PADDOCK_HOST=tcp://"+c.gateways[g].addr, "PADDOCK_TOKEN="+c.token)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := Result{Stdout: out.String(), Stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.Code = ee.ExitCode()
	case err != nil:
		c.t.Fatalf("paddock %v: %v", args, err)
	}
	return r
}

// nodeOf is the node name of the sandbox id, by its tag.
func (c *kubeCluster) nodeOf(id string) string {
	for _, n := range c.nodesAt(0) {
		if strings.HasPrefix(id, n.Tag) {
			return n.Name
		}
	}
	return ""
}

// TestClusterFailover drives a cluster as deployed (a real API server,
// three registered nodes, two gateways watching them) through what
// issue 22 asks of placement and failure: warm guests first, capacity
// honoured with a clear 503 when nothing fits, inspect naming the node,
// a node drained and back, a node killed with -9 while clients create
// (no create fails; its sandboxes answer 503 naming it; once restarted
// they serve with their files and processes), and a gateway killed with
// -9 while the other serves every call. Timing is the bench's (make
// cluster-bench); this checks behaviour.
func TestClusterFailover(t *testing.T) {
	const mib = 1 << 20
	c := startKubeCluster(t, 2,
		[]string{"--warm-guests", "2"},
		[]string{"--warm-guests", "0"},
		// A node with room for two sandboxes of 256 MiB (1 GiB less the
		// 512 MiB kept for the host).
		[]string{"--warm-guests", "0", "--admission-memory", "1g", "--memory-overcommit", "1", "--node-labels", "room=small"},
	)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	gw := c.gateways[0].client
	small := api.CreateRequest{Resources: api.Resources{CPUs: 0.1, MemoryBytes: 256 * mib}}

	// Warm guests first: f1 has two of the host image, the others none.
	c.waitNode("f1", 30*time.Second, "with 2 warm guests", func(n api.Node) bool { return n.Pools["image:host"] >= 2 })
	var ids []string
	for i := range 2 {
		sb, err := gw.Create(ctx, small)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.nodeOf(sb.ID); got != "f1" {
			t.Errorf("create %d went to %s; want f1, the node with warm guests", i, got)
		}
		ids = append(ids, sb.ID)
	}

	// inspect through a gateway names the node.
	r := c.cli(1, "inspect", ids[0])
	var shown api.Sandbox
	if r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &shown) != nil || shown.Node != "f1" {
		t.Errorf("inspect through the gateway: %+v; want node f1", r)
	}

	// Capacity: f3 has room for two of these, and never holds more; a
	// create only f3 may take (by its label) gets a clear 503 once it is
	// full, as does one bigger than every node.
	for range 6 {
		sb, err := gw.Create(ctx, small)
		if err != nil {
			t.Fatalf("create with room left: %v", err)
		}
		ids = append(ids, sb.ID)
	}
	onF3 := func() int {
		n := 0
		for _, id := range ids {
			if c.nodeOf(id) == "f3" {
				n++
			}
		}
		return n
	}
	for onF3() < 2 {
		sb, err := gw.Create(ctx, api.CreateRequest{Resources: small.Resources, NodeSelector: map[string]string{"room": "small"}})
		if err != nil || c.nodeOf(sb.ID) != "f3" {
			t.Fatalf("create selecting f3 with room on it: %v on %s", err, c.nodeOf(sb.ID))
		}
		ids = append(ids, sb.ID)
	}
	_, err := gw.Create(ctx, api.CreateRequest{Resources: small.Resources, NodeSelector: map[string]string{"room": "small"}})
	if !errors.Is(err, client.ErrUnavailable) || !strings.Contains(err.Error(), "memory") {
		t.Errorf("a create only the full f3 may take: %v; want unavailable naming memory", err)
	}
	for range 4 {
		sb, err := gw.Create(ctx, small)
		if err != nil || c.nodeOf(sb.ID) == "f3" {
			t.Fatalf("create with f3 full: %v on %s", err, c.nodeOf(sb.ID))
		}
		ids = append(ids, sb.ID)
	}
	if n := onF3(); n != 2 {
		t.Errorf("f3 holds %d sandboxes; its room is for 2", n)
	}
	_, err = gw.Create(ctx, api.CreateRequest{Resources: api.Resources{MemoryBytes: 1 << 50}})
	if !errors.Is(err, client.ErrUnavailable) || !strings.Contains(err.Error(), "memory") {
		t.Errorf("a create no node has room for: %v; want unavailable naming memory", err)
	}

	// Drain f2 through one gateway: both place nothing on it, its
	// sandboxes serve; undrained, it takes creates again.
	if r := c.cli(0, "nodes", "drain", "f2"); r.Code != 0 || !strings.Contains(r.Stdout, "f2\tdraining") {
		t.Fatalf("paddock nodes drain f2: %+v", r)
	}
	c.waitState("f2", api.NodeDraining, 10*time.Second)
	for g := range c.gateways {
		for range 3 {
			sb, err := c.gateways[g].client.Create(ctx, small)
			if err != nil || c.nodeOf(sb.ID) == "f2" {
				t.Fatalf("create through gateway %d with f2 draining: %v on %s", g, err, c.nodeOf(sb.ID))
			}
			ids = append(ids, sb.ID)
		}
	}
	var onF2 string
	for _, id := range ids {
		if c.nodeOf(id) == "f2" {
			onF2 = id
		}
	}
	if onF2 == "" {
		t.Fatal("no sandbox landed on f2 before its drain")
	}
	if r := c.cli(1, "exec", onF2, "--", "echo", "still"); r.Code != 0 || r.Stdout != "still\n" {
		t.Errorf("exec on the draining node: %+v", r)
	}
	if r := c.cli(1, "nodes"); r.Code != 0 || !strings.Contains(r.Stdout, "draining") {
		t.Errorf("paddock nodes: %+v", r)
	}
	if r := c.cli(1, "nodes", "undrain", "f2", "nosuch"); r.Code != 1 || !strings.Contains(r.Stdout, "f2\tready") || !strings.Contains(r.Stderr, "nosuch") {
		t.Errorf("paddock nodes undrain f2 nosuch: %+v", r)
	}
	c.waitState("f2", api.NodeReady, 10*time.Second)
	for _, id := range ids {
		gw.Delete(ctx, id, true)
	}

	// f2 holds sandboxes with a file and a process each.
	var held []string
	for len(held) < 3 {
		sb, err := c.nodes[1].Client().Create(ctx, small)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, sb.ID)
		if r := c.cli(0, "exec", sb.ID, "--", "sh", "-c", "echo kept-"+sb.ID+" > /tmp/f"); r.Code != 0 {
			t.Fatalf("writing the file: %+v", r)
		}
		if _, err := gw.StartProcess(ctx, sb.ID, api.StartRequest{Cmd: []string{"sleep", "3600"}}); err != nil {
			t.Fatal(err)
		}
	}

	// kill -9 of f2 while 4 clients create: no create fails.
	var creates, failures atomic.Int64
	var firstFail atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := c.gateways[w%2].client
			for {
				select {
				case <-stop:
					return
				default:
				}
				sb, err := cl.Create(ctx, small)
				creates.Add(1)
				if err != nil {
					failures.Add(1)
					firstFail.CompareAndSwap(nil, err.Error())
					continue
				}
				cl.Delete(ctx, sb.ID, true)
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	c.nodes[1].Kill9()
	lost := c.waitState("f2", api.NodeLost, kube.LeaseDuration+20*time.Second)
	t.Logf("f2 lost at both gateways %v after its kill -9", lost.Round(100*time.Millisecond))
	for g := range c.gateways {
		_, err := c.gateways[g].client.Get(ctx, held[0])
		if !errors.Is(err, client.ErrUnavailable) || !strings.Contains(err.Error(), "f2") {
			t.Errorf("gateway %d: get of a lost node's sandbox: %v; want 503 naming f2", g, err)
		}
	}
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	t.Logf("%d creates while f2 died, %d failed", creates.Load(), failures.Load())
	if failures.Load() > 0 {
		t.Errorf("%d of %d creates failed while f2 died; the first: %v", failures.Load(), creates.Load(), firstFail.Load())
	}

	// Back: its sandboxes serve, with their files and processes.
	c.nodes[1].Start()
	c.waitState("f2", api.NodeReady, 60*time.Second)
	for _, id := range held {
		if r := c.cli(1, "exec", id, "--", "cat", "/tmp/f"); r.Code != 0 || r.Stdout != "kept-"+id+"\n" {
			t.Errorf("%s after f2's restart: %+v", id, r)
		}
		ps, err := gw.Processes(ctx, id)
		running := false
		for _, p := range ps {
			running = running || (p.State == "running" && strings.Join(p.Cmd, " ") == "sleep 3600")
		}
		if err != nil || !running {
			t.Errorf("%s's sleep after f2's restart: %+v, %v", id, ps, err)
		}
	}

	// kill -9 of a gateway: the other serves every call.
	c.gateways[0].cmd.Process.Kill()
	c.gateways[0].cmd.Wait()
	other := c.gateways[1].client
	for range 3 {
		sb, err := other.Create(ctx, small)
		if err != nil {
			t.Fatalf("create with gateway 1 dead: %v", err)
		}
		var out strings.Builder
		if st, err := other.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"echo", "ok"}}, client.ExecIO{Stdout: &out}); err != nil || st.ExitCode != 0 || out.String() != "ok\n" {
			t.Fatalf("exec with gateway 1 dead: %v %v %q", st, err, out.String())
		}
		if err := other.Delete(ctx, sb.ID, true); err != nil {
			t.Fatal(err)
		}
	}
	if list, err := other.List(ctx, client.ListOptions{}); err != nil || len(list) < len(held) {
		t.Errorf("list with gateway 1 dead: %d, %v", len(list), err)
	}
}
