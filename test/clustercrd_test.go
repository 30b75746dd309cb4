package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
	kube "github.com/paddock-dev/paddock/internal/cluster"
	"github.com/paddock-dev/paddock/internal/cluster/kubetest"
)

// crdCluster is a real API server with deploy/ applied, n nodes
// registered in it and a gateway fed by it.
type crdCluster struct {
	kc      *kubetest.Cluster
	nodes   []*Daemon
	client  *client.Client
	gwLog   *syncBuffer
	objects *kube.Watcher
	dyn     dynamic.Interface
	gwAddr  string
	token   string
}

func startCRDCluster(t *testing.T, n int) *crdCluster {
	t.Helper()
	kc := kubetest.Start(t)
	kc.Apply(t, "../deploy/crd-paddocknode.yaml", "../deploy/crd-sandboxtemplate.yaml", "../deploy/crd-sandboxwarmpool.yaml",
		"../deploy/crd-policypreset.yaml", "../deploy/crd-sandbox.yaml", "../deploy/rbac.yaml")
	dir := t.TempDir()
	nodeTokenFile, tokenFile := filepath.Join(dir, "node.token"), filepath.Join(dir, "client.token")
	token := "client-token-" + randHex(8)
	c := &crdCluster{kc: kc, token: token}
	os.WriteFile(nodeTokenFile, []byte("node-token-"+randHex(8)+"\n"), 0o600)
	os.WriteFile(tokenFile, []byte(token+"\n"), 0o600)
	slot := takeSlot(t)
	for i := 1; i <= n; i++ {
		addr := freeHostPort(t)
		d := prepareDaemon(t)
		d.NetName = slot.name("cd", i)
		d.Cgroup = "paddock-" + d.NetName
		d.UIDStart = slot.uidStart(i)
		d.args = append(d.args, "--listen", "tcp://"+addr, "--token-file", nodeTokenFile,
			"--network-name", d.NetName, "--network-subnet", slot.subnet(i),
			"--cgroup-parent", d.Cgroup, "--uid-start", fmt.Sprint(d.UIDStart),
			"--cluster", "--kubeconfig", kc.Kubeconfig(t, kubetest.Node),
			"--node-name", fmt.Sprintf("crd-node%d", i), "--node-address", "http://"+addr)
		d.Start()
		c.nodes = append(c.nodes, d)
	}
	gwAddr := freeHostPort(t)
	c.gwAddr = gwAddr
	c.gwLog = &syncBuffer{}
	gw := exec.Command(paddockBin, "gateway", "--listen", "tcp://"+gwAddr, "--token-file", tokenFile,
		"--node-token-file", nodeTokenFile, "--cluster", "--kubeconfig", kc.Kubeconfig(t, kubetest.Gateway), "--log-level", "debug")
	gw.Stdout, gw.Stderr = c.gwLog, c.gwLog
	if err := gw.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		gw.Process.Signal(syscall.SIGTERM)
		gw.Wait()
		if t.Failed() {
			t.Logf("gateway log:\n%s", c.gwLog)
		}
	})
	cl, err := client.New("tcp://"+gwAddr, client.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	c.client = cl
	if !waitFor(60*time.Second, 100*time.Millisecond, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		nodes, err := cl.Nodes(ctx)
		ready := 0
		for _, nd := range nodes {
			if nd.State == api.NodeReady {
				ready++
			}
		}
		return err == nil && ready == n
	}) {
		t.Fatalf("the gateway does not see %d ready nodes:\n%s", n, c.gwLog)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if c.objects, err = kube.Watch(ctx, kc.Config(kubetest.Admin), kube.WatchTemplates|kube.WatchPools|kube.WatchPresets|kube.WatchSandboxes); err != nil {
		t.Fatal(err)
	}
	if c.dyn, err = dynamic.NewForConfig(kc.Config(kubetest.Admin)); err != nil {
		t.Fatal(err)
	}
	return c
}

// apply creates the objects of a YAML manifest.
func (c *crdCluster) apply(t *testing.T, manifest string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "objects.yaml")
	if err := os.WriteFile(path, []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	c.kc.Apply(t, path)
}

