// Package cluster is paddock's one seam to the Kubernetes API, the engine
// of a paddock cluster: a node's registration (a coordination Lease for
// liveness and a PaddockNode for what it offers) and the watch through
// which gateways and the CLI see the nodes. Nothing here is on a
// sandbox's create path: a node writes its Lease every few seconds and its
// PaddockNode's status at most once per StatusInterval, whatever the
// number of creates.
package cluster

import (
	"fmt"
	"os"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/paddock-dev/paddock/api"
)

// The PaddockNode custom resource (deploy/crd-paddocknode.yaml).
const (
	Group    = "paddock.dev"
	Version  = "v1alpha1"
	Resource = "paddocknodes"
)

// DefaultNamespace holds the nodes' Leases.
const DefaultNamespace = "paddock"

// Timing of a node's writes. A node whose Lease is not renewed for
// LeaseDuration is lost: gateways stop placing on it.
const (
	LeaseDuration  = 15 * time.Second
	RenewInterval  = 5 * time.Second
	StatusInterval = 5 * time.Second
)

// GroupVersion is the PaddockNode's API group and version.
var GroupVersion = schema.GroupVersion{Group: Group, Version: Version}

// PaddockNode is one node's record in the cluster: its routing tag, fixed
// when it first registers (so that the ids it minted keep routing to it
// across restarts), and, as status, what it publishes of itself.
type PaddockNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              PaddockNodeSpec `json:"spec"`
	Status            api.Node        `json:"status"`
}

// PaddockNodeSpec is what does not change while the node lives.
type PaddockNodeSpec struct {
	// Tag starts every sandbox id the node mints (TagLen characters of
	// [a-z0-9]); unique in the cluster.
	Tag string `json:"tag"`
	// Draining, set by an operator (SetDraining, `paddock nodes drain`,
	// kubectl), keeps creates off the node while its sandboxes serve.
	Draining bool `json:"draining,omitempty"`
}

// PaddockNodeList is a list of PaddockNodes.
type PaddockNodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PaddockNode `json:"items"`
}

// DeepCopyObject implements runtime.Object (the informer's cache hands
// out copies).
func (p *PaddockNode) DeepCopyObject() runtime.Object {
	if p == nil {
		return nil
	}
	c := *p
	p.ObjectMeta.DeepCopyInto(&c.ObjectMeta)
	c.Status = copyNode(p.Status)
	return &c
}

// DeepCopyObject implements runtime.Object.
func (l *PaddockNodeList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	c := *l
	l.ListMeta.DeepCopyInto(&c.ListMeta)
	c.Items = make([]PaddockNode, len(l.Items))
	for i := range l.Items {
		c.Items[i] = *l.Items[i].DeepCopyObject().(*PaddockNode)
	}
	return &c
}

func copyNode(n api.Node) api.Node {
	n.Labels = copyMap(n.Labels)
	n.Pools = copyMap(n.Pools)
	return n
}

func copyMap[V any](m map[string]V) map[string]V {
	if m == nil {
		return nil
	}
	c := make(map[string]V, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// RESTConfig loads the configuration of the API server to talk to: the
// kubeconfig file at path, or, when path is empty, $KUBECONFIG or the
// pod's in-cluster service account.
func RESTConfig(path string) (*rest.Config, error) {
	if path == "" {
		path = os.Getenv("KUBECONFIG")
	}
	if path == "" {
		c, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("loading in-cluster config (outside a pod, give --kubeconfig): %w", err)
		}
		return c, nil
	}
	c, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", path, err)
	}
	return c, nil
}

// nodeClient is a REST client for PaddockNodes.
func nodeClient(cfg *rest.Config) (*rest.RESTClient, error) {
	return restClient(cfg, GroupVersion, &PaddockNode{}, &PaddockNodeList{})
}

// leaseClient is a REST client for coordination.k8s.io/v1 Leases. It is
// made like nodeClient, rather than with client-go's typed clientset,
// whose scheme registers every Kubernetes API type (1.8 MB of allocations
// at the start of every paddock command, the CLI's included).
func leaseClient(cfg *rest.Config) (*rest.RESTClient, error) {
	return restClient(cfg, coordv1.SchemeGroupVersion, &coordv1.Lease{}, &coordv1.LeaseList{})
}

func restClient(cfg *rest.Config, gv schema.GroupVersion, types ...runtime.Object) (*rest.RESTClient, error) {
	scheme := runtime.NewScheme()
	scheme.AddKnownTypes(gv, types...)
	metav1.AddToGroupVersion(scheme, gv)
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &gv
	c.APIPath = "/apis"
	if gv.Group == "" {
		c.APIPath = "/api" // the core group
	}
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = "paddock"
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("making the %s client: %w", gv, err)
	}
	return rc, nil
}
