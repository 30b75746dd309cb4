package test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
)

// The pair below writes a causal chain across two containers: the writer
// appends line i to its own disk, then sends it over localhost to the
// keeper, which appends it to its own. The keeper never holds a line the
// writer has not written, so a capture of both disks in one freeze has
// keeper ≤ writer; captures at two moments could have more in the keeper.
// Both idle in a copy, which starts with a log (the snapshot's).
const (
	chainWriter = `[ -e /root/log ] && exec sleep infinity
exec python3 -c '
import socket, time
s = None
while s is None:
    try: s = socket.create_connection(("127.0.0.1", 9000))
    except OSError: time.sleep(0.05)
f = open("/root/log", "a")
i = 0
while True:
    f.write("%d\n" % i); f.flush(); s.sendall(b"%d\n" % i); i += 1
'`
	chainKeeper = `[ -e /root/log ] && exec sleep infinity
exec python3 -c '
import socket
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); l.bind(("127.0.0.1", 9000)); l.listen()
c, _ = l.accept(); f = open("/root/log", "a")
while True:
    d = c.recv(65536)
    if not d: break
    f.write(d.decode()); f.flush()
'`
)

// chainLines returns how many complete lines container name's log holds.
func (d *Daemon) chainLines(id, name string) int {
	d.t.Helper()
	r := d.groupExec(id, name, "sh", "-c", "wc -l < /root/log")
	n, err := strconv.Atoi(strings.TrimSpace(r.Stdout))
	if err != nil {
		d.t.Fatalf("%s/%s: counting lines: %s", id, name, r)
	}
	return n
}

// checkChain checks a copy of the chain's sandbox: every container
// running, the keeper no ahead of the writer, the tools container's file.
func checkChain(t *testing.T, d *Daemon, id string) {
	t.Helper()
	sb := d.get(id)
	if len(sb.Containers) != 3 {
		t.Fatalf("copy %s has %d containers, want 3", id, len(sb.Containers))
	}
	for _, c := range sb.Containers {
		if c.State != api.StateRunning {
			t.Fatalf("copy %s: container %s is %s: %s", id, c.Name, c.State, c.Error)
		}
	}
	w, k := d.chainLines(id, "writer"), d.chainLines(id, "keeper")
	t.Logf("copy %s: writer %d lines, keeper %d", id, w, k)
	if k == 0 || k > w {
		t.Fatalf("copy %s: the keeper has %d lines, the writer %d: not one moment", id, k, w)
	}
	if out := d.groupExec(id, "tools", "cat", "/root/marker").Stdout; out != "tools\n" {
		t.Fatalf("copy %s: the tools container's file holds %q", id, out)
	}
}

