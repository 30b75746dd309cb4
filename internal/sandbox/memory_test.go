package sandbox

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/runtime/fake"
	"github.com/paddock-dev/paddock/internal/snapshot"
	"github.com/paddock-dev/paddock/internal/store"
)

// TestFromMemory: a create from a memory snapshot takes its runtime and
// volumes, and is refused another runtime, volumes at other paths and
// less memory than its processes use.
func TestFromMemory(t *testing.T) {
	snap := api.Snapshot{ID: "snap-abcdefghijkl", Memory: &api.SnapshotMemory{
		Runtime: "gvisor", MemoryBytes: 100 << 20,
		Volumes: []api.VolumeMount{{Name: "data", Path: "/data"}},
	}}
	for _, tc := range []struct {
		name string
		req  api.CreateRequest
		want string // in the error; "" for none
	}{
		{"defaults", api.CreateRequest{}, ""},
		{"same runtime, volume renamed", api.CreateRequest{Runtime: "gvisor", Volumes: []api.VolumeMount{{Name: "other", Path: "/data"}}}, ""},
		{"other runtime", api.CreateRequest{Runtime: "native"}, "runs on gvisor, not native"},
		{"other path", api.CreateRequest{Volumes: []api.VolumeMount{{Name: "data", Path: "/elsewhere"}}}, "mounts at /data"},
		{"read-only now", api.CreateRequest{Volumes: []api.VolumeMount{{Name: "data", Path: "/data", ReadOnly: true}}}, "mounts at /data"},
		{"too little memory", api.CreateRequest{Resources: api.Resources{MemoryBytes: 50 << 20}}, "use 104857600 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req
			err := fromMemory(&req, snap)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if req.Runtime != "gvisor" || len(req.Volumes) != 1 || req.Volumes[0].Path != "/data" {
					t.Fatalf("filled request: %+v", req)
				}
				return
			}
			if err == nil || !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an invalid request saying %q", err, tc.want)
			}
		})
	}
}

// TestMemoryNeedsACheckpointer: on a runtime that keeps no memory a
// memory snapshot and a fork asking for memory are refused naming the
// runtime, and a fork that asks nothing copies the files only.
func TestMemoryNeedsACheckpointer(t *testing.T) {
	if images.err != nil {
		t.Fatal(images.err)
	}
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "paddock.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	snaps, err := snapshot.Open(snapshot.Config{Dir: filepath.Join(dir, "snapshots"), Store: st, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	m := NewManager(Config{Images: images.store, Store: st, Snapshots: snaps, UIDStart: 1 << 20, MaxSandboxes: 16, Logger: quiet})
	defer m.Close()
	if err := m.Load(); err != nil {
		t.Fatal(err)
	}
	rt, err := fake.New(fake.NewHost(), filepath.Join(dir, "run"), m)
	if err != nil {
		t.Fatal(err)
	}
	m.SetRuntime(rt)
	ctx := context.Background()
	sb, err := m.Create(ctx, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if m.KeepsMemory(sb.ID) {
		t.Fatal("KeepsMemory on the fake runtime")
	}
	if _, err := m.Snapshots().Create(ctx, sb.ID, api.SnapshotRequest{Memory: true}); err == nil || !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "fake runtime") {
		t.Fatalf("memory snapshot on the fake runtime: %v", err)
	}
	if _, err := m.Snapshots().Create(ctx, sb.ID, api.SnapshotRequest{Memory: true, Path: "/tmp"}); err == nil || !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("memory snapshot of a directory: %v", err)
	}
	if _, err := m.Fork(ctx, sb.ID, api.ForkRequest{Memory: new(true)}); err == nil || !strings.Contains(err.Error(), "fake runtime") {
		t.Fatalf("fork with memory on the fake runtime: %v", err)
	}
	res, err := m.Fork(ctx, sb.ID, api.ForkRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Memory != nil || len(res.Sandboxes) != 1 {
		t.Fatalf("fork on the fake runtime: %+v", res)
	}
	if got := snaps.List(""); len(got) != 0 {
		t.Fatalf("snapshots left by refused memory snapshots and a fork: %+v", got)
	}
}
