package sandbox

import (
	"errors"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// A create from a group template sets only what a started group can
// take; the rest is refused naming the field.
func TestCheckGroupCreate(t *testing.T) {
	tpl := api.Template{Name: "pg", Spec: api.TemplateSpec{Name: "pg", Containers: []api.Container{{Name: "a"}}}}
	no := false
	for _, req := range []api.CreateRequest{
		{},
		{Labels: map[string]string{"a": "b"}, TimeoutSeconds: 60, OnTimeout: api.TimeoutPause, AutoPauseSeconds: 5, AutoResume: &no},
		{Budget: &api.Budget{CPUSeconds: 10}, Autoscale: &api.Autoscale{MaxCPUs: 1}},
		{Policy: &api.Policy{Allow: []api.PolicyRule{{Match: "example.com"}}}},
		{Runtime: "native"},
	} {
		if err := checkGroupCreate(&req, tpl); err != nil {
			t.Errorf("%+v: %v", req, err)
		}
	}
	for _, tc := range []struct {
		req   api.CreateRequest
		field string
	}{
		{api.CreateRequest{Image: "base"}, "image"},
		{api.CreateRequest{Env: map[string]string{"A": "1"}}, "env"},
		{api.CreateRequest{Workdir: "/tmp"}, "workdir"},
		{api.CreateRequest{Volumes: []api.VolumeMount{{Name: "v", Path: "/v"}}}, "volumes"},
		{api.CreateRequest{Resources: api.Resources{CPUs: 1}}, "resources"},
		{api.CreateRequest{Runtime: "gvisor"}, "runtime"},
		{api.CreateRequest{Policy: &api.Policy{Secrets: []api.SecretBinding{{}}}}, "policy.secrets"},
	} {
		err := checkGroupCreate(&tc.req, tpl)
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.field+":") {
			t.Errorf("%+v: %v, want invalid naming %s", tc.req, err, tc.field)
		}
	}
}

// Only a change of what groups are made from changes their digest.
func TestGroupDigest(t *testing.T) {
	a := api.Template{Name: "a", Warm: 1, Spec: api.TemplateSpec{Containers: []api.Container{{Name: "x"}}}}
	b := a
	b.Warm, b.Name = 3, "b"
	if groupDigest(a) != groupDigest(b) {
		t.Error("warm or name changed the digest")
	}
	b.Spec.Containers = []api.Container{{Name: "x", Image: "base"}}
	if groupDigest(a) == groupDigest(b) {
		t.Error("another container spec kept the digest")
	}
}
