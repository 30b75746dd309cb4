package kubetest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"
)

// Apply creates every object of the YAML manifests at paths, as the
// administrator, in order, and waits until each CustomResourceDefinition
// among them serves.
func (c *Cluster) Apply(t testing.TB, paths ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := c.Config(Admin)
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range bytes.Split(data, []byte("\n---")) {
			var obj unstructured.Unstructured
			if err := yaml.Unmarshal(doc, &obj.Object); err != nil {
				t.Fatalf("%s, document %d: %v", path, i, err)
			}
			if len(obj.Object) == 0 {
				continue
			}
			gvk := obj.GroupVersionKind()
			m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				t.Fatalf("%s: %s %s: %v", path, gvk.Kind, obj.GetName(), err)
			}
			var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
			if m.Scope.Name() == meta.RESTScopeNameNamespace {
				ri = dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
			}
			if _, err := ri.Create(ctx, &obj, metav1.CreateOptions{}); err != nil {
				t.Fatalf("%s: creating %s %s: %v", path, gvk.Kind, obj.GetName(), err)
			}
			if gvk.Kind == "CustomResourceDefinition" {
				c.waitEstablished(t, ctx, dyn, obj.GetName())
				mapper.Reset()
			}
		}
	}
}

func (c *Cluster) waitEstablished(t testing.TB, ctx context.Context, dyn dynamic.Interface, name string) {
	t.Helper()
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	ok := waitFor(ctx, 30*time.Second, func() bool {
		o, err := crds.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		conds, _, _ := unstructured.NestedSlice(o.Object, "status", "conditions")
		for _, cd := range conds {
			m, _ := cd.(map[string]any)
			if m["type"] == "Established" && m["status"] == "True" {
				return true
			}
		}
		return false
	})
	if !ok {
		t.Fatalf("CustomResourceDefinition %s not established after 30 s", name)
	}
}

// Requests reads the API server's request counts (apiserver_request_total)
// by "VERB resource[/subresource]", e.g. "PATCH paddocknodes/status".
func (c *Cluster) Requests(t testing.TB) map[string]float64 {
	t.Helper()
	code, body, err := c.Get("/metrics", Admin)
	if err != nil || code != 200 {
		t.Fatalf("reading the API server's metrics: %d %v", code, err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parsing the API server's metrics: %v", err)
	}
	out := map[string]float64{}
	fam := fams["apiserver_request_total"]
	if fam == nil {
		return out
	}
	for _, m := range fam.GetMetric() {
		l := map[string]string{}
		for _, lp := range m.GetLabel() {
			l[lp.GetName()] = lp.GetValue()
		}
		key := l["verb"] + " " + l["resource"]
		if l["subresource"] != "" {
			key += "/" + l["subresource"]
		}
		out[key] += m.GetCounter().GetValue()
	}
	return out
}

// Writes sums the requests of n that change something (create, update,
// patch, delete), by "VERB resource".
func Writes(n map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range n {
		verb, _, _ := strings.Cut(k, " ")
		switch verb {
		case "POST", "PUT", "PATCH", "DELETE", "APPLY", "DELETECOLLECTION":
			out[k] = v
		}
	}
	return out
}

// Delta is b − a, key by key, leaving out keys that did not change.
func Delta(a, b map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range b {
		if d := v - a[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// String renders counts as "VERB resource=N" pairs, for a test's log.
func String(n map[string]float64) string {
	var parts []string
	for k, v := range n {
		parts = append(parts, fmt.Sprintf("%s=%v", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}
