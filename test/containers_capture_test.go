package test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// TestContainersDirSnapshotAndCopyVolumes: a directory snapshot of a
// sandbox of several containers holds the directory of the container the
// request names (?container=, by default the first), taken in a freeze
// of the sandbox; a fork with copy_volumes gives each copy its own copy
// of the named volumes the containers mount (and, as every fork, of the
// shared volumes), taken in the group's one freeze. A paused group's
// snapshot captures it as it is.
func TestContainersDirSnapshotAndCopyVolumes(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	c := d.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := c.CreateVolume(ctx, api.VolumeRequest{Name: "data"}); err != nil {
		t.Fatal(err)
	}
	id := d.Create(api.CreateRequest{
		SharedVolumes: []api.SharedVolume{{Name: "workspace"}},
		Containers: []api.Container{
			{Name: "app", Mounts: []api.VolumeMount{{Name: "data", Path: "/data"}, {Name: "workspace", Path: "/workspace"}}},
			{Name: "tools", Image: "base", Mounts: []api.VolumeMount{{Name: "workspace", Path: "/workspace"}, {Name: "data", Path: "/data", ReadOnly: true}}},
		},
	})
	must := func(name, script string) string {
		t.Helper()
		r := d.groupExec(id, name, "sh", "-c", script)
		if r.ExitCode != 0 {
			t.Fatalf("%s: %q: %s", name, script, r)
		}
		return r.Stdout
	}
	must("app", "mkdir -p /root/work && echo app > /root/work/who && echo source > /data/v && echo shared > /workspace/w")
	must("tools", "mkdir -p /root/work/sub && echo tools > /root/work/who && echo deep > /root/work/sub/f")

	// Directory snapshots: the named container's, the first's by default.
	tools, err := c.Snapshot(client.WithContainer(ctx, "tools"), id, api.SnapshotRequest{Path: "/root/work"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("tools' directory snapshot %s: frozen %.1f ms, total %.1f ms", tools.ID, tools.FrozenMS, tools.TotalMS)
	if tools.Container != "tools" || tools.Image != "base" || tools.Path != "/root/work" || len(tools.Containers) != 0 {
		t.Fatalf("tools' directory snapshot: %+v", tools)
	}
	first, err := c.Snapshot(ctx, id, api.SnapshotRequest{Path: "/root/work"})
	if err != nil {
		t.Fatal(err)
	}
	if first.Container != "app" {
		t.Fatalf("the default directory snapshot's container: %q, want app", first.Container)
	}
	cli := strings.TrimSpace(d.MustCLI("snapshot", id, "--path", "/root/work/sub", "-c", "tools"))
	reader := d.Create(api.CreateRequest{Volumes: []api.VolumeMount{{Snapshot: tools.ID, Path: "/t"}, {Snapshot: first.ID, Path: "/a"}, {Snapshot: cli, Path: "/c"}}})
	if out, _, st := d.Exec(reader, "sh", "-c", "cat /t/who /t/sub/f /a/who /c/f"); st.ExitCode != 0 || out != "tools\ndeep\napp\ndeep\n" {
		t.Fatalf("the directory snapshots hold %q (%+v), want tools', app's, then tools' sub (the CLI's)", out, st)
	}

	// What a group's directory snapshot refuses, each saying why.
	for _, tc := range []struct {
		name, container, path string
		want                  error
		says                  string
	}{
		{"whole sandbox naming a container", "tools", "", client.ErrInvalid, "captures every container"},
		{"on a shared volume", "tools", "/workspace", client.ErrInvalid, "mounted volume"},
		{"on a named volume", "app", "/data", client.ErrInvalid, "mounted volume"},
		{"unknown container", "nosuch", "/root", client.ErrNotFound, "nosuch"},
		{"malformed container", "No/Such", "/root", client.ErrInvalid, "container"},
	} {
		_, err := c.Snapshot(client.WithContainer(ctx, tc.container), id, api.SnapshotRequest{Path: tc.path})
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want %v saying %q", tc.name, err, tc.want, tc.says)
		}
	}

	// Forks with copies of their volumes: each its own data volume,
	// holding the source's files, in one freeze with the disks.
	forks, err := c.Fork(ctx, id, api.ForkRequest{Count: 2, CopyVolumes: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("copy_volumes fork: frozen %.1f ms, total %.1f ms", forks.FrozenMS, forks.TotalMS)
	seen := map[string]bool{"data": true}
	for _, f := range forks.Sandboxes {
		if len(f.Containers) != 2 {
			t.Fatalf("fork %s has %d containers", f.ID, len(f.Containers))
		}
		var vol string
		for _, cs := range f.Containers {
			for _, mt := range cs.Mounts {
				if mt.Path == "/data" {
					if vol != "" && mt.Name != vol {
						t.Fatalf("fork %s: its containers mount different copies (%s, %s)", f.ID, vol, mt.Name)
					}
					vol = mt.Name
				}
			}
		}
		if seen[vol] || !strings.HasPrefix(vol, "data-") {
			t.Fatalf("fork %s mounts volume %q at /data: not a copy of its own", f.ID, vol)
		}
		seen[vol] = true
		for _, check := range []struct{ container, script, want string }{
			{"app", "cat /data/v /workspace/w /root/work/who", "source\nshared\napp\n"},
			{"tools", "cat /data/v /root/work/who", "source\ntools\n"},
		} {
			if r := d.groupExec(f.ID, check.container, "sh", "-c", check.script); r.Stdout != check.want {
				t.Fatalf("fork %s/%s: %q: %s", f.ID, check.container, check.script, r)
			}
		}
		d.groupExec(f.ID, "app", "sh", "-c", "echo "+f.ID+" > /data/v")
		if r := d.groupExec(f.ID, "tools", "cat", "/data/v"); r.Stdout != f.ID+"\n" {
			t.Fatalf("fork %s: tools does not see app's write to their copy: %s", f.ID, r)
		}
	}
	if out := must("tools", "cat /data/v"); out != "source\n" {
		t.Fatalf("a fork's write reached the source's volume: %q", out)
	}
	// Without copy_volumes, forks share the named volume.
	shared, err := c.Fork(ctx, id, api.ForkRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(shared.Sandboxes[0].Containers[0].Mounts, func(v api.VolumeMount) bool { return v.Name == "data" }); i < 0 {
		t.Fatalf("a fork without copy_volumes: mounts %+v, want data itself", shared.Sandboxes[0].Containers[0].Mounts)
	}

	// A paused group is captured as it is, and comes back whole.
	if _, err := c.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	snap, err := c.Snapshot(ctx, id, api.SnapshotRequest{})
	if err != nil {
		t.Fatalf("snapshot of a paused group: %v", err)
	}
	if snap.FrozenMS != 0 || len(snap.Containers) != 2 {
		t.Fatalf("snapshot of a paused group: %+v", snap)
	}
	copyID := d.createCLI("--from", snap.ID)
	if r := d.groupExec(copyID, "tools", "sh", "-c", "cat /root/work/sub/f /workspace/w"); r.Stdout != "deep\nshared\n" {
		t.Fatalf("a copy of a paused group: %s", r)
	}

	var all []api.Sandbox
	all = append(append(append(all, forks.Sandboxes...), shared.Sandboxes...), api.Sandbox{ID: id}, api.Sandbox{ID: copyID}, api.Sandbox{ID: reader})
	for _, s := range all {
		if err := c.Delete(ctx, s.ID, true); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []string{tools.ID, first.ID, cli, snap.ID} {
		if !waitFor(30*time.Second, 50*time.Millisecond, func() bool { return c.DeleteSnapshot(ctx, s) == nil }) {
			t.Errorf("snapshot %s could not be removed", s)
		}
	}
	// The forks' copies are volumes of their own, removed by hand; the
	// shared ones went with their sandboxes.
	if !waitFor(30*time.Second, 50*time.Millisecond, func() bool {
		vols, err := c.Volumes(ctx)
		if err != nil {
			return false
		}
		for _, v := range vols {
			if strings.HasPrefix(v.Name, "data-") {
				c.DeleteVolume(ctx, v.Name)
			}
		}
		return len(vols) == 1 && vols[0].Name == "data"
	}) {
		vols, _ := c.Volumes(ctx)
		t.Errorf("volumes left: %+v", vols)
	}
}
