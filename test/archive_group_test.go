package test

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
	"github.com/paddock-dev/paddock/internal/archive/s3test"
)

// archivedGroup is a sandbox of three containers: a web server on the
// shared workspace (ready once it answers), a tools container on the
// base image, and a worker that counts its starts, restarted on failure.
func archivedGroup(node string) api.CreateRequest {
	return api.CreateRequest{
		NodeSelector:  map[string]string{"n": node},
		Resources:     api.Resources{MemoryBytes: 512 << 20},
		Labels:        map[string]string{"app": "group-archive"},
		SharedVolumes: []api.SharedVolume{{Name: "workspace"}},
		Containers: []api.Container{
			{Name: "web", Command: []string{"python3", "-m", "http.server", "8123", "--bind", "127.0.0.1", "--directory", "/workspace"},
				Mounts: []api.VolumeMount{{Name: "workspace", Path: "/workspace"}}, Readiness: &api.Readiness{HTTP: "8123/"}, Restart: api.RestartAlways},
			{Name: "tools", Image: "base", Env: map[string]string{"TOOL": "kept"}, Workdir: "/root",
				Mounts: []api.VolumeMount{{Name: "workspace", Path: "/workspace"}}},
			{Name: "worker", Env: map[string]string{"WORKER": "w1"}, Restart: api.RestartOnFailure,
				Command:   []string{"sh", "-c", "echo start >> /root/starts; exec sleep infinity"},
				Readiness: &api.Readiness{Exec: []string{"test", "-s", "/root/starts"}}},
		},
	}
}

// groupSh runs a script in container name of sandbox id through the
// gateway.
func (c *cluster) groupSh(id, name, script string) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	st, err := c.client.Exec(client.WithContainer(ctx, name), id, api.ExecRequest{Cmd: []string{"sh", "-c", script}}, client.ExecIO{Stdout: &out, Stderr: &errb})
	if err != nil || st.ExitCode != 0 {
		c.t.Fatalf("%s/%s: sh -c %q: %v %+v\n%s%s", id, name, script, err, st, out.String(), errb.String())
	}
	return out.String()
}

// checkArchivedGroup checks a group resumed from the archive: every
// container running with its spec, its files, the shared workspace
// served by one container and written by another, and the worker
// started once more.
func (c *cluster) checkArchivedGroup(id, sums string, starts int) {
	c.t.Helper()
	sb := c.inspect(id)
	if sb.State != api.StateRunning || sb.Archived || len(sb.Containers) != 3 || len(sb.SharedVolumes) != 1 || sb.Labels["app"] != "group-archive" {
		c.t.Fatalf("resumed group: %+v", sb)
	}
	want := archivedGroup("").Containers
	for i, cs := range sb.Containers {
		w := want[i]
		if cs.State != api.StateRunning || cs.Name != w.Name || !slices.Equal(cs.Command, w.Command) || cs.Restart != w.Restart ||
			(w.Readiness == nil) != (cs.Readiness == nil) || len(cs.Env) != len(w.Env) || len(cs.Mounts) != len(w.Mounts) {
			c.t.Fatalf("container %d after the restore: %+v, want %+v", i, cs, w)
		}
	}
	if sb.Containers[1].Image != "base" {
		c.t.Fatalf("tools' image after the restore: %q", sb.Containers[1].Image)
	}
	if got := c.groupSh(id, "tools", "cd /root/work && sha256sum blob note"); got != sums {
		c.t.Fatalf("tools' files: %q, were %q", got, sums)
	}
	if got := c.groupSh(id, "tools", "echo $TOOL; pwd"); got != "kept\n/root\n" {
		c.t.Fatalf("tools' environment: %q", got)
	}
	if got := c.groupSh(id, "web", `python3 -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:8123/index.html").read().decode(), end="")'`); got != "from the workspace\n" {
		c.t.Fatalf("web serves %q from the shared workspace", got)
	}
	if got := c.groupSh(id, "worker", "wc -l < /root/starts; echo $WORKER"); got != strconv.Itoa(starts)+"\nw1\n" {
		c.t.Fatalf("worker: %q, want %d starts and its env", got, starts)
	}
}

