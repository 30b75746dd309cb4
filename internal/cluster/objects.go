package cluster

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/paddock-dev/paddock/api"
)

// The declarative objects (deploy/crd-*.yaml), named after
// kubernetes-sigs/agent-sandbox's where their shape fits ours. Templates,
// warm pools and presets are cluster-wide, as a node's templates and
// pools are; a Sandbox lives in a namespace.
const (
	TemplateResource = "sandboxtemplates"
	PoolResource     = "sandboxwarmpools"
	PresetResource   = "policypresets"
	SandboxResource  = "sandboxes"
)

// SecretsNamespace holds the Kubernetes Secrets that nodes read: every
// key of every Secret there is a secret of that name on every node, for
// the egress proxy to inject. Nodes may read no other Secret.
const SecretsNamespace = "paddock-secrets"

// SandboxFinalizer holds a Sandbox object until its sandbox is removed.
const SandboxFinalizer = "paddock.dev/sandbox"

// Condition types and reasons the objects' status carries.
const (
	// ConditionValid is False, with the reason Invalid and a message
	// naming the field, when an object passed the schema but not paddock's
	// own checks.
	ConditionValid = "Valid"
	// ConditionReady is True when the object is in force: a template
	// built on every node that needs it, a pool full, a sandbox running.
	ConditionReady = "Ready"

	ReasonInvalid = "Invalid"
)

// SandboxTemplate is a template (a paddock.yaml: an image and steps) that
// every node whose labels match NodeSelector builds; its name is the
// template's.
type SandboxTemplate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              SandboxTemplateSpec   `json:"spec"`
	Status            SandboxTemplateStatus `json:"status,omitempty"`
}

// SandboxTemplateSpec is api.TemplateSpec less the name (the object's)
// and Warm (a SandboxWarmPool sizes a template's pool over the cluster).
type SandboxTemplateSpec struct {
	Image     string             `json:"image,omitempty"`
	Steps     []api.TemplateStep `json:"steps"`
	Policy    *api.Policy        `json:"policy,omitempty"`
	Resources api.Resources      `json:"resources,omitempty"`
	// Runtime is the isolation tier of the build and of its sandboxes
	// (api.TemplateSpec.Runtime).
	Runtime string `json:"runtime,omitempty"`
	// NodeSelector limits the nodes that build it to those whose labels
	// include all of these; empty: every node.
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
}

// SandboxTemplateStatus is each node's build and the template's
// conditions (Valid; Ready when every node that needs it built it).
type SandboxTemplateStatus struct {
	Nodes      map[string]NodeBuild `json:"nodes,omitempty"`
	Conditions []metav1.Condition   `json:"conditions,omitempty"`
}

// NodeBuild is one node's build of a template.
type NodeBuild struct {
	// State is BuildReady, BuildFailed or BuildInvalid.
	State string `json:"state"`
	// Generation is the object's generation the state is for.
	Generation int64  `json:"generation"`
	Message    string `json:"message,omitempty"`
	// Snapshot is the built template's final snapshot on the node.
	Snapshot string `json:"snapshot,omitempty"`
	BuildMS  int64  `json:"buildMs,omitempty"`
}

// Build states.
const (
	BuildReady   = "ready"
	BuildFailed  = "failed"
	BuildInvalid = "invalid"
)

// SandboxWarmPool keeps Replicas warm guests of a template or an image
// ready over the cluster: each ready node that can take them keeps its
// share (Share).
type SandboxWarmPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              SandboxWarmPoolSpec   `json:"spec"`
	Status            SandboxWarmPoolStatus `json:"status,omitempty"`
}

// SandboxWarmPoolSpec names what to keep warm: exactly one of
// TemplateRef and Image.
type SandboxWarmPoolSpec struct {
	Replicas     int32             `json:"replicas"`
	TemplateRef  *ObjectRef        `json:"sandboxTemplateRef,omitempty"`
	Image        string            `json:"image,omitempty"`
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
}

// ObjectRef names another object.
type ObjectRef struct {
	Name string `json:"name"`
}

