package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// clusterSoak is how long the 8 create loops go on after the killed
// node's Lease expired (make cluster-bench: -cluster-soak 5m).
var clusterSoak = 10 * time.Second

const (
	clusterHeld    = 20  // sandboxes on the node killed with -9
	clusterClients = 8   // create loops while it dies
	clusterCreates = 60  // placement's creates
	placeMemory    = 256 // MiB per placement create
)

// clusterRooms are the nodes' rooms for placement's creates: the
// sandboxes of placeMemory MiB their --admission-memory admits (less
// the 512 MiB kept for the host), clusterCreates in all.
var clusterRooms = []int{10, 20, 30}

// localCluster is a cluster started by scripts/cluster-up.sh (the one
// implementation of `make cluster-up`) in a directory of the run's own.
type localCluster struct {
	dir, script string
	env         []string
	vars        map[string]string // DIR/env's
	token       string
	gateways    []*client.Client // by index: gateway1, gateway2
}

// startLocalCluster runs scripts/cluster-up.sh with the run's own
// directory, network, uid range and cgroup parent, and nodeFlags[i] for
// node i+1.
func (r *rig) startLocalCluster(ctx context.Context, nodeFlags []string) (*localCluster, error) {
	script, err := findScript("cluster-up.sh")
	if err != nil {
		return nil, err
	}
	pid := os.Getpid()
	c := &localCluster{dir: filepath.Join(r.root, "cluster"), script: script}
	c.env = append(os.Environ(),
		"PADDOCK_CLUSTER_DIR="+c.dir,
		"PADDOCK_BIN="+r.opts.bin,
		fmt.Sprintf("PADDOCK_CLUSTER_NET=pk%03x", pid&0xfff),
		"PADDOCK_CLUSTER_SUBNET="+freeSubnet(pid+1),
		fmt.Sprintf("PADDOCK_CLUSTER_UID_START=%d", uint32(3<<30)+uint32(pid%4)<<26),
		"PADDOCK_CLUSTER_CGROUP="+r.cgroupParent+"-cluster")
	for i, f := range nodeFlags {
		c.env = append(c.env, fmt.Sprintf("PADDOCK_CLUSTER_NODE%d_FLAGS=%s", i+1, f))
	}
	if err := c.up(ctx); err != nil {
		return c, err
	}
	if c.vars, err = readEnvFile(filepath.Join(c.dir, "env")); err != nil {
		return c, err
	}
	c.token = c.vars["PADDOCK_TOKEN"]
	for _, host := range []string{c.vars["PADDOCK_HOST"], c.vars["GATEWAY2_HOST"]} {
		cl, err := client.New(host, client.WithToken(c.token))
		if err != nil {
			return c, err
		}
		c.gateways = append(c.gateways, cl)
	}
	return c, nil
}

