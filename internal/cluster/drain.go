package cluster

import (
	"context"
	"encoding/json"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// SetDraining marks the node named name draining (no new sandboxes are
// placed on it; those it holds keep serving) or, with draining false,
// ready for creates again: it sets its PaddockNode's spec.draining,
// which every gateway's watch sees.
func SetDraining(ctx context.Context, rc *rest.Config, name string, draining bool) error {
	if err := CheckNodeName(name); err != nil {
		return fmt.Errorf("%w: %v", errdefs.ErrInvalid, err)
	}
	nodes, err := nodeClient(rc)
	if err != nil {
		return err
	}
	// A merge patch of the spec alone: the node writes its status through
	// the status subresource, so the two never race.
	body, err := json.Marshal(map[string]any{"spec": map[string]any{"draining": draining}})
	if err != nil {
		return err
	}
	err = nodes.Patch(types.MergePatchType).Resource(Resource).Name(name).Body(body).Do(ctx).Error()
	switch {
	case apierrors.IsNotFound(err):
		return errdefs.New(errdefs.ErrNotFound, "no node %s in the cluster (no PaddockNode of that name)", name)
	case apierrors.IsForbidden(err):
		// The gateway's rights, not the client's, are short.
		return errdefs.New(errdefs.ErrUnavailable, "the gateway may not patch PaddockNode %s (deploy/rbac.yaml grants paddock-gateway patch on paddocknodes): %v", name, err)
	case err != nil:
		return errdefs.New(errdefs.ErrUnavailable, "patching PaddockNode %s: %v", name, err)
	}
	return nil
}