// SandboxWarmPoolStatus sums the nodes' shares.
type SandboxWarmPoolStatus struct {
	// Replicas is the sum of the nodes' targets; ReadyReplicas of their
	// guests ready.
	Replicas      int32                `json:"replicas"`
	ReadyReplicas int32                `json:"readyReplicas"`
	Nodes         map[string]NodeShare `json:"nodes,omitempty"`
	Conditions    []metav1.Condition   `json:"conditions,omitempty"`
}

// NodeShare is one node's part of a warm pool.
type NodeShare struct {
	Target  int32  `json:"target"`
	Ready   int32  `json:"ready"`
	Message string `json:"message,omitempty"`
}

// PolicyPreset is a named egress policy a create may name among its
// policy's presets, as it names a built-in one ("pypi"); a gateway puts
// its rules and secret bindings in the create's policy.
type PolicyPreset struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              api.Policy         `json:"spec"`
	Status            PolicyPresetStatus `json:"status,omitempty"`
}

// PolicyPresetStatus carries the Valid condition.
type PolicyPresetStatus struct {
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Sandbox is a long-lived sandbox kept by the gateways' controller: made
// when missing, made anew elsewhere when its node is lost, removed with
// the object.
type Sandbox struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              SandboxSpec   `json:"spec"`
	Status            SandboxStatus `json:"status,omitempty"`
}

// SandboxSpec is the create: from a template (TemplateRef) or an image.
type SandboxSpec struct {
	TemplateRef  *ObjectRef        `json:"sandboxTemplateRef,omitempty"`
	Image        string            `json:"image,omitempty"`
	Env          map[string]string `json:"env,omitempty"`
	Workdir      string            `json:"workdir,omitempty"`
	Resources    api.Resources     `json:"resources,omitempty"`
	Policy       *api.Policy       `json:"policy,omitempty"`
	Runtime      string            `json:"runtime,omitempty"`
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
}

// SandboxStatus is where the sandbox runs.
type SandboxStatus struct {
	ID    string `json:"id,omitempty"`
	Node  string `json:"node,omitempty"`
	State string `json:"state,omitempty"`
	// Replaced are the ids of sandboxes made for the object on nodes that
	// were lost: removed when their node comes back.
	Replaced           []string           `json:"replaced,omitempty"`
	ObservedGeneration int64              `json:"observedGeneration,omitempty"`
	Conditions         []metav1.Condition `json:"conditions,omitempty"`
}

// The lists.
type (
	SandboxTemplateList struct {
		metav1.TypeMeta `json:",inline"`
		metav1.ListMeta `json:"metadata,omitempty"`
		Items           []SandboxTemplate `json:"items"`
	}
	SandboxWarmPoolList struct {
		metav1.TypeMeta `json:",inline"`
		metav1.ListMeta `json:"metadata,omitempty"`
		Items           []SandboxWarmPool `json:"items"`
	}
	PolicyPresetList struct {
		metav1.TypeMeta `json:",inline"`
		metav1.ListMeta `json:"metadata,omitempty"`
		Items           []PolicyPreset `json:"items"`
	}
	SandboxList struct {
		metav1.TypeMeta `json:",inline"`
		metav1.ListMeta `json:"metadata,omitempty"`
		Items           []Sandbox `json:"items"`
	}
)

// DeepCopyObject implements runtime.Object.
func (o *SandboxTemplate) DeepCopyObject() runtime.Object {
	c := *o
	o.ObjectMeta.DeepCopyInto(&c.ObjectMeta)
	c.Spec.Steps = make([]api.TemplateStep, len(o.Spec.Steps))
	for i, s := range o.Spec.Steps {
		c.Spec.Steps[i] = copyStep(s)
	}
	c.Spec.Policy = o.Spec.Policy.Clone()
	c.Spec.NodeSelector = copyMap(o.Spec.NodeSelector)
	c.Status.Nodes = copyMap(o.Status.Nodes)
	c.Status.Conditions = copyConditions(o.Status.Conditions)
	return &c
}