// up runs cluster-up.sh: it starts what is not running and waits until
// every gateway sees every node ready.
func (c *localCluster) up(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, c.script)
	cmd.Env = c.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("cluster-up: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// down runs cluster-down.sh, which removes every part and says what it
// found left.
func (c *localCluster) down() error {
	for _, cl := range c.gateways {
		cl.Close()
	}
	cmd := exec.Command(filepath.Join(filepath.Dir(c.script), "cluster-down.sh"))
	cmd.Env = c.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("cluster-down: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// kill9 kills a part (node2, gateway1) by the pid cluster-up recorded.
func (c *localCluster) kill9(part string) error {
	b, err := os.ReadFile(filepath.Join(c.dir, part, "pid"))
	if err != nil {
		return err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return err
	}
	// cluster-up's processes outlive the script that started them and
	// are the bench's children then (it is their subreaper): reap it, or
	// its zombie would look alive.
	var ws syscall.WaitStatus
	syscall.Wait4(pid, &ws, 0, nil)
	return nil
}

// node is a client of node i's own socket (as root), bypassing gateways.
func (c *localCluster) node(i int) (*client.Client, error) {
	return client.New("unix://" + filepath.Join(c.dir, fmt.Sprintf("node%d", i), "paddock.sock"))
}

// states is each node's state at gateway g, by name.
func (c *localCluster) nodes(ctx context.Context, g int) (map[string]api.Node, error) {
	list, err := c.gateways[g].Nodes(ctx)
	m := map[string]api.Node{}
	for _, n := range list {
		m[n.Name] = n
	}
	return m, err
}

// waitState waits until every gateway in gws sees node name in state.
func (c *localCluster) waitState(ctx context.Context, gws []int, name, state string, limit time.Duration) (time.Duration, error) {
	start := time.Now()
	for {
		ok := true
		for _, g := range gws {
			m, err := c.nodes(ctx, g)
			if err != nil || m[name].State != state {
				ok = false
			}
		}
		if ok {
			return time.Since(start), nil
		}
		if time.Since(start) > limit {
			return 0, fmt.Errorf("node %s not %s at the gateways after %v", name, state, limit)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func findScript(name string) (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		p := filepath.Join(d, "scripts", name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		if d == filepath.Dir(d) {
			return "", fmt.Errorf("no scripts/%s above %s: run the bench from the checkout", name, wd)
		}
	}
}

// readEnvFile reads the `export K=V` lines of cluster-up's env file.
func readEnvFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(strings.TrimPrefix(sc.Text(), "export "), "="); ok && !strings.HasPrefix(k, "#") {
			out[k] = v
		}
	}
	return out, sc.Err()
}

// clusterRun is what the cluster section measured.
type clusterRun struct {
	// placement
	firstWarm   []string // nodes of the first creates, with node2 alone warm
	perNode     map[string]int
	placeFailed int
	fullErr     string // the answer to a create when every node is full
	// node failure
	window        time.Duration // kill -9 → every gateway sees the node lost
	creates       [2]int64      // during the window, after it
	failed        [2]int64
	firstFailures [2]string
	lostAnswers   int    // calls for its sandboxes answered 503 naming it
	lostSample    string // one such answer
	back          time.Duration
	servedAgain   int // of clusterHeld: file and process intact
	// gateway failure
	gwCalls, gwFailed int
}

// benchCluster measures issue 22's bars 4 and 5 on 3 nodes and 2
// gateways started by scripts/cluster-up.sh with a real kube-apiserver
// and etcd: placement honouring capacity and warm guests, then kill -9
// of a node while clients create, and of a gateway.
func benchCluster(ctx context.Context, r *rig) *section {
	s := &section{Method: []string{
		"`scripts/cluster-up.sh` (what `make cluster-up` runs) in the run's own directory: etcd and kube-apiserver, deploy/'s CRDs and RBAC, " +
			"3 `paddock serve --cluster` nodes and 2 `paddock gateway --cluster`, all on this host. Clients use the Go SDK through the gateways.",
		fmt.Sprintf("**placement**: the nodes admit %v sandboxes of %d MiB (`--admission-memory`, `--memory-overcommit 1`); node2 alone keeps warm guests "+
			"(`--warm-guests 4`, the others 0). %d creates of %d MiB through gateway 1, 4 at a time; then one more, which no node has room for.",
			clusterRooms, placeMemory, clusterCreates, placeMemory),
		fmt.Sprintf("**node failure**: %d sandboxes made on node2, each with a file and a running `sleep`; %d clients (half on each gateway) "+
			"create and delete sandboxes in a loop; node2 gets kill -9; the loops go on until %v after every gateway sees it lost (its Lease expired), "+
			"then node2 is started again (`cluster-up.sh` starts what is not running) and its sandboxes are checked.", clusterHeld, clusterClients, clusterSoak),
		"**gateway failure**: gateway 1 gets kill -9; create, exec, get, list and delete go through gateway 2.",
	}}
	var run clusterRun
	s.Err = r.clusterCompare(ctx, &run)

	pt := table{Caption: "Placement", Header: []string{"node", "room", "sandboxes placed"}}
	for i, room := range clusterRooms {
		name := fmt.Sprintf("node%d", i+1)
		pt.add(name, fmt.Sprint(room), fmt.Sprint(run.perNode[name]))
	}
	s.Tables = append(s.Tables, pt)
	ft := table{Caption: "Node and gateway failure", Header: []string{"measure", "value"}}
	ft.add("kill -9 of node2 → every gateway sees it lost (the window)", ms(run.window))
	ft.add("creates during the window: made, failed", fmt.Sprintf("%d, %d", run.creates[0], run.failed[0]))
	ft.add("creates after the window: made, failed", fmt.Sprintf("%d, %d", run.creates[1], run.failed[1]))
	ft.add("restart of node2 → ready at every gateway", ms(run.back))
	ft.add(fmt.Sprintf("of its %d sandboxes, serving again with file and process", clusterHeld), fmt.Sprint(run.servedAgain))
	ft.add("calls through gateway 2 with gateway 1 killed: made, failed", fmt.Sprintf("%d, %d", run.gwCalls, run.gwFailed))
	s.Tables = append(s.Tables, ft)
	if run.firstWarm != nil {
		s.note("The first creates went to %s (node2 alone had warm guests).", strings.Join(run.firstWarm, ", "))
	}
	if run.fullErr != "" {
		s.note("With every node full, a create got: %s", run.fullErr)
	}
	if run.lostSample != "" {
		s.note("A call for one of node2's sandboxes while it was lost got: %s", run.lostSample)
	}
	for i, f := range run.firstFailures {
		if f != "" {
			s.note("First failed create %s the window: %s", []string{"during", "after"}[i], f)
		}
	}
	s.Bars = clusterBars(&run, s.Err == nil)
	return s
}

func clusterBars(run *clusterRun, complete bool) []bar {
	place := bar{Issue: 22, What: fmt.Sprintf("%d creates on 3 nodes: capacity honoured, warm guests first, 503 when all are full", clusterCreates),
		Target: "no node over its room, a clear 503, warm node first", Value: noPeerValue, Verdict: notMeasured}
	node := bar{Issue: 22, What: fmt.Sprintf("kill -9 of a node holding %d sandboxes while %d clients create", clusterHeld, clusterClients),
		Target: "0 failed creates after its Lease expires; its sandboxes 503 naming it; all serve again after restart", Value: noPeerValue, Verdict: notMeasured}
	gw := bar{Issue: 22, What: "kill -9 of one gateway", Target: "the other serves every call", Value: noPeerValue, Verdict: notMeasured}
	if run.perNode != nil {
		over := false
		for i, room := range clusterRooms {
			over = over || run.perNode[fmt.Sprintf("node%d", i+1)] > room
		}
		warmFirst := len(run.firstWarm) > 0 && run.firstWarm[0] == "node2"
		place.Value = fmt.Sprintf("placed %d/%d/%d (rooms %v), %d failed; full: %q; first on %v",
			run.perNode["node1"], run.perNode["node2"], run.perNode["node3"], clusterRooms, run.placeFailed, shorten(run.fullErr, 80), run.firstWarm)
		place.Verdict = check(!over && run.placeFailed == 0 && strings.Contains(run.fullErr, "memory") && warmFirst)
	}
	if complete || run.servedAgain > 0 {
		node.Value = fmt.Sprintf("window %s; failed creates %d of %d during it, %d of %d after; %d/%d answered 503 naming it; %d/%d served again",
			ms(run.window), run.failed[0], run.creates[0], run.failed[1], run.creates[1], run.lostAnswers, 2*clusterHeld, run.servedAgain, clusterHeld)
		node.Verdict = check(run.failed[1] == 0 && run.creates[1] > 0 && run.lostAnswers == 2*clusterHeld && run.servedAgain == clusterHeld)
	}
	if run.gwCalls > 0 {
		gw.Value = fmt.Sprintf("%d calls, %d failed", run.gwCalls, run.gwFailed)
		gw.Verdict = check(run.gwFailed == 0)
	}
	return []bar{place, node, gw}
}

func shorten(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// clusterCompare starts the cluster, runs the three parts and removes it.
func (r *rig) clusterCompare(ctx context.Context, run *clusterRun) (retErr error) {
	var flags []string
	for i, room := range clusterRooms {
		warm := 0
		if i == 1 {
			warm = 4
		}
		flags = append(flags, fmt.Sprintf("--admission-memory %dm --memory-overcommit 1 --warm-guests %d", 512+room*placeMemory, warm))
	}
	c, err := r.startLocalCluster(ctx, flags)
	if c == nil {
		return err
	}
	defer func() {
		retErr = errors.Join(retErr, c.down())
		reapOrphans(r.daemon.pid())
	}()
	if err != nil {
		return err
	}
	r.log.Info("cluster: up", "dir", c.dir)
	if err := r.clusterPlace(ctx, c, run); err != nil {
		return fmt.Errorf("placement: %w", err)
	}
	r.log.Info("cluster: placement done", "per_node", run.perNode)
	if err := r.clusterNodeFailure(ctx, c, run); err != nil {
		return fmt.Errorf("node failure: %w", err)
	}
	r.log.Info("cluster: node failure done", "window", run.window)
	return r.clusterGatewayFailure(ctx, c, run)
}

// nodeOf names the node whose tag starts id.
func nodeOf(nodes map[string]api.Node, id string) string {
	for name, n := range nodes {
		if strings.HasPrefix(id, n.Tag) {
			return name
		}
	}
	return "?"
}

func (r *rig) clusterPlace(ctx context.Context, c *localCluster, run *clusterRun) error {
	gw := c.gateways[0]
	// node2's warm guests, published.
	for deadline := time.Now().Add(time.Minute); ; {
		m, err := c.nodes(ctx, 0)
		if err == nil && m["node2"].Pools["image:host"] >= 4 {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("node2 published no 4 warm guests within a minute")
		}
		time.Sleep(100 * time.Millisecond)
	}
	nodes, err := c.nodes(ctx, 0)
	if err != nil {
		return err
	}
	req := api.CreateRequest{Resources: api.Resources{CPUs: 0.1, MemoryBytes: placeMemory << 20}}
	var ids []string
	for range 3 {
		sb, err := gw.Create(ctx, req)
		if err != nil {
			return err
		}
		ids = append(ids, sb.ID)
		run.firstWarm = append(run.firstWarm, nodeOf(nodes, sb.ID))
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				sb, err := gw.Create(ctx, req)
				mu.Lock()
				if err != nil {
					run.placeFailed++
					if run.fullErr == "" {
						r.log.Warn("cluster: placement create failed", "err", err)
					}
				} else {
					ids = append(ids, sb.ID)
				}
				mu.Unlock()
			}
		}()
	}
	for range clusterCreates - len(ids) {
		next <- struct{}{}
	}
	close(next)
	wg.Wait()
	_, err = gw.Create(ctx, req)
	if err == nil {
		return errors.New("a create beyond every node's room succeeded")
	}
	run.fullErr = err.Error()
	run.perNode = map[string]int{}
	for _, id := range ids {
		run.perNode[nodeOf(nodes, id)]++
	}
	for _, id := range ids {
		if err := gw.Delete(ctx, id, true); err != nil {
			return err
		}
	}
	return nil
}

func (r *rig) clusterNodeFailure(ctx context.Context, c *localCluster, run *clusterRun) error {
	n2, err := c.node(2)
	if err != nil {
		return err
	}
	defer n2.Close()
	small := api.CreateRequest{Resources: api.Resources{CPUs: 0.1, MemoryBytes: 64 << 20}}
	var held []string
	for range clusterHeld {
		sb, err := n2.Create(ctx, small)
		if err != nil {
			return err
		}
		held = append(held, sb.ID)
		if err := r.clusterExec(ctx, c.gateways[0], sb.ID, "", "sh", "-c", "echo kept-"+sb.ID+" > /tmp/f"); err != nil {
			return err
		}
		if _, err := c.gateways[0].StartProcess(ctx, sb.ID, api.StartRequest{Cmd: []string{"sleep", "3600"}}); err != nil {
			return err
		}
	}
	// The loops count into phase 0 until every gateway sees node2 lost,
	// then into phase 1.
	var phase atomic.Int32
	var mu sync.Mutex
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range clusterClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			gw := c.gateways[w%2]
			for {
				select {
				case <-stop:
					return
				default:
				}
				ph := phase.Load()
				sb, err := gw.Create(ctx, small)
				atomic.AddInt64(&run.creates[ph], 1)
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					atomic.AddInt64(&run.failed[ph], 1)
					mu.Lock()
					if run.firstFailures[ph] == "" {
						run.firstFailures[ph] = err.Error()
					}
					mu.Unlock()
					continue
				}
				gw.Delete(ctx, sb.ID, true)
			}
		}()
	}
	time.Sleep(2 * time.Second)
	t0 := time.Now()
	if err := c.kill9("node2"); err != nil {
		close(stop)
		wg.Wait()
		return err
	}
	_, err = c.waitState(ctx, []int{0, 1}, "node2", api.NodeLost, time.Minute)
	run.window = time.Since(t0)
	phase.Store(1)
	if err == nil {
		select {
		case <-time.After(clusterSoak):
		case <-ctx.Done():
		}
	}
	close(stop)
	wg.Wait()
	if err != nil {
		return err
	}
	for _, id := range held {
		for g := range c.gateways {
			_, err := c.gateways[g].Get(ctx, id)
			if errors.Is(err, client.ErrUnavailable) && strings.Contains(err.Error(), "node2") {
				run.lostAnswers++
				run.lostSample = err.Error()
			}
		}
	}
	t1 := time.Now()
	if err := c.up(ctx); err != nil {
		return err
	}
	if _, err := c.waitState(ctx, []int{0, 1}, "node2", api.NodeReady, time.Minute); err != nil {
		return err
	}
	run.back = time.Since(t1)
	for _, id := range held {
		if err := r.clusterExec(ctx, c.gateways[1], id, "kept-"+id+"\n", "cat", "/tmp/f"); err != nil {
			r.log.Warn("cluster: a sandbox of node2 after its restart", "sandbox", id, "err", err)
			continue
		}
		ps, err := c.gateways[1].Processes(ctx, id)
		running := false
		for _, p := range ps {
			running = running || (p.State == "running" && strings.Join(p.Cmd, " ") == "sleep 3600")
		}
		if err != nil || !running {
			r.log.Warn("cluster: the sleep of a sandbox of node2 after its restart", "sandbox", id, "err", err)
			continue
		}
		run.servedAgain++
	}
	for _, id := range held {
		c.gateways[1].Delete(ctx, id, true)
	}
	return nil
}

