package cluster

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/cluster/kubetest"
)

// startCluster starts a control plane with everything of deploy/
// applied, as kubectl apply -k would.
func startCluster(t *testing.T) *kubetest.Cluster {
	t.Helper()
	c := kubetest.Start(t)
	c.Apply(t, deployFiles(t)...)
	return c
}

// deployFiles are the manifests deploy/kustomization.yaml lists, which
// must be every manifest in deploy/.
func deployFiles(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("../../deploy/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatal(err)
	}
	all, _ := filepath.Glob("../../deploy/*.yaml")
	var paths []string
	for _, r := range k.Resources {
		paths = append(paths, filepath.Join("../../deploy", r))
	}
	if len(paths) != len(all)-1 {
		t.Fatalf("kustomization.yaml lists %v; deploy/ has %v", k.Resources, all)
	}
	return paths
}

// watcher runs WatchNodes as the gateway and keeps the latest nodes.
type watcher struct {
	mu    sync.Mutex
	nodes []api.Node
	log   *syncBuffer
}

func watch(t *testing.T, c *kubetest.Cluster) *watcher {
	t.Helper()
	w := &watcher{log: &syncBuffer{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- WatchNodes(ctx, c.Config(kubetest.Gateway), WatchConfig{Logger: slog.New(slog.NewTextHandler(w.log, nil))}, func(n []api.Node) {
			w.mu.Lock()
			w.nodes = n
			w.mu.Unlock()
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("WatchNodes: %v", err)
		}
	})
	return w
}

// wait waits until cond holds of the nodes the watcher sees.
func (w *watcher) wait(t *testing.T, limit time.Duration, what string, cond func(map[string]api.Node) bool) map[string]api.Node {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		w.mu.Lock()
		m := map[string]api.Node{}
		for _, n := range w.nodes {
			m[n.Name] = n
		}
		w.mu.Unlock()
		if cond(m) {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v, %s: nodes %+v\nwatcher log:\n%s", limit, what, m, w.log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// runNode registers a node as the node user and runs it until the
// returned stop is called (which releases its Lease).
func runNode(t *testing.T, c *kubetest.Cluster, name string, st func() api.Node) (*Node, func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := Register(ctx, c.Config(kubetest.Node), NodeConfig{
		Name: name, Address: "https://" + name + ":7443", E2BAddress: "http://" + name + ":3000", Version: "test",
		Labels: map[string]string{"zone": "a"},
	})
	if err != nil {
		t.Fatalf("registering %s: %v", name, err)
	}
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.Run(rctx, st); close(done) }()
	var once sync.Once
	stopFn := func() { once.Do(func() { stop(); <-done }) }
	t.Cleanup(stopFn)
	return n, stopFn
}

func fixedStatus(sandboxes int) func() api.Node {
	return func() api.Node {
		return api.Node{
			Capacity:  api.NodeResources{CPUs: 2, MemoryBytes: 8 << 30, Sandboxes: 100},
			Allocated: api.NodeResources{CPUs: 1, MemoryBytes: 1 << 30, Sandboxes: sandboxes},
			Pools:     map[string]int{"image:host": 2},
		}
	}
}

func TestNodesRegisterAndWatch(t *testing.T) {
	c := startCluster(t)
	w := watch(t, c)

	a, stopA := runNode(t, c, "node-a", fixedStatus(3))
	b, _ := runNode(t, c, "node-b", fixedStatus(0))
	if !ValidTag(a.Tag()) || !ValidTag(b.Tag()) || a.Tag() == b.Tag() {
		t.Fatalf("tags %q and %q: want two distinct well-formed tags", a.Tag(), b.Tag())
	}
	m := w.wait(t, 20*time.Second, "both nodes ready", func(m map[string]api.Node) bool {
		return m["node-a"].State == api.NodeReady && m["node-b"].State == api.NodeReady
	})
	got := m["node-a"]
	if got.Tag != a.Tag() || got.Address != "https://node-a:7443" || got.E2BAddress != "http://node-a:3000" || got.Version != "test" ||
		got.Labels["zone"] != "a" || got.Allocated.Sandboxes != 3 || got.Capacity.Sandboxes != 100 ||
		got.Pools["image:host"] != 2 || time.Since(got.Heartbeat) > time.Minute {
		t.Errorf("node-a as watched: %+v", got)
	}

	// A graceful stop releases the Lease: lost at once, not after 15 s.
	stopA()
	w.wait(t, 5*time.Second, "node-a lost after its stop", func(m map[string]api.Node) bool {
		return m["node-a"].State == api.NodeLost && m["node-b"].State == api.NodeReady
	})
	// Back again: the same tag (its PaddockNode keeps it), ready again.
	a2, _ := runNode(t, c, "node-a", fixedStatus(3))
	if a2.Tag() != a.Tag() {
		t.Errorf("node-a came back with tag %q, had %q", a2.Tag(), a.Tag())
	}
	w.wait(t, 20*time.Second, "node-a ready again", func(m map[string]api.Node) bool {
		return m["node-a"].State == api.NodeReady
	})

	nodes, err := ListNodes(context.Background(), c.Config(kubetest.Gateway), WatchConfig{})
	if err != nil || len(nodes) != 2 || nodes[0].Name != "node-a" || nodes[1].Name != "node-b" {
		t.Errorf("ListNodes = %+v, %v", nodes, err)
	}
}

// TestResume: a node that could not reach the API server as it started
// (Resume, with the tag it kept) claims that tag once Run reaches it,
// recreating its PaddockNode if it went; a node whose kept tag is now
// another's stays out of the cluster.
func TestResume(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	w := watch(t, c)
	a, stopA := runNode(t, c, "node-a", fixedStatus(1))
	tagA := a.Tag()
	stopA()
	admin, err := nodeClient(c.Config(kubetest.Admin))
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Delete().Resource(Resource).Name("node-a").Do(ctx).Error(); err != nil {
		t.Fatal(err)
	}
	resume := func(name, tag string) (*Node, chan struct{}) {
		n, err := Resume(c.Config(kubetest.Node), NodeConfig{Name: name, Address: "https://" + name + ":1"}, tag)
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { n.Run(rctx, fixedStatus(0)); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		return n, done
	}
	resume("node-a", tagA)
	m := w.wait(t, 20*time.Second, "node-a back with its kept tag", func(m map[string]api.Node) bool {
		return m["node-a"].State == api.NodeReady
	})
	if m["node-a"].Tag != tagA {
		t.Errorf("node-a resumed with tag %q, kept %q", m["node-a"].Tag, tagA)
	}
	// node-b kept node-a's tag (say, a copied state dir): it stays out.
	_, done := resume("node-b", tagA)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("a node whose kept tag is another's did not give up")
	}
	if m := w.wait(t, 0, "", func(map[string]api.Node) bool { return true }); len(m) != 1 {
		t.Errorf("nodes: %+v, want node-a alone", m)
	}
	if _, err := Resume(c.Config(kubetest.Node), NodeConfig{Name: "n", Address: "https://n:1"}, "BAD"); err == nil {
		t.Error("Resume took a malformed tag")
	}
}

func TestNodeRBAC(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	// A gateway reads, never writes.
	gw, err := nodeClient(c.Config(kubetest.Gateway))
	if err != nil {
		t.Fatal(err)
	}
	pn := &PaddockNode{Spec: PaddockNodeSpec{Tag: "abc"}}
	pn.Name, pn.APIVersion, pn.Kind = "sneaky", GroupVersion.String(), "PaddockNode"
	if err := gw.Post().Resource(Resource).Body(pn).Do(ctx).Error(); !apierrors.IsForbidden(err) {
		t.Errorf("a gateway creating a PaddockNode: %v, want forbidden", err)
	}
	if _, err := ListNodes(ctx, c.Config(kubetest.Gateway), WatchConfig{}); err != nil {
		t.Errorf("a gateway listing nodes: %v", err)
	}
	// The workloads deploy/ declares passed the API server's validation.
	for _, path := range []string{
		"/apis/apps/v1/namespaces/paddock/daemonsets/paddock-node",
		"/apis/apps/v1/namespaces/paddock/deployments/paddock-gateway",
		"/api/v1/namespaces/paddock/services/paddock-gateway",
	} {
		if code, body, err := c.Get(path, kubetest.Admin); err != nil || code != 200 {
			t.Errorf("GET %s: %d %v %.200s", path, code, err, body)
		}
	}
	// Anyone else: nothing.
	if _, err := ListNodes(ctx, c.Config(kubetest.Nobody), WatchConfig{}); !apierrors.IsForbidden(err) {
		t.Errorf("an unknown user listing nodes: %v, want forbidden", err)
	}
	if _, err := Register(ctx, c.Config(kubetest.Nobody), NodeConfig{Name: "n", Address: "https://n:1"}); !apierrors.IsForbidden(err) {
		t.Errorf("an unknown user registering a node: %v, want forbidden", err)
	}
}

// TestMalformedNodes: records a hostile user with write access to
// PaddockNodes writes are refused by the schema, or left out by the
// watcher with a log line; the watcher keeps serving the good ones.
func TestMalformedNodes(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	admin, err := nodeClient(c.Config(kubetest.Admin))
	if err != nil {
		t.Fatal(err)
	}
	w := watch(t, c)
	good, _ := runNode(t, c, "good", fixedStatus(1))
	w.wait(t, 20*time.Second, "the good node ready", func(m map[string]api.Node) bool { return m["good"].State == api.NodeReady })

	create := func(body string) error {
		return admin.Post().Resource(Resource).SetHeader("Content-Type", "application/json").Body([]byte(body)).Do(ctx).Error()
	}
	status := func(name, body string) error {
		return admin.Patch(types.MergePatchType).Resource(Resource).Name(name).SubResource("status").Body([]byte(body)).Do(ctx).Error()
	}
	for _, tc := range []struct{ name, body string }{
		{"uppercase tag", `{"apiVersion":"paddock.dev/v1alpha1","kind":"PaddockNode","metadata":{"name":"bad1"},"spec":{"tag":"ABC"}}`},
		{"long tag", `{"apiVersion":"paddock.dev/v1alpha1","kind":"PaddockNode","metadata":{"name":"bad2"},"spec":{"tag":"abcdefgh"}}`},
		{"no spec", `{"apiVersion":"paddock.dev/v1alpha1","kind":"PaddockNode","metadata":{"name":"bad3"}}`},
		{"tag a number", `{"apiVersion":"paddock.dev/v1alpha1","kind":"PaddockNode","metadata":{"name":"bad4"},"spec":{"tag":123}}`},
	} {
		if err := create(tc.body); !apierrors.IsInvalid(err) && !apierrors.IsBadRequest(err) {
			t.Errorf("%s: %v, want refused", tc.name, err)
		}
	}
	// Well-formed objects with hostile status.
	if err := create(`{"apiVersion":"paddock.dev/v1alpha1","kind":"PaddockNode","metadata":{"name":"liar"},"spec":{"tag":"zzz"}}`); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, body string }{
		{"cpus a string", `{"status":{"address":"https://x:1","capacity":{"cpus":"lots"}}}`},
		{"negative memory", `{"status":{"address":"https://x:1","capacity":{"memory_bytes":-1}}}`},
		{"address not a URL", `{"status":{"address":"javascript:alert(1)"}}`},
		{"unknown state", `{"status":{"address":"https://x:1","state":"on fire"}}`},
		{"pool a string", `{"status":{"address":"https://x:1","pools":{"image:host":"many"}}}`},
	} {
		if err := status("liar", tc.body); !apierrors.IsInvalid(err) && !apierrors.IsBadRequest(err) {
			t.Errorf("status %s: %v, want refused", tc.name, err)
		}
	}
	// A node's tag never changes: ids it minted carry it.
	err = admin.Patch(types.MergePatchType).Resource(Resource).Name("good").Body([]byte(`{"spec":{"tag":"yyy"}}`)).Do(ctx).Error()
	if !apierrors.IsInvalid(err) {
		t.Errorf("changing a node's tag: %v, want refused", err)
	}
	// Passes the schema, but steals the good node's tag: left out, and the
	// good node stays.
	if err := create(`{"apiVersion":"paddock.dev/v1alpha1","kind":"PaddockNode","metadata":{"name":"thief"},"spec":{"tag":"` + good.Tag() + `"}}`); err != nil {
		t.Fatal(err)
	}
	if err := status("thief", `{"status":{"address":"https://thief:1","state":"ready"}}`); err != nil {
		t.Fatal(err)
	}
	// Status whose tag disagrees with its spec.
	if err := status("liar", `{"status":{"address":"https://liar:1","tag":"aaa"}}`); err != nil {
		t.Fatal(err)
	}
	w.wait(t, 10*time.Second, "the thief and the liar left out with log lines", func(m map[string]api.Node) bool {
		l := w.log.String()
		return strings.Contains(l, "node=thief") && strings.Contains(l, "node=liar") && m["good"].State == api.NodeReady
	})
	if m := w.wait(t, 0, "", func(map[string]api.Node) bool { return true }); len(m) != 1 {
		t.Errorf("nodes watched: %+v, want the good one alone", m)
	}
	// A thief registering through Register is refused too.
	if _, err := Register(ctx, c.Config(kubetest.Node), NodeConfig{Name: "thief", Address: "https://thief:1"}); err == nil || !strings.Contains(err.Error(), "registered first") {
		t.Errorf("registering the thief: %v, want its tag refused", err)
	}
}

// TestLeaseExpiry: a Lease that stops being renewed (the node was killed)
// makes the node lost after its duration, judged by the watcher's clock.
func TestLeaseExpiry(t *testing.T) {
	v := newView(slog.New(slog.DiscardHandler))
	now := time.Now()
	pn := &PaddockNode{Spec: PaddockNodeSpec{Tag: "abc"}, Status: api.Node{Address: "https://n:1"}}
	pn.Name = "n"
	lease := func(rv string, renewed time.Time) *coordv1.Lease { return newLease("n", rv, renewed) }
	at := func(l *coordv1.Lease, t time.Time) string {
		ns := v.nodes([]*PaddockNode{pn}, leasesOf(l), t)
		if len(ns) != 1 {
			return "absent"
		}
		return ns[0].State
	}
	l := lease("1", now)
	if s := at(l, now); s != api.NodeReady {
		t.Fatalf("fresh lease: %s", s)
	}
	if s := at(l, now.Add(LeaseDuration-time.Second)); s != api.NodeReady {
		t.Errorf("just before expiry: %s", s)
	}
	if s := at(l, now.Add(LeaseDuration+time.Second)); s != api.NodeLost {
		t.Errorf("after expiry: %s", s)
	}
	// Renewed (a new resource version), by a node whose clock is an hour
	// behind: alive, by the time the watcher saw the renewal.
	l2 := lease("2", now.Add(-time.Hour))
	if s := at(l2, now.Add(LeaseDuration+2*time.Second)); s != api.NodeReady {
		t.Errorf("renewed by a node with a slow clock: %s", s)
	}
	// A Lease first seen long after its last renewal is not alive.
	v2 := newView(slog.New(slog.DiscardHandler))
	if ns := v2.nodes([]*PaddockNode{pn}, leasesOf(lease("9", now.Add(-time.Hour))), now); ns[0].State != api.NodeLost {
		t.Errorf("stale lease first seen: %s", ns[0].State)
	}
	// No Lease, or a released one: lost.
	if ns := v2.nodes([]*PaddockNode{pn}, nil, now); ns[0].State != api.NodeLost {
		t.Errorf("no lease: %s", ns[0].State)
	}
	rel := lease("10", now)
	rel.Spec.HolderIdentity = nil
	if ns := v2.nodes([]*PaddockNode{pn}, leasesOf(rel), now); ns[0].State != api.NodeLost {
		t.Errorf("released lease: %s", ns[0].State)
	}
}

func TestTags(t *testing.T) {
	seen := map[string]bool{}
	for i := range 50 {
		tag := tagFor("node", i)
		if !ValidTag(tag) {
			t.Fatalf("tagFor(node, %d) = %q", i, tag)
		}
		seen[tag] = true
	}
	if len(seen) < 45 {
		t.Errorf("50 attempts gave %d distinct tags", len(seen))
	}
	// Fixed values: a change of the hash would give every node a new tag
	// on its next registration from scratch.
	if a, b := tagFor("node", 0), tagFor("node2", 0); a == b {
		t.Errorf("node and node2 both propose %q first", a)
	}
	const stableTag = "5br"
	if got := tagFor("node", 0); got != stableTag {
		t.Errorf("tagFor(node, 0) = %q, was %q", got, stableTag)
	}
	for _, name := range []string{"", "Node", "-a", "a-", "a_b", strings.Repeat("a", 254)} {
		if CheckNodeName(name) == nil {
			t.Errorf("CheckNodeName(%q) = nil", name)
		}
	}
	for _, addr := range []string{"", "node:1", "ftp://n:1", "https://", "https://u:p@n:1", "https://n:1/x"} {
		if checkAddress(addr) == nil {
			t.Errorf("checkAddress(%q) = nil", addr)
		}
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newLease(name, rv string, renewed time.Time) *coordv1.Lease {
	t := metav1.NewMicroTime(renewed)
	return &coordv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: rv},
		Spec: coordv1.LeaseSpec{
			HolderIdentity:       ptr.To(name),
			LeaseDurationSeconds: ptr.To(int32(LeaseDuration / time.Second)),
			RenewTime:            &t,
		},
	}
}

func leasesOf(l ...*coordv1.Lease) []*coordv1.Lease { return l }
