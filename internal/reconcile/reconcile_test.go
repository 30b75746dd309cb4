package reconcile

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/cluster"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// TestShare: the nodes' shares add up to the replicas, differ by at most
// one, and a node that is not eligible gets none.
func TestShare(t *testing.T) {
	for _, replicas := range []int{0, 1, 2, 3, 7, 100} {
		for n := 1; n <= 5; n++ {
			var nodes []string
			for i := range n {
				nodes = append(nodes, fmt.Sprintf("node%d", i))
			}
			for _, pool := range []string{"a", "py", "image-host"} {
				sum, lo, hi := 0, replicas, 0
				for _, node := range nodes {
					s := Share(replicas, nodes, pool, node)
					sum += s
					lo, hi = min(lo, s), max(hi, s)
				}
				if sum != replicas || hi-lo > 1 {
					t.Errorf("%d replicas of %s over %d nodes: sum %d, shares %d..%d", replicas, pool, n, sum, lo, hi)
				}
				if s := Share(replicas, nodes, pool, "other"); s != 0 {
					t.Errorf("a node not eligible gets %d", s)
				}
			}
		}
	}
}

func TestExpandPresets(t *testing.T) {
	corp := &cluster.PolicyPreset{ObjectMeta: metav1.ObjectMeta{Name: "corp"}, Spec: api.Policy{
		Allow:   []api.PolicyRule{{Match: "api.corp.example"}},
		Presets: []string{"npm"},
		Secrets: []api.SecretBinding{{Name: "KEY", Hosts: []string{"api.corp.example"}, Inject: api.SecretInjection{Header: "X-Key"}}},
	}}
	bad := &cluster.PolicyPreset{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Spec: api.Policy{Allow: []api.PolicyRule{{Match: "*."}}}}
	nested := &cluster.PolicyPreset{ObjectMeta: metav1.ObjectMeta{Name: "nested"}, Spec: api.Policy{Presets: []string{"corp"}}}
	presets := []*cluster.PolicyPreset{bad, corp, nested}

	in := &api.Policy{Allow: []api.PolicyRule{{Match: "example.com"}}, Presets: []string{"pypi", "corp", "npm"}}
	out, err := ExpandPresets(in, presets)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(out.Presets); got != "[pypi npm]" {
		t.Errorf("presets %s, want [pypi npm]", got)
	}
	if len(out.Allow) != 2 || out.Allow[1].Match != "api.corp.example" || len(out.Secrets) != 1 {
		t.Errorf("expanded: %+v", out)
	}
	if len(in.Allow) != 1 || len(in.Presets) != 3 {
		t.Errorf("the input changed: %+v", in)
	}
	for _, tc := range []struct{ name, want string }{
		{"nosuch", "corp"},
		{"bad", "allow[0]"},
		{"nested", "not a built-in preset"},
	} {
		_, err := ExpandPresets(&api.Policy{Presets: []string{tc.name}}, presets)
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.name) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("preset %s: %v, want invalid naming it and %q", tc.name, err, tc.want)
		}
	}
}
