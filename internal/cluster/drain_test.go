package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/cluster/kubetest"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// TestDrain: a gateway marks a node draining and ready again through its
// PaddockNode's spec; the watch says so, a lost node stays lost, and the
// gateway can change neither the node's tag nor its status.
func TestDrain(t *testing.T) {
	c := startCluster(t)
	w := watch(t, c)
	_, stop := runNode(t, c, "d1", fixedStatus(1))
	state := func(want string) func(map[string]api.Node) bool {
		return func(m map[string]api.Node) bool { return m["d1"].State == want }
	}
	w.wait(t, 20*time.Second, "d1 ready", state(api.NodeReady))
	ctx := context.Background()
	gw := c.Config(kubetest.Gateway)

	if err := SetDraining(ctx, gw, "d1", true); err != nil {
		t.Fatalf("drain: %v", err)
	}
	m := w.wait(t, 10*time.Second, "d1 draining", state(api.NodeDraining))
	if m["d1"].Allocated.Sandboxes != 1 || m["d1"].Address == "" {
		t.Errorf("the draining node lost its status: %+v", m["d1"])
	}
	// The node's next status write keeps the mark (it writes status
	// only, through its subresource).
	if err := SetDraining(ctx, gw, "d1", true); err != nil {
		t.Fatalf("drain again: %v", err)
	}
	if err := SetDraining(ctx, gw, "d1", false); err != nil {
		t.Fatalf("undrain: %v", err)
	}
	w.wait(t, 10*time.Second, "d1 ready again", state(api.NodeReady))

	// What a gateway may not do with its patch right.
	nodes, err := nodeClient(gw)
	if err != nil {
		t.Fatal(err)
	}
	err = nodes.Patch(types.MergePatchType).Resource(Resource).Name("d1").Body([]byte(`{"spec":{"tag":"zzz"}}`)).Do(ctx).Error()
	if !apierrors.IsInvalid(err) {
		t.Errorf("a gateway changing a node's tag: %v, want invalid", err)
	}
	err = nodes.Patch(types.MergePatchType).Resource(Resource).Name("d1").SubResource("status").Body([]byte(`{"status":{"address":"http://evil:1"}}`)).Do(ctx).Error()
	if !apierrors.IsForbidden(err) {
		t.Errorf("a gateway writing a node's status: %v, want forbidden", err)
	}
	for _, tc := range []struct {
		name string
		user string
		want error
	}{
		{"nosuch", kubetest.Gateway, errdefs.ErrNotFound},
		{"Bad_Name", kubetest.Gateway, errdefs.ErrInvalid},
		{"d1", kubetest.Nobody, errdefs.ErrUnavailable},
	} {
		if err := SetDraining(ctx, c.Config(tc.user), tc.name, true); !errors.Is(err, tc.want) {
			t.Errorf("drain %s as %s: %v, want %v", tc.name, tc.user, err, tc.want)
		}
	}

	// Draining and then gone: lost wins.
	if err := SetDraining(ctx, gw, "d1", true); err != nil {
		t.Fatal(err)
	}
	w.wait(t, 10*time.Second, "d1 draining", state(api.NodeDraining))
	stop()
	w.wait(t, 10*time.Second, "d1 lost", state(api.NodeLost))
}