// DeepCopyObject implements runtime.Object.
func (o *SandboxWarmPool) DeepCopyObject() runtime.Object {
	c := *o
	o.ObjectMeta.DeepCopyInto(&c.ObjectMeta)
	if o.Spec.TemplateRef != nil {
		r := *o.Spec.TemplateRef
		c.Spec.TemplateRef = &r
	}
	c.Spec.NodeSelector = copyMap(o.Spec.NodeSelector)
	c.Status.Nodes = copyMap(o.Status.Nodes)
	c.Status.Conditions = copyConditions(o.Status.Conditions)
	return &c
}

// DeepCopyObject implements runtime.Object.
func (o *PolicyPreset) DeepCopyObject() runtime.Object {
	c := *o
	o.ObjectMeta.DeepCopyInto(&c.ObjectMeta)
	c.Spec = *(&o.Spec).Clone()
	c.Status.Conditions = copyConditions(o.Status.Conditions)
	return &c
}

// DeepCopyObject implements runtime.Object.
func (o *Sandbox) DeepCopyObject() runtime.Object {
	c := *o
	o.ObjectMeta.DeepCopyInto(&c.ObjectMeta)
	if o.Spec.TemplateRef != nil {
		r := *o.Spec.TemplateRef
		c.Spec.TemplateRef = &r
	}
	c.Spec.Env = copyMap(o.Spec.Env)
	c.Spec.Policy = o.Spec.Policy.Clone()
	c.Spec.NodeSelector = copyMap(o.Spec.NodeSelector)
	c.Status.Replaced = append([]string(nil), o.Status.Replaced...)
	c.Status.Conditions = copyConditions(o.Status.Conditions)
	return &c
}

// DeepCopyObject implements runtime.Object.
func (l *SandboxTemplateList) DeepCopyObject() runtime.Object {
	c := &SandboxTemplateList{TypeMeta: l.TypeMeta, Items: make([]SandboxTemplate, len(l.Items))}
	l.ListMeta.DeepCopyInto(&c.ListMeta)
	for i := range l.Items {
		c.Items[i] = *l.Items[i].DeepCopyObject().(*SandboxTemplate)
	}
	return c
}

// DeepCopyObject implements runtime.Object.
func (l *SandboxWarmPoolList) DeepCopyObject() runtime.Object {
	c := &SandboxWarmPoolList{TypeMeta: l.TypeMeta, Items: make([]SandboxWarmPool, len(l.Items))}
	l.ListMeta.DeepCopyInto(&c.ListMeta)
	for i := range l.Items {
		c.Items[i] = *l.Items[i].DeepCopyObject().(*SandboxWarmPool)
	}
	return c
}

// DeepCopyObject implements runtime.Object.
func (l *PolicyPresetList) DeepCopyObject() runtime.Object {
	c := &PolicyPresetList{TypeMeta: l.TypeMeta, Items: make([]PolicyPreset, len(l.Items))}
	l.ListMeta.DeepCopyInto(&c.ListMeta)
	for i := range l.Items {
		c.Items[i] = *l.Items[i].DeepCopyObject().(*PolicyPreset)
	}
	return c
}

// DeepCopyObject implements runtime.Object.
func (l *SandboxList) DeepCopyObject() runtime.Object {
	c := &SandboxList{TypeMeta: l.TypeMeta, Items: make([]Sandbox, len(l.Items))}
	l.ListMeta.DeepCopyInto(&c.ListMeta)
	for i := range l.Items {
		c.Items[i] = *l.Items[i].DeepCopyObject().(*Sandbox)
	}
	return c
}

func copyStep(s api.TemplateStep) api.TemplateStep {
	s.Env = copyMap(s.Env)
	if s.Copy != nil {
		cp := *s.Copy
		if cp.Content != nil {
			v := *cp.Content
			cp.Content = &v
		}
		if cp.Mode != nil {
			m := *cp.Mode
			cp.Mode = &m
		}
		s.Copy = &cp
	}
	return s
}

func copyConditions(cs []metav1.Condition) []metav1.Condition {
	if cs == nil {
		return nil
	}
	return append([]metav1.Condition(nil), cs...)
}