func (c *crdCluster) delete(t *testing.T, resource, ns, name string) {
	t.Helper()
	ri := c.dyn.Resource(schema.GroupVersionResource{Group: kube.Group, Version: kube.Version, Resource: resource})
	var err error
	if ns != "" {
		err = ri.Namespace(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	} else {
		err = ri.Delete(context.Background(), name, metav1.DeleteOptions{})
	}
	if err != nil {
		t.Fatalf("deleting %s %s: %v", resource, name, err)
	}
}

// waitObjects waits until cond holds of the objects.
func (c *crdCluster) waitObjects(t *testing.T, what string, limit time.Duration, cond func(kube.Declared) bool) kube.Declared {
	t.Helper()
	var d kube.Declared
	if !waitFor(limit, 100*time.Millisecond, func() bool { d = c.objects.Now(); return cond(d) }) {
		for _, n := range c.nodes {
			t.Logf("node log:\n%s", tail(n.Log(), 40))
		}
		t.Fatalf("%s: not after %v", what, limit)
	}
	return d
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func condition(cs []metav1.Condition, typ string) metav1.Condition {
	for _, c := range cs {
		if c.Type == typ {
			return c
		}
	}
	return metav1.Condition{}
}

// TestClusterDeclaredObjects: with a real kube-apiserver, two nodes and a
// gateway, a SandboxTemplate is built on both nodes and creates through
// the gateway start from it; a SandboxWarmPool is shared out 2+1 and
// fills; a PolicyPreset is usable by name in a create; a malformed
// template gets a condition naming the bad field while the rest serves;
// the gateway's templates, pools, policies and secrets routes answer.
func TestClusterDeclaredObjects(t *testing.T) {
	t.Parallel()
	c := startCRDCluster(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	c.apply(t, `
apiVersion: paddock.dev/v1alpha1
kind: SandboxTemplate
metadata: {name: crd-tmpl}
spec:
  steps:
    - run: echo built-by-crd > /tmp/marker
    - env: {FROM_CRD: "yes"}
---
apiVersion: paddock.dev/v1alpha1
kind: SandboxWarmPool
metadata: {name: crd-pool}
spec:
  replicas: 3
  sandboxTemplateRef: {name: crd-tmpl}
---
apiVersion: paddock.dev/v1alpha1
kind: PolicyPreset
metadata: {name: corp}
spec:
  allow:
    - match: api.example.com
  presets: [pypi]
---
apiVersion: paddock.dev/v1alpha1
kind: PolicyPreset
metadata: {name: bad-preset}
spec:
  allow:
    - match: api.example.com
      methods: [GET]
`)
	d := c.waitObjects(t, "crd-tmpl built on both nodes", 2*time.Minute, func(d kube.Declared) bool {
		return len(d.Templates) == 1 && condition(d.Templates[0].Status.Conditions, kube.ConditionReady).Status == metav1.ConditionTrue
	})
	for name, b := range d.Templates[0].Status.Nodes {
		if b.State != kube.BuildReady || b.Snapshot == "" {
			t.Errorf("node %s's build: %+v", name, b)
		}
	}

	sb, err := c.client.Create(ctx, api.CreateRequest{From: "crd-tmpl"})
	if err != nil {
		t.Fatalf("create from the SandboxTemplate through the gateway: %v", err)
	}
	var out strings.Builder
	if _, err := c.client.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sh", "-c", "cat /tmp/marker; echo $FROM_CRD"}}, client.ExecIO{Stdout: &out}); err != nil || out.String() != "built-by-crd\nyes\n" {
		t.Errorf("sandbox from the SandboxTemplate: %q, %v", out.String(), err)
	}

	d = c.waitObjects(t, "crd-pool full", 2*time.Minute, func(d kube.Declared) bool {
		// Both nodes' shares (a node that built the template first holds
		// all of it until the other has built it too).
		return len(d.Pools) == 1 && d.Pools[0].Status.ReadyReplicas == 3 && d.Pools[0].Status.Replicas == 3 && len(d.Pools[0].Status.Nodes) == 2
	})
	var targets []int32
	for _, s := range d.Pools[0].Status.Nodes {
		targets = append(targets, s.Target)
	}
	if len(targets) != 2 || targets[0]+targets[1] != 3 || targets[0]*targets[1] != 2 {
		t.Errorf("pool shares: %+v, want 2 and 1", d.Pools[0].Status.Nodes)
	}
	pools, err := c.client.Pools(ctx)
	if err != nil || pools.Ready["template:crd-tmpl"] != 3 || pools.Target["template:crd-tmpl"] != 3 {
		t.Errorf("GET /v1/pools through the gateway: %+v, %v", pools, err)
	}
	tmpls, err := c.client.Templates(ctx)
	if err != nil || len(tmpls) != 1 || tmpls[0].Name != "crd-tmpl" || tmpls[0].WarmReady != 3 {
		t.Errorf("GET /v1/templates through the gateway: %+v, %v", tmpls, err)
	}

	// A preset by name.
	sb2, err := c.client.Create(ctx, api.CreateRequest{Policy: &api.Policy{Presets: []string{"corp"}}})
	if err != nil {
		t.Fatalf("create naming the PolicyPreset: %v", err)
	}
	p, err := c.client.Policy(ctx, sb2.ID)
	if err != nil || len(p.Allow) != 1 || p.Allow[0].Match != "api.example.com" || strings.Join(p.Presets, ",") != "pypi" {
		t.Errorf("policy of a sandbox made with preset corp: %+v, %v", p, err)
	}
	_, err = c.client.Create(ctx, api.CreateRequest{Policy: &api.Policy{Presets: []string{"nosuch"}}})
	if !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "nosuch") || !strings.Contains(err.Error(), "corp") {
		t.Errorf("create naming no preset: %v, want invalid naming it and the known ones", err)
	}
	_, err = c.client.Create(ctx, api.CreateRequest{Policy: &api.Policy{Presets: []string{"bad-preset"}}})
	if !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "bad-preset") || !strings.Contains(err.Error(), "allow[0]") {
		t.Errorf("create naming a malformed preset: %v, want invalid naming it and allow[0]", err)
	}
	var presets []api.PolicyPreset
	if code, body := rawJSON(t, c, "/v1/policies", &presets); code != 200 || len(presets) < 2 {
		t.Errorf("GET /v1/policies: %d %s", code, body)
	}

	// A malformed template: a condition naming the field; the rest serves.
	c.apply(t, `
apiVersion: paddock.dev/v1alpha1
kind: SandboxTemplate
metadata: {name: crd-bad}
spec:
  steps: [{run: "true"}]
  policy:
    allow: [{match: "*."}]
`)
	d = c.waitObjects(t, "crd-bad reported invalid", time.Minute, func(d kube.Declared) bool {
		for _, tm := range d.Templates {
			if tm.Name == "crd-bad" {
				return condition(tm.Status.Conditions, kube.ConditionValid).Status == metav1.ConditionFalse
			}
		}
		return false
	})
	for _, tm := range d.Templates {
		if v := condition(tm.Status.Conditions, kube.ConditionValid); tm.Name == "crd-bad" && !strings.Contains(v.Message, "allow[0]") {
			t.Errorf("crd-bad's Valid condition: %+v, want it to name allow[0]", v)
		}
	}
	if _, err := c.client.Create(ctx, api.CreateRequest{From: "crd-tmpl"}); err != nil {
		t.Errorf("create after a malformed template: %v", err)
	}

	// Writes through the gateway point at the objects.
	if code, body := c.rawDo(t, "PUT", "/v1/pools", `{"name":"image:host","size":1}`); code != 405 || !strings.Contains(body, "SandboxWarmPool") {
		t.Errorf("PUT /v1/pools through the gateway: %d %s", code, body)
	}

	// Deleting the template and the pool empties the nodes.
	c.delete(t, kube.PoolResource, "", "crd-pool")
	c.delete(t, kube.TemplateResource, "", "crd-tmpl")
	for i, n := range c.nodes {
		if !waitFor(time.Minute, 200*time.Millisecond, func() bool {
			tmpls, err := n.Client().Templates(ctx)
			pools, perr := n.Client().Pools(ctx)
			// The template's step snapshots go last.
			snaps, serr := n.Client().Snapshots(ctx, "")
			return err == nil && len(tmpls) == 0 && perr == nil && pools.Target["template:crd-tmpl"] == 0 && serr == nil && len(snaps) == 0
		}) {
			tmpls, err := n.Client().Templates(ctx)
			t.Errorf("node %d's templates after the SandboxTemplate went: %+v, %v", i+1, tmpls, err)
		}
	}
	if tmpls, err := c.client.Templates(ctx); err != nil || len(tmpls) != 0 {
		t.Errorf("templates through the gateway after the SandboxTemplate went: %+v, %v", tmpls, err)
	}
}