// clusterExec runs cmd in sandbox id through gw and checks its exit and,
// if want is not empty, its output.
func (r *rig) clusterExec(ctx context.Context, gw *client.Client, id, want string, cmd ...string) error {
	var out strings.Builder
	st, err := gw.Exec(ctx, id, api.ExecRequest{Cmd: cmd}, client.ExecIO{Stdout: &out})
	if err := execResult(cmd, st, err, ""); err != nil {
		return err
	}
	if want != "" && out.String() != want {
		return fmt.Errorf("%v printed %q, want %q", cmd, out.String(), want)
	}
	return nil
}

func (r *rig) clusterGatewayFailure(ctx context.Context, c *localCluster, run *clusterRun) error {
	if err := c.kill9("gateway1"); err != nil {
		return err
	}
	gw := c.gateways[1]
	call := func(err error) {
		run.gwCalls++
		if err != nil {
			run.gwFailed++
			r.log.Warn("cluster: a call through gateway 2 failed", "err", err)
		}
	}
	for range 10 {
		sb, err := gw.Create(ctx, api.CreateRequest{Resources: api.Resources{CPUs: 0.1, MemoryBytes: 64 << 20}})
		call(err)
		if err != nil {
			continue
		}
		call(r.clusterExec(ctx, gw, sb.ID, "ok\n", "echo", "ok"))
		_, err = gw.Get(ctx, sb.ID)
		call(err)
		_, err = gw.List(ctx, client.ListOptions{})
		call(err)
		call(gw.Delete(ctx, sb.ID, true))
	}
	return nil
}
