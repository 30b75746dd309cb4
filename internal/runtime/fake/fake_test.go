package fake

import (
	"testing"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/runtime"
	"github.com/paddock-dev/paddock/internal/runtime/runtimetest"
)

// TestConformance runs the runtime suite on the fake, so that the
// manager's unit tests stand on a runtime that behaves as the real ones.
func TestConformance(t *testing.T) {
	host := NewHost()
	var last *Runtime
	runtimetest.Run(t, runtimetest.Harness{
		New: func(t *testing.T, dir string) runtime.Runtime {
			rt, err := New(host, dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			last = rt
			return rt
		},
		Spec: func(t *testing.T) runtime.Spec { return runtime.Spec{} },
		Limits: func(t *testing.T, id string) api.Resources {
			res, _ := host.Limits(id)
			return res
		},
		Frozen: func(t *testing.T, id string) bool { return host.Frozen(id) },
		Traces: func(t *testing.T, id string) []string { return last.Traces(id) },
	})
}
