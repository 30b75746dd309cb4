package cluster

import (
	"os/exec"
	"strings"
	"testing"
)

// TestGuestImportsNoKubernetes: the guest binary, which runs in every
// sandbox, carries none of the Kubernetes client.
func TestGuestImportsNoKubernetes(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/paddock-dev/paddock/cmd/paddock-guest").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 20 {
		t.Fatalf("go list named %d packages; want the guest's dependencies", len(deps))
	}
	for _, d := range deps {
		if strings.HasPrefix(d, "k8s.io/") || strings.HasPrefix(d, "sigs.k8s.io/") || d == "github.com/paddock-dev/paddock/internal/cluster" {
			t.Errorf("the guest depends on %s", d)
		}
	}
}