// TestContainersSnapshot: a snapshot of a sandbox of three containers,
// two of them writing, freezes them in one window and captures every
// disk; `create --from` and fork bring back the whole group at that
// moment, and the source runs on.
func TestContainersSnapshot(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	c := d.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	id := d.Create(api.CreateRequest{
		SharedVolumes: []api.SharedVolume{{Name: "workspace"}},
		Containers: []api.Container{
			{Name: "writer", Command: []string{"sh", "-c", chainWriter}},
			{Name: "keeper", Command: []string{"sh", "-c", chainKeeper}, Mounts: []api.VolumeMount{{Name: "workspace", Path: "/workspace"}}},
			{Name: "tools", Image: "base", Mounts: []api.VolumeMount{{Name: "workspace", Path: "/workspace"}}},
		},
	})
	d.groupExec(id, "tools", "sh", "-c", "echo tools > /root/marker")
	if !waitFor(20*time.Second, 20*time.Millisecond, func() bool {
		return d.groupExec(id, "keeper", "sh", "-c", "test $(wc -l < /root/log) -gt 2000").ExitCode == 0
	}) {
		t.Fatal("the chain did not write")
	}

	// Written by one container just before, unsynced: the snapshot holds
	// it in the shared volume, which the copies' other container reads.
	d.groupExec(id, "tools", "sh", "-c", "echo before-snapshot > /workspace/marker")
	snap, err := c.Snapshot(ctx, id, api.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot %s: frozen %.1f ms, total %.1f ms, shared %v", snap.ID, snap.FrozenMS, snap.TotalMS, snap.Shared)
	if len(snap.Containers) != 3 || snap.Containers[2].Image != "base" || len(snap.SharedVolumes) != 1 || snap.SharedVolumes[0].Volume != "" {
		t.Fatalf("snapshot's containers %+v, shared volumes %+v", snap.Containers, snap.SharedVolumes)
	}
	if snap.FrozenMS <= 0 || snap.TotalMS < snap.FrozenMS {
		t.Fatalf("snapshot frozen %.1f ms of %.1f", snap.FrozenMS, snap.TotalMS)
	}
	dir := filepath.Join(d.StateDir, "storage", "snapshots", snap.ID)
	for _, img := range []string{"disk.img", "container-keeper.img", "container-tools.img", "shared-workspace.img"} {
		if out, err := exec.Command("e2fsck", "-fn", filepath.Join(dir, img)).CombinedOutput(); err != nil {
			t.Fatalf("e2fsck of %s: %v\n%s", img, err, out)
		}
	}
	// The source runs on, every container in it.
	n := d.chainLines(id, "keeper")
	if !waitFor(10*time.Second, 20*time.Millisecond, func() bool { return d.chainLines(id, "keeper") > n }) {
		t.Fatal("the source stopped writing after the snapshot")
	}

	copyID := d.createCLI("--from", snap.ID)
	checkChain(t, d, copyID)
	if sb := d.get(copyID); sb.From != snap.ID || len(sb.SharedVolumes) != 1 || sb.SharedVolumes[0].Volume == snap.SharedVolumes[0].Volume {
		t.Fatalf("copy: from %q, shared volumes %+v", sb.From, sb.SharedVolumes)
	}
	sharedMarker := func(sb string) {
		t.Helper()
		if r := d.groupExec(sb, "keeper", "cat", "/workspace/marker"); strings.TrimSpace(r.Stdout) != "before-snapshot" {
			t.Fatalf("the shared volume of %s lacks what was written before the capture: %s", sb, r)
		}
	}
	sharedMarker(copyID)
	// A copy's writes are its own, in its disks and its shared volumes.
	d.groupExec(copyID, "keeper", "sh", "-c", "echo mine > /root/copy-only; echo mine > /workspace/copy-only")
	if r := d.groupExec(id, "keeper", "sh", "-c", "test -e /root/copy-only || test -e /workspace/copy-only"); r.ExitCode == 0 {
		t.Fatal("a write in the copy reached the source")
	}

	forks, err := c.Fork(ctx, id, api.ForkRequest{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fork: frozen %.1f ms, total %.1f ms", forks.FrozenMS, forks.TotalMS)
	for _, f := range forks.Sandboxes {
		checkChain(t, d, f.ID)
		sharedMarker(f.ID)
	}

	// What a group's capture refuses, and the daemon serves on.
	if _, err := c.Create(ctx, api.CreateRequest{From: snap.ID, Env: map[string]string{"A": "b"}}); err == nil || !strings.Contains(err.Error(), "several containers") {
		t.Errorf("create from a group's snapshot with env: %v", err)
	}
	for _, s := range append([]api.Sandbox{{ID: id}, {ID: copyID}}, forks.Sandboxes...) {
		if err := c.Delete(ctx, s.ID, true); err != nil {
			t.Fatal(err)
		}
	}
	// Their shared volumes go with them, in the background.
	if !waitFor(30*time.Second, 50*time.Millisecond, func() bool {
		vols, err := c.Volumes(ctx)
		return err == nil && len(vols) == 0
	}) {
		t.Error("the sandboxes' shared volumes outlive them")
	}
	d.MustCLI("snapshot", "rm", snap.ID)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("snapshot files remain after rm: %v", err)
	}
}
