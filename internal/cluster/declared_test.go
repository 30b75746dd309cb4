package cluster

import (
	"context"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/cluster/kubetest"
)

// TestCRDSchemasHaveObjectFields: each declarative CRD's schema names
// every field of its Go type, and no other (the API server prunes what a
// schema lacks, silently).
func TestCRDSchemasHaveObjectFields(t *testing.T) {
	for _, tc := range []struct {
		file   string
		walk   []string
		typ    reflect.Type
		except []string
	}{
		{"crd-sandboxtemplate.yaml", []string{"spec"}, reflect.TypeOf(SandboxTemplateSpec{}), nil},
		{"crd-sandboxtemplate.yaml", []string{"spec", "steps", "[]"}, reflect.TypeOf(api.TemplateStep{}), nil},
		{"crd-sandboxtemplate.yaml", []string{"spec", "steps", "[]", "copy"}, reflect.TypeOf(api.TemplateCopy{}), nil},
		{"crd-sandboxtemplate.yaml", []string{"spec", "policy"}, reflect.TypeOf(api.Policy{}), []string{"grants"}},
		{"crd-sandboxtemplate.yaml", []string{"spec", "policy", "secrets", "[]"}, reflect.TypeOf(api.SecretBinding{}), nil},
		{"crd-sandboxtemplate.yaml", []string{"spec", "policy", "secrets", "[]", "inject"}, reflect.TypeOf(api.SecretInjection{}), nil},
		{"crd-sandboxtemplate.yaml", []string{"spec", "resources"}, reflect.TypeOf(api.Resources{}), nil},
		{"crd-sandboxtemplate.yaml", []string{"status"}, reflect.TypeOf(SandboxTemplateStatus{}), nil},
		{"crd-sandboxtemplate.yaml", []string{"status", "nodes", "*"}, reflect.TypeOf(NodeBuild{}), nil},
		{"crd-sandboxwarmpool.yaml", []string{"spec"}, reflect.TypeOf(SandboxWarmPoolSpec{}), nil},
		{"crd-sandboxwarmpool.yaml", []string{"status"}, reflect.TypeOf(SandboxWarmPoolStatus{}), nil},
		{"crd-sandboxwarmpool.yaml", []string{"status", "nodes", "*"}, reflect.TypeOf(NodeShare{}), nil},
		{"crd-policypreset.yaml", []string{"spec"}, reflect.TypeOf(api.Policy{}), []string{"grants"}},
		{"crd-policypreset.yaml", []string{"spec", "deny", "[]"}, reflect.TypeOf(api.PolicyRule{}), nil},
		{"crd-sandbox.yaml", []string{"spec"}, reflect.TypeOf(SandboxSpec{}), nil},
		{"crd-sandbox.yaml", []string{"spec", "policy"}, reflect.TypeOf(api.Policy{}), []string{"grants"}},
		{"crd-sandbox.yaml", []string{"status"}, reflect.TypeOf(SandboxStatus{}), nil},
		{"crd-sandbox.yaml", []string{"status", "conditions", "[]"}, reflect.TypeOf(metav1.Condition{}), nil},
	} {
		t.Run(tc.file+":"+strings.Join(tc.walk, "."), func(t *testing.T) {
			s := crdSchema(t, "../../deploy/"+tc.file)
			for _, step := range tc.walk {
				switch step {
				case "[]":
					s = *s.Items
				case "*":
					s = *s.AdditionalProperties
				default:
					s = s.Properties[step]
				}
			}
			compare(t, strings.Join(tc.walk, "."), s, tc.typ, tc.except...)
		})
	}
}