func rawJSON(t *testing.T, c *crdCluster, path string, v any) (int, string) {
	t.Helper()
	code, body := c.rawDo(t, "GET", path, "")
	if code == 200 {
		if err := json.Unmarshal([]byte(body), v); err != nil {
			t.Errorf("GET %s: %v", path, err)
		}
	}
	return code, body
}

// rawDo sends a request to the gateway with the client token.
func (c *crdCluster) rawDo(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+c.gwAddr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestClusterSandboxObject: a Sandbox object gets its sandbox through the
// gateway; when its node is killed, a new one on the other node once the
// node's Lease expires; the old one is removed when its node is back;
// deleting the object removes the sandbox. One naming a template that
// does not exist gets a Ready condition saying so.
func TestClusterSandboxObject(t *testing.T) {
	t.Parallel()
	c := startCRDCluster(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c.apply(t, `
apiVersion: paddock.dev/v1alpha1
kind: Sandbox
metadata: {name: keeper, namespace: paddock}
spec:
  env: {KEPT: "yes"}
---
apiVersion: paddock.dev/v1alpha1
kind: Sandbox
metadata: {name: orphan, namespace: paddock}
spec:
  sandboxTemplateRef: {name: no-such-template}
`)
	keeper := func(d kube.Declared) *kube.Sandbox {
		for _, s := range d.Sandboxes {
			if s.Name == "keeper" {
				return s
			}
		}
		return nil
	}
	d := c.waitObjects(t, "keeper's sandbox made", time.Minute, func(d kube.Declared) bool {
		s := keeper(d)
		return s != nil && s.Status.ID != "" && condition(s.Status.Conditions, kube.ConditionReady).Status == metav1.ConditionTrue
	})
	first := keeper(d).Status
	if g := keeper(d).Generation; g != 1 || first.ObservedGeneration != 1 {
		t.Errorf("keeper's generation %d, observed %d: the controller must not rewrite its spec", g, first.ObservedGeneration)
	}
	var out strings.Builder
	if _, err := c.client.Exec(ctx, first.ID, api.ExecRequest{Cmd: []string{"sh", "-c", "echo $KEPT"}}, client.ExecIO{Stdout: &out}); err != nil || out.String() != "yes\n" {
		t.Errorf("exec in keeper's sandbox: %q, %v", out.String(), err)
	}
	d = c.waitObjects(t, "orphan reported", time.Minute, func(d kube.Declared) bool {
		for _, s := range d.Sandboxes {
			if s.Name == "orphan" {
				return condition(s.Status.Conditions, kube.ConditionReady).Reason == kube.ReasonInvalid
			}
		}
		return false
	})
	for _, s := range d.Sandboxes {
		if r := condition(s.Status.Conditions, kube.ConditionReady); s.Name == "orphan" && !strings.Contains(r.Message, "no-such-template") {
			t.Errorf("orphan's Ready condition: %+v, want it to name the template", r)
		}
	}

	// Its node dies: a new sandbox elsewhere.
	var holder *Daemon
	for i, n := range c.nodes {
		if first.Node == fmt.Sprintf("crd-node%d", i+1) {
			holder = n
		}
	}
	if holder == nil {
		t.Fatalf("keeper's node %q is none of the cluster's", first.Node)
	}
	holder.Kill9()
	d = c.waitObjects(t, "keeper's sandbox made anew", kube.LeaseDuration+time.Minute, func(d kube.Declared) bool {
		s := keeper(d)
		return s != nil && s.Status.ID != "" && s.Status.ID != first.ID && s.Status.Node != first.Node
	})
	second := keeper(d).Status
	if !slicesContains(second.Replaced, first.ID) {
		t.Errorf("keeper's status after its node died: %+v, want %s among the replaced", second, first.ID)
	}
	holder.Start()
	c.waitObjects(t, "the replaced sandbox removed when its node came back", time.Minute, func(d kube.Declared) bool {
		s := keeper(d)
		return s != nil && len(s.Status.Replaced) == 0
	})
	if _, err := c.client.Get(ctx, first.ID); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("the replaced sandbox after its node came back: %v, want not found", err)
	}

	// Deleted while the node of its sandbox is lost: the deletion
	// completes, the status says the sandbox is left there, and the
	// sandbox is removed once its node is back.
	var holder2 *Daemon
	for i, n := range c.nodes {
		if second.Node == fmt.Sprintf("crd-node%d", i+1) {
			holder2 = n
		}
	}
	holder2.Kill9()
	if !waitFor(kube.LeaseDuration+30*time.Second, 200*time.Millisecond, func() bool {
		nodes, err := c.client.Nodes(ctx)
		for _, nd := range nodes {
			if nd.Name == second.Node {
				return err == nil && nd.State == api.NodeLost
			}
		}
		return false
	}) {
		t.Fatalf("the gateway does not see %s lost", second.Node)
	}
	c.delete(t, kube.SandboxResource, "paddock", "keeper")
	c.waitObjects(t, "keeper gone, its node lost", time.Minute, func(d kube.Declared) bool { return keeper(d) == nil })
	if !strings.Contains(c.gwLog.String(), "deleted with sandboxes left on lost nodes ("+second.ID+" on node "+second.Node) {
		t.Errorf("the gateway's log does not show the status naming %s on %s", second.ID, second.Node)
	}
	holder2.Start()
	if !waitFor(time.Minute, 200*time.Millisecond, func() bool {
		_, err := c.client.Get(ctx, second.ID)
		return errors.Is(err, client.ErrNotFound)
	}) {
		t.Errorf("keeper's sandbox stays after its node came back")
	}
	c.delete(t, kube.SandboxResource, "paddock", "orphan")
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
