package sandbox

import (
	"errors"
	"slices"
	"testing"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/archive"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// groupRecord is a group's record: the first mounts the shared volume
// and a named one, the member the shared one and a directory snapshot.
func groupRecord() record {
	const id = "abc123def456"
	r := record{Sandbox: api.Sandbox{ID: id,
		Containers:    []api.ContainerStatus{{Container: api.Container{Name: "app"}}, {Container: api.Container{Name: "tools"}}},
		SharedVolumes: []api.SharedVolume{{Name: "ws", Volume: id + "-ws"}},
		Volumes:       []api.VolumeMount{{Name: id + "-ws", Path: "/ws"}, {Name: "data", Path: "/data"}},
	}}
	r.Members = []memberRecord{{Name: "tools", UIDBase: 1 << 20, Volumes: []api.VolumeMount{{Name: id + "-ws", Path: "/ws"}, {Snapshot: "snap-x", Path: "/s"}, {Name: "data", Path: "/d"}}}}
	return r
}

// What stays on the node (and keeps a group from the archive) is every
// mount but the shared volumes'; the named volumes a copy_volumes fork
// copies are those of them with a name, once each.
func TestGroupNodeMounts(t *testing.T) {
	r := groupRecord()
	var paths []string
	for _, v := range r.nodeMounts() {
		paths = append(paths, v.Path)
	}
	if !slices.Equal(paths, []string{"/data", "/s", "/d"}) {
		t.Fatalf("node mounts at %v", paths)
	}
	if got := r.namedVolumes(); !slices.Equal(got, []string{"data"}) {
		t.Fatalf("named volumes %v", got)
	}
	r.Volumes, r.Members[0].Volumes = r.Volumes[:1], r.Members[0].Volumes[:1]
	if got := r.nodeMounts(); len(got) != 0 {
		t.Fatalf("a group mounting its shared volume alone: node mounts %v", got)
	}
}

// An archived record read from the store is hostile: its members and
// shared volumes must be the sandbox's own before their names become
// files and volumes; what the archiving node's runtime kept goes.
func TestCheckArchivedGroup(t *testing.T) {
	for _, tc := range []struct {
		name  string
		bend  func(*record)
		valid bool
	}{
		{"as archived", func(*record) {}, true},
		{"member not a container", func(r *record) { r.Members[0].Name = "other" }, false},
		{"member name a path", func(r *record) { r.Members[0].Name = "../x"; r.Containers[1].Name = "../x" }, false},
		{"a container too many", func(r *record) { r.Containers = append(r.Containers, r.Containers[1]) }, false},
		{"another's volume", func(r *record) { r.SharedVolumes[0].Volume = "data" }, false},
		{"shared name a path", func(r *record) { r.SharedVolumes[0].Name = "a/b"; r.SharedVolumes[0].Volume = r.ID + "-a/b" }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := groupRecord()
			tc.bend(&r)
			err := checkArchivedGroup(&r)
			if tc.valid != (err == nil) || (err != nil && !errors.Is(err, errdefs.ErrInvalid)) {
				t.Fatalf("checkArchivedGroup: %v", err)
			}
			if err == nil && r.Members[0].UIDBase != 0 {
				t.Fatal("the archiving node's uid range was kept")
			}
		})
	}
}

// The store's record must hold a disk for each member and shared volume
// of the sandbox, and no other.
func TestArchivedParts(t *testing.T) {
	d := archive.Disk{Bytes: 1}
	for _, tc := range []struct {
		name       string
		containers map[string]archive.Disk
		shared     map[string]archive.Disk
		valid      bool
	}{
		{"whole", map[string]archive.Disk{"tools": d}, map[string]archive.Disk{"ws": d}, true},
		{"no member disk", nil, map[string]archive.Disk{"ws": d}, false},
		{"another member's", map[string]archive.Disk{"web": d}, map[string]archive.Disk{"ws": d}, false},
		{"no shared disk", map[string]archive.Disk{"tools": d}, nil, false},
		{"one too many", map[string]archive.Disk{"tools": d, "web": d}, map[string]archive.Disk{"ws": d}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &box{rec: groupRecord()}
			err := archivedParts(b, archive.Record{ID: b.rec.ID, Disk: &d, Containers: tc.containers, Shared: tc.shared})
			if tc.valid != (err == nil) || (err != nil && !errors.Is(err, errdefs.ErrInvalid)) {
				t.Fatalf("archivedParts: %v", err)
			}
		})
	}
}
