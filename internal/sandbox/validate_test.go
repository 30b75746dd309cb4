package sandbox

import (
	"errors"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

func TestValidateCreate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		req   api.CreateRequest
		field string // "" when valid
	}{
		{"empty", api.CreateRequest{}, ""},
		{"full", api.CreateRequest{Env: map[string]string{"A": "1"}, Workdir: "/w", Resources: api.Resources{CPUs: 0.5, MemoryBytes: 64 << 20, Pids: 100, DiskBytes: 1 << 30}, TimeoutSeconds: 60, Labels: map[string]string{"team": "x"}}, ""},
		{"env key", api.CreateRequest{Env: map[string]string{"A=B": "1"}}, "env"},
		{"env nul", api.CreateRequest{Env: map[string]string{"A": "a\x00"}}, "env"},
		{"relative workdir", api.CreateRequest{Workdir: "w"}, "workdir"},
		{"dotted workdir", api.CreateRequest{Workdir: "/a/../b"}, "workdir"},
		{"cpus negative", api.CreateRequest{Resources: api.Resources{CPUs: -1}}, "resources.cpus"},
		{"cpus too many", api.CreateRequest{Resources: api.Resources{CPUs: 1000}}, "resources.cpus"},
		{"memory tiny", api.CreateRequest{Resources: api.Resources{MemoryBytes: 1000}}, "resources.memory_bytes"},
		{"pids tiny", api.CreateRequest{Resources: api.Resources{Pids: 2}}, "resources.pids"},
		{"pids huge", api.CreateRequest{Resources: api.Resources{Pids: 99999999999}}, "resources.pids"},
		{"pids at the kernel's ceiling", api.CreateRequest{Resources: api.Resources{Pids: 1 << 22}}, ""},
		{"disk tiny", api.CreateRequest{Resources: api.Resources{DiskBytes: 1 << 20}}, "resources.disk_bytes"},
		{"timeout negative", api.CreateRequest{TimeoutSeconds: -5}, "timeout_seconds"},
		{"label key", api.CreateRequest{Labels: map[string]string{"bad key": "x"}}, "labels"},
		{"label value", api.CreateRequest{Labels: map[string]string{"k": strings.Repeat("x", 300)}}, "labels"},
		{"containers", api.CreateRequest{Containers: []api.Container{{Name: "web", Command: []string{"srv"}}, {Name: "tools", Image: "base", Resources: api.Resources{MemoryBytes: 64 << 20}, Mounts: []api.VolumeMount{{Name: "ws", Path: "/workspace", ReadOnly: true}}}}, SharedVolumes: []api.SharedVolume{{Name: "ws"}}}, ""},
		{"container name", api.CreateRequest{Containers: []api.Container{{Name: "Web"}}}, "containers[0].name"},
		{"container name dashes", api.CreateRequest{Containers: []api.Container{{Name: "a--b"}}}, "containers[0].name"},
		{"container twice", api.CreateRequest{Containers: []api.Container{{Name: "a"}, {Name: "b"}, {Name: "a"}}}, "containers[2].name"},
		{"depends on", api.CreateRequest{Containers: []api.Container{{Name: "db"}, {Name: "cache"}, {Name: "app", DependsOn: []string{"db", "cache"}}}}, ""},
		{"depends on a later one", api.CreateRequest{Containers: []api.Container{{Name: "app", DependsOn: []string{"db"}}, {Name: "db"}}}, "containers[0].depends_on[0]"},
		{"depends on itself", api.CreateRequest{Containers: []api.Container{{Name: "db"}, {Name: "app", DependsOn: []string{"app"}}}}, "containers[1].depends_on[0]"},
		{"depends on one twice", api.CreateRequest{Containers: []api.Container{{Name: "db"}, {Name: "app", DependsOn: []string{"db", "db"}}}}, "containers[1].depends_on[1]"},
		{"depends on nothing known", api.CreateRequest{Containers: []api.Container{{Name: "db"}, {Name: "app", DependsOn: []string{"nope"}}}}, "containers[1].depends_on[0]"},
		{"container env", api.CreateRequest{Containers: []api.Container{{Name: "a"}, {Name: "b", Env: map[string]string{"A=B": "x"}}}}, "containers[1].env"},
		{"container workdir", api.CreateRequest{Containers: []api.Container{{Name: "a", Workdir: "rel"}}}, "containers[0].workdir"},
		{"container user without command", api.CreateRequest{Containers: []api.Container{{Name: "a", User: "bob"}}}, "containers[0].user"},
		{"container mount path", api.CreateRequest{Containers: []api.Container{{Name: "a", Mounts: []api.VolumeMount{{Name: "v", Path: "/"}}}}}, "containers[0].mounts"},
		{"container limits", api.CreateRequest{Containers: []api.Container{{Name: "a"}, {Name: "b", Resources: api.Resources{Pids: 1}}}}, "resources.pids"},
		{"first container limits", api.CreateRequest{Containers: []api.Container{{Name: "a", Resources: api.Resources{CPUs: 1}}}}, "containers[0].resources"},
		{"image with containers", api.CreateRequest{Image: "host", Containers: []api.Container{{Name: "a"}}}, "image"},
		{"from with containers", api.CreateRequest{From: "snap-x", Containers: []api.Container{{Name: "a"}}}, "from"},
		{"shared volume alone", api.CreateRequest{SharedVolumes: []api.SharedVolume{{Name: "ws"}}}, "shared_volumes"},
		{"shared volume twice", api.CreateRequest{Containers: []api.Container{{Name: "a"}}, SharedVolumes: []api.SharedVolume{{Name: "ws"}, {Name: "ws"}}}, "shared_volumes[1].name"},
		{"shared volume size", api.CreateRequest{Containers: []api.Container{{Name: "a"}}, SharedVolumes: []api.SharedVolume{{Name: "ws", SizeBytes: 5}}}, "shared_volumes[0].size_bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := validateCreate(&tc.req, 2)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("valid request refused: %v", err)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("error %v does not name %q", err, tc.field)
			}
		})
	}
}