// TestDeclaredObjects, against a real API server with deploy/ applied:
// the schemas refuse malformed objects with a message naming the field;
// a node may read the objects and write their status, but not change
// them, and may read the Secrets of SecretsNamespace only; a Watcher
// sees the objects; status writes from many writers all land.
func TestDeclaredObjects(t *testing.T) {
	kc := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin, err := objectClient(kc.Config(kubetest.Admin))
	if err != nil {
		t.Fatal(err)
	}
	create := func(c *rest.RESTClient, resource, ns string, obj any) error {
		return in(c.Post(), ns).Resource(resource).Body(obj).Do(ctx).Error()
	}
	tmpl := func(name string, spec SandboxTemplateSpec) *SandboxTemplate {
		return &SandboxTemplate{TypeMeta: metav1.TypeMeta{APIVersion: GroupVersion.String(), Kind: "SandboxTemplate"},
			ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
	}
	pool := func(name string, spec SandboxWarmPoolSpec) *SandboxWarmPool {
		return &SandboxWarmPool{TypeMeta: metav1.TypeMeta{APIVersion: GroupVersion.String(), Kind: "SandboxWarmPool"},
			ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
	}
	content := "hello\n"
	good := tmpl("py", SandboxTemplateSpec{Image: "host", Steps: []api.TemplateStep{
		{Run: "echo hi"}, {Copy: &api.TemplateCopy{Content: &content, Dest: "/srv/a.txt"}}, {Env: map[string]string{"A": "b"}},
	}, Policy: &api.Policy{Presets: []string{"pypi"}, Allow: []api.PolicyRule{{Match: "example.com", Methods: []string{"GET"}}}}})
	if err := create(admin, TemplateResource, "", good); err != nil {
		t.Fatalf("creating a good template: %v", err)
	}
	if err := create(admin, PoolResource, "", pool("py", SandboxWarmPoolSpec{Replicas: 3, TemplateRef: &ObjectRef{Name: "py"}})); err != nil {
		t.Fatalf("creating a good pool: %v", err)
	}

	// Malformed objects: the API server names the field.
	for _, tc := range []struct {
		name     string
		resource string
		obj      any
		want     string
	}{
		{"step with two actions", TemplateResource, tmpl("two", SandboxTemplateSpec{Steps: []api.TemplateStep{{Run: "a", Workdir: "/x"}}}), "spec.steps[0]"},
		{"long name", TemplateResource, tmpl(strings.Repeat("a", 65), SandboxTemplateSpec{Steps: []api.TemplateStep{{Run: "a"}}}), "at most 64"},
		{"bad secret name", TemplateResource, tmpl("sec", SandboxTemplateSpec{Steps: []api.TemplateStep{{Run: "a"}},
			Policy: &api.Policy{Secrets: []api.SecretBinding{{Name: "1bad", Hosts: []string{"x"}}}}}), "spec.policy.secrets[0].name"},
		{"pool naming both", PoolResource, pool("both", SandboxWarmPoolSpec{Replicas: 1, Image: "host", TemplateRef: &ObjectRef{Name: "py"}}), "exactly one"},
		{"pool naming neither", PoolResource, pool("neither", SandboxWarmPoolSpec{Replicas: 1}), "exactly one"},
		{"negative replicas", PoolResource, pool("neg", SandboxWarmPoolSpec{Replicas: -1, Image: "host"}), "spec.replicas"},
	} {
		err := create(admin, tc.resource, "", tc.obj)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want invalid naming %q", tc.name, err, tc.want)
		}
	}

	// A node reads and writes status, never the spec.
	nodeCfg := kc.Config(kubetest.Node)
	node, err := objectClient(nodeCfg)
	if err != nil {
		t.Fatal(err)
	}
	var got SandboxTemplate
	if err := node.Get().Resource(TemplateResource).Name("py").Do(ctx).Into(&got); err != nil {
		t.Fatalf("node reading a template: %v", err)
	}
	if !reflect.DeepEqual(got.Spec, good.Spec) {
		t.Errorf("template round trip:\n got %+v\nwant %+v", got.Spec, good.Spec)
	}
	got.Spec.Image = "other"
	got.APIVersion, got.Kind = GroupVersion.String(), "SandboxTemplate"
	if err := node.Put().Resource(TemplateResource).Name("py").Body(&got).Do(ctx).Error(); !apierrors.IsForbidden(err) {
		t.Errorf("node changing a template's spec: %v, want forbidden", err)
	}
	if err := create(node, TemplateResource, "", tmpl("mine", good.Spec)); !apierrors.IsForbidden(err) {
		t.Errorf("node creating a template: %v, want forbidden", err)
	}

	w, err := Watch(ctx, kc.Config(kubetest.Node), WatchTemplates|WatchPools|WatchPresets|WatchSecrets)
	if err != nil {
		t.Fatal(err)
	}
	if !waitUntil(30*time.Second, func() bool {
		d := w.Now()
		return w.Synced() && len(d.Templates) == 1 && d.Templates[0].Name == "py" && len(d.Pools) == 1 && d.Pools[0].Spec.Replicas == 3
	}) {
		d := w.Now()
		t.Fatalf("watched (synced %v): %d templates, %d pools", w.Synced(), len(d.Templates), len(d.Pools))
	}

	// Status from several nodes at once: every entry lands.
	objs, err := NewObjects(nodeCfg)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 5)
	for i := range 5 {
		go func() {
			name := "node-" + string(rune('a'+i))
			errs <- objs.UpdateTemplateStatus(ctx, "py", func(o *SandboxTemplate) bool {
				if o.Status.Nodes == nil {
					o.Status.Nodes = map[string]NodeBuild{}
				}
				o.Status.Nodes[name] = NodeBuild{State: BuildReady, Generation: o.Generation}
				SetCondition(&o.Status.Conditions, ConditionValid, true, "Checked", "", o.Generation)
				return true
			})
		}()
	}
	for range 5 {
		if err := <-errs; err != nil {
			t.Errorf("writing a template's status: %v", err)
		}
	}
	if !waitUntil(10*time.Second, func() bool {
		d := w.Now()
		return len(d.Templates) == 1 && len(d.Templates[0].Status.Nodes) == 5
	}) {
		t.Errorf("status after 5 writers: %+v", w.Now().Templates[0].Status)
	}

	// Secrets: the node reads paddock-secrets, not paddock.
	core, err := coreClient(kc.Config(kubetest.Admin))
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{SecretsNamespace, DefaultNamespace} {
		sec := &corev1.Secret{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
			ObjectMeta: metav1.ObjectMeta{Name: "api-keys", Namespace: ns}, Data: map[string][]byte{"OPENAI": []byte("sk-1")}}
		if err := core.Post().Namespace(ns).Resource("secrets").Body(sec).Do(ctx).Error(); err != nil {
			t.Fatal(err)
		}
	}
	if !waitUntil(10*time.Second, func() bool { return len(w.Now().Secrets) == 1 }) {
		t.Fatalf("the node's watcher sees %d secrets", len(w.Now().Secrets))
	}
	if s := w.Now().Secrets[0]; s.Namespace != SecretsNamespace || string(s.Data["OPENAI"]) != "sk-1" {
		t.Errorf("watched secret: %s/%s", s.Namespace, s.Name)
	}
	nodeCore, err := coreClient(nodeCfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := nodeCore.Get().Namespace(DefaultNamespace).Resource("secrets").Name("api-keys").Do(ctx).Error(); !apierrors.IsForbidden(err) {
		t.Errorf("node reading a Secret of %s: %v, want forbidden", DefaultNamespace, err)
	}
	gwCore, err := coreClient(kc.Config(kubetest.Gateway))
	if err != nil {
		t.Fatal(err)
	}
	if err := gwCore.Get().Namespace(SecretsNamespace).Resource("secrets").Name("api-keys").Do(ctx).Error(); !apierrors.IsForbidden(err) {
		t.Errorf("gateway reading a Secret of %s: %v, want forbidden", SecretsNamespace, err)
	}
}

func waitUntil(limit time.Duration, cond func() bool) bool {
	end := time.Now().Add(limit)
	for time.Now().Before(end) {
		if cond() {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return cond()
}

// TestLead: of two gateways contending for the controller's Lease with
// the gateway's RBAC, one leads at a time; when it stops, the other
// takes over at once (the Lease is released).
func TestLead(t *testing.T) {
	kc := startCluster(t)
	cfg := kc.Config(kubetest.Gateway)
	var mu sync.Mutex
	leading := map[string]bool{}
	maxAtOnce := 0
	run := func(ctx context.Context, id string) chan struct{} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			err := Lead(ctx, cfg, DefaultNamespace, ControllerLease, id, slog.New(slog.DiscardHandler), func(lctx context.Context) {
				mu.Lock()
				leading[id] = true
				n := 0
				for _, l := range leading {
					if l {
						n++
					}
				}
				maxAtOnce = max(maxAtOnce, n)
				mu.Unlock()
				<-lctx.Done()
				mu.Lock()
				leading[id] = false
				mu.Unlock()
			})
			if err != nil {
				t.Errorf("Lead %s: %v", id, err)
			}
		}()
		return done
	}
	leader := func() string {
		mu.Lock()
		defer mu.Unlock()
		for id, l := range leading {
			if l {
				return id
			}
		}
		return ""
	}
	ctxA, stopA := context.WithCancel(context.Background())
	ctxB, stopB := context.WithCancel(context.Background())
	defer stopB()
	doneA := run(ctxA, "gw-a")
	doneB := run(ctxB, "gw-b")
	if !waitUntil(20*time.Second, func() bool { return leader() != "" }) {
		t.Fatal("nobody leads")
	}
	time.Sleep(3 * electRenew)
	first := leader()
	stop, done := stopA, doneA
	if first == "gw-b" {
		stop, done = stopB, doneB
	}
	stop()
	<-done
	start := time.Now()
	if !waitUntil(electDuration, func() bool { l := leader(); return l != "" && l != first }) {
		t.Fatalf("after %s stopped, nobody took over", first)
	}
	t.Logf("took over %v after the leader stopped", time.Since(start).Round(100*time.Millisecond))
	mu.Lock()
	if maxAtOnce != 1 {
		t.Errorf("%d led at once", maxAtOnce)
	}
	mu.Unlock()
	stopA()
	stopB()
}
