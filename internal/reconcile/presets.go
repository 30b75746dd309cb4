// Package reconcile brings a paddock cluster to what its declarative
// objects (package cluster) say: on each node, the SandboxTemplates it
// builds, its share of each SandboxWarmPool and the Secrets its egress
// proxy injects (Node); in the gateways, the PolicyPresets a create names
// (ExpandPresets). Each writes what it did, or what is wrong with an
// object, to that object's status; a malformed object stops nothing
// else.
package reconcile

import (
	"fmt"
	"sort"
	"strings"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/cluster"
	"github.com/paddock-dev/paddock/internal/egress"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// ExpandPresets returns p with every preset it names that is a
// PolicyPreset (not a built-in one) replaced by that preset's rules, its
// built-in presets and its secret bindings; p itself is not changed. A
// name that is neither is an error naming what is known.
func ExpandPresets(p *api.Policy, presets []*cluster.PolicyPreset) (*api.Policy, error) {
	if p == nil || len(p.Presets) == 0 {
		return p, nil
	}
	builtin := egress.Presets()
	byName := make(map[string]*cluster.PolicyPreset, len(presets))
	for _, pp := range presets {
		byName[pp.Name] = pp
	}
	out := p.Clone()
	out.Presets = nil
	seen := map[string]bool{}
	add := func(name string) {
		if !seen[name] {
			seen[name] = true
			out.Presets = append(out.Presets, name)
		}
	}
	for i, name := range p.Presets {
		if _, ok := builtin[name]; ok {
			add(name)
			continue
		}
		pp := byName[name]
		if pp == nil {
			return nil, errdefs.Invalid(fmt.Sprintf("policy.presets[%d]", i), "no preset %q (built in: %s; PolicyPresets: %s)", name, names(builtin), presetNames(presets))
		}
		if err := CheckPreset(pp); err != nil {
			return nil, errdefs.Invalid(fmt.Sprintf("policy.presets[%d]", i), "PolicyPreset %q is malformed: %v", name, err)
		}
		spec := pp.Spec.Clone()
		out.Allow = append(out.Allow, spec.Allow...)
		out.Deny = append(out.Deny, spec.Deny...)
		out.Secrets = append(out.Secrets, spec.Secrets...)
		for _, b := range spec.Presets {
			add(b)
		}
	}
	return out, nil
}

// CheckPreset says what is wrong with a PolicyPreset: a rule or binding
// the egress proxy would refuse, or a preset it names that is not a
// built-in one.
func CheckPreset(pp *cluster.PolicyPreset) error {
	builtin := egress.Presets()
	for i, name := range pp.Spec.Presets {
		if _, ok := builtin[name]; !ok {
			return fmt.Errorf("spec.presets[%d]: %q is not a built-in preset (%s); a PolicyPreset names no other PolicyPreset", i, name, names(builtin))
		}
	}
	if err := egress.ValidatePolicy(&pp.Spec); err != nil {
		return fmt.Errorf("spec: %w", err)
	}
	return nil
}

func names[V any](m map[string]V) string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

func presetNames(presets []*cluster.PolicyPreset) string {
	if len(presets) == 0 {
		return "none"
	}
	out := make([]string, len(presets))
	for i, p := range presets {
		out[i] = p.Name
	}
	return strings.Join(out, ", ")
}