// TestArchiveGroup archives a paused sandbox of three containers with a
// shared volume to a real object store (SeaweedFS): every container's
// disk and the shared volume go, each in an object of its own, and
// leave the node; resumed on the same node, then archived again and
// resumed on another node through the gateway once its own is gone (and
// once after a restart of its node), the
// whole group comes back (images, commands, env, readiness, restart
// policies, files, the shared volume). A truncated or corrupt container
// or volume disk fails the resume with a clear error and loses nothing.
func TestArchiveGroup(t *testing.T) {
	t.Parallel()
	s3 := s3test.Start(t)
	c := archiveCluster(t, 2, s3.Endpoint)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	sb, err := c.client.Create(ctx, archivedGroup("1"))
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	sums := c.groupSh(id, "tools", archiveFiles)
	c.groupSh(id, "tools", "echo 'from the workspace' > /workspace/index.html")
	c.checkArchivedGroup(id, sums, 1)
	node1 := c.nodes[0]
	local := []string{node1.StateDir + "/storage/disks/vol/" + id, node1.StateDir + "/storage/disks/vol/" + id + "--tools"}
	for _, p := range local {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("a disk is not where this test looks: %v", err)
		}
	}
	nodeVolumes := func() []api.Volume {
		t.Helper()
		vols, err := node1.Client().Volumes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return vols
	}
	if v := nodeVolumes(); len(v) != 1 {
		t.Fatalf("node1's volumes: %+v, want the shared one", v)
	}

	archiveIt := func() {
		t.Helper()
		code, body := c.raw(http.MethodPost, "/v1/sandboxes/"+id+"/pause?archive=true", nil)
		if code != http.StatusOK || !strings.Contains(body, `"archived":true`) {
			t.Fatalf("pause?archive=true: %d %s\n%s", code, body, c.nodes[0].Log())
		}
	}
	archiveIt()
	if got := c.inspect(id); got.State != api.StatePaused || !got.Archived || len(got.Containers) != 3 {
		t.Fatalf("after archive: %+v", got)
	}
	// Nothing of it stays on node1: disks, shared volume.
	for _, p := range local {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("node1 kept %s", p)
		}
	}
	if v := nodeVolumes(); len(v) != 0 {
		t.Errorf("node1 kept volumes %+v", v)
	}
	mc, err := minio.New(strings.TrimPrefix(s3.Endpoint, "http://"), &minio.Options{Creds: credentials.NewStaticV4(s3test.AccessKey, s3test.SecretKey, "")})
	if err != nil {
		t.Fatal(err)
	}
	objects := func() []string {
		var out []string
		for o := range mc.ListObjects(ctx, "e2e", minio.ListObjectsOptions{Prefix: "sandboxes/" + id + "/", Recursive: true}) {
			if o.Err != nil {
				t.Fatal(o.Err)
			}
			out = append(out, strings.TrimPrefix(o.Key, "sandboxes/"+id+"/"))
		}
		slices.Sort(out)
		return out
	}
	if got, want := objects(), []string{"container-tools", "container-worker", "disk", "record.json", "shared-workspace"}; !slices.Equal(got, want) {
		t.Fatalf("the store holds %v, want %v", got, want)
	}

	// A damaged container disk or shared volume: the resume says which,
	// and nothing is lost or left behind.
	read := func(key string) []byte {
		obj, err := mc.GetObject(ctx, "e2e", key, minio.GetObjectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if _, err := b.ReadFrom(obj); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	put := func(key string, b []byte) {
		if _, err := mc.PutObject(ctx, "e2e", key, bytes.NewReader(b), int64(len(b)), minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, obj := range []string{"container-tools", "shared-workspace"} {
		key := "sandboxes/" + id + "/" + obj
		good := read(key)
		flipped := bytes.Clone(good)
		flipped[len(flipped)/3] ^= 0x55
		for name, bad := range map[string][]byte{"truncated": good[:len(good)/2], "corrupt": flipped} {
			put(key, bad)
			code, body := c.raw(http.MethodPost, "/v1/sandboxes/"+id+"/resume", nil)
			if code != http.StatusBadRequest || !strings.Contains(body, "corrupt") || !strings.Contains(body, obj) {
				t.Fatalf("resume with a %s %s: %d %s", name, obj, code, body)
			}
			t.Logf("%s %s: %d %s", name, obj, code, body)
			if got := c.inspect(id); got.State != api.StatePaused || !got.Archived {
				t.Fatalf("after a failed restore: %+v", got)
			}
			if v := nodeVolumes(); len(v) != 0 {
				t.Fatalf("a failed restore left volumes %+v", v)
			}
		}
		put(key, good)
	}

	// Resumed on its own node, restarted meanwhile (the stub holds
	// nothing of the shared volume): the whole group, the worker started
	// again.
	node1.Stop()
	node1.Start()
	if v := nodeVolumes(); len(v) != 0 {
		t.Fatalf("node1 restarted holds volumes %+v", v)
	}
	code, body := c.raw(http.MethodPost, "/v1/sandboxes/"+id+"/resume", nil)
	if code != http.StatusOK {
		t.Fatalf("resume: %d %s\n%s", code, body, node1.Log())
	}
	c.checkArchivedGroup(id, sums, 2)
	if got := objects(); !slices.Equal(got, []string{"record.json"}) {
		t.Fatalf("after the restore the store holds %v, want the record alone", got)
	}

	// Archived again, its node gone for good: resumed on node2.
	archiveIt()
	node1.Stop()
	c.records = c.records[1:]
	c.writeNodes()
	code, body = c.raw(http.MethodPost, "/v1/sandboxes/"+id+"/resume", nil)
	if code != http.StatusOK {
		t.Fatalf("resume on another node: %d %s\n%s", code, body, c.nodes[1].Log())
	}
	if got := c.inspect(id); got.Node != "node2" {
		t.Fatalf("resumed on %q, want node2", got.Node)
	}
	c.checkArchivedGroup(id, sums, 3)
	if got := objects(); !slices.Equal(got, []string{"record.json"}) {
		t.Fatalf("after the move the store holds %v, want the record alone", got)
	}
	// Removed there, its shared volume with it.
	if err := c.client.Delete(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	if !waitFor(30*time.Second, 50*time.Millisecond, func() bool {
		vols, err := c.nodes[1].Client().Volumes(ctx)
		return err == nil && len(vols) == 0
	}) {
		t.Error("the shared volume outlived its sandbox on node2")
	}
}
