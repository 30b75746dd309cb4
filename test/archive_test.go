package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
	"github.com/paddock-dev/paddock/internal/archive/s3test"
	"github.com/paddock-dev/paddock/internal/e2b"
)

// archiveCluster is n nodes (tags "a", "b", ...; labels n=1, n=2, ...)
// archiving to one real object store, behind one gateway that finds
// archived sandboxes in it.
func archiveCluster(t *testing.T, n int, endpoint string) *cluster {
	t.Helper()
	keys := []string{"PADDOCK_ARCHIVE_ACCESS_KEY=" + s3test.AccessKey, "PADDOCK_ARCHIVE_SECRET_KEY=" + s3test.SecretKey}
	dir := t.TempDir()
	c := &cluster{t: t, nodesFile: filepath.Join(dir, "nodes.json"), token: "client-token-" + randHex(8), env: keys}
	nodeTokenFile, tokenFile := filepath.Join(dir, "node.token"), filepath.Join(dir, "client.token")
	os.WriteFile(nodeTokenFile, []byte("node-token-"+randHex(8)+"\n"), 0o600)
	os.WriteFile(tokenFile, []byte(c.token+"\n"), 0o600)
	arch := []string{"--archive-endpoint", endpoint, "--archive-bucket", "e2e"}
	slot := takeSlot(t)
	for i := 1; i <= n; i++ {
		tag, name := string(rune('a'+i-1)), fmt.Sprintf("node%d", i)
		addr := freeHostPort(t)
		d := prepareDaemon(t)
		d.NetName = slot.name("cc", i)
		d.Cgroup = "paddock-" + d.NetName
		d.UIDStart = slot.uidStart(i)
		d.Env = keys
		d.args = append(d.args, "--listen", "tcp://"+addr, "--token-file", nodeTokenFile, "--id-prefix", tag,
			"--network-name", d.NetName, "--network-subnet", slot.subnet(i),
			"--cgroup-parent", d.Cgroup, "--uid-start", fmt.Sprint(d.UIDStart), "--node-name", name)
		e2bAddr := freeHostPort(t)
		d.args = append(d.args, "--e2b-listen", "tcp://"+e2bAddr)
		d.args = append(d.args, arch...)
		d.Start()
		c.nodes = append(c.nodes, d)
		c.records = append(c.records, api.Node{Name: name, Tag: tag, Address: "http://" + addr, E2BAddress: "http://" + e2bAddr,
			State: api.NodeReady, Labels: map[string]string{"n": fmt.Sprint(i)}})
	}
	c.writeNodes()
	c.gwAddr, c.e2bAddr = freeHostPort(t), freeHostPort(t)
	c.serveGateway(append([]string{"--listen", "tcp://" + c.gwAddr, "--e2b-listen", "tcp://" + c.e2bAddr, "--token-file", tokenFile,
		"--node-token-file", nodeTokenFile, "--nodes-file", c.nodesFile, "--log-level", "debug"}, arch...)...)
	return c
}

// sh runs a script in sandbox id through the gateway.
func (c *cluster) sh(id, script string) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	st, err := c.client.Exec(ctx, id, api.ExecRequest{Cmd: []string{"sh", "-c", script}}, client.ExecIO{Stdout: &out, Stderr: &errb})
	if err != nil || st.ExitCode != 0 {
		c.t.Fatalf("sh -c %q: %v %+v\n%s%s", script, err, st, out.String(), errb.String())
	}
	return out.String()
}

func (c *cluster) inspect(id string) api.Sandbox {
	c.t.Helper()
	code, body := c.raw(http.MethodGet, "/v1/sandboxes/"+id, nil)
	var sb api.Sandbox
	if code != http.StatusOK || json.Unmarshal([]byte(body), &sb) != nil {
		c.t.Fatalf("inspect %s: %d %s", id, code, body)
	}
	return sb
}

const archiveFiles = `mkdir -p /root/work && head -c 3000000 /dev/urandom > /root/work/blob && echo hello > /root/work/note &&
	cd /root/work && sha256sum blob note`

// TestArchive archives paused sandboxes to a real object store
// (SeaweedFS) and resumes them: on the same node, and on another node
// through the gateway once their own node is gone for good, with the
// same id and their files intact; a corrupt or truncated archive is
// refused with a clear error and nothing lost; with the store down a
// pause still works and the archive fails saying why.
func TestArchive(t *testing.T) {
	t.Parallel()
	s3 := s3test.Start(t)
	c := archiveCluster(t, 2, s3.Endpoint)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	on := func(n string) api.CreateRequest {
		return api.CreateRequest{NodeSelector: map[string]string{"n": n}, Env: map[string]string{"KEPT": "yes"}, Labels: map[string]string{"app": "archive"}}
	}

	// A sandbox on node1, archived as it pauses.
	sb, err := c.client.Create(ctx, on("1"))
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	sums := c.sh(id, archiveFiles)
	diskDir := c.nodes[0].StateDir + "/storage/disks/vol/" + id
	if _, err := os.Stat(diskDir); err != nil {
		t.Fatalf("the sandbox's disk is not where this test looks: %v", err)
	}
	code, body := c.raw(http.MethodPost, "/v1/sandboxes/"+id+"/pause?archive=true", nil)
	if code != http.StatusOK || !strings.Contains(body, `"archived":true`) {
		t.Fatalf("pause?archive=true: %d %s\n%s", code, body, c.nodes[0].Log())
	}
	if got := c.inspect(id); got.State != api.StatePaused || !got.Archived {
		t.Fatalf("after archive: %+v", got)
	}
	// Its disk left node1: nothing of it under the node's storage.
	if _, err := os.Stat(diskDir); err == nil {
		t.Errorf("node1 kept the archived disk at %s", diskDir)
	}

	// A corrupt archive: the resume says so, and nothing is lost.
	mc, err := minio.New(strings.TrimPrefix(s3.Endpoint, "http://"), &minio.Options{Creds: credentials.NewStaticV4(s3test.AccessKey, s3test.SecretKey, "")})
	if err != nil {
		t.Fatal(err)
	}
	key := "sandboxes/" + id + "/disk"
	obj, err := mc.GetObject(ctx, "e2e", key, minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var good bytes.Buffer
	if _, err := good.ReadFrom(obj); err != nil {
		t.Fatal(err)
	}
	put := func(b []byte) {
		if _, err := mc.PutObject(ctx, "e2e", key, bytes.NewReader(b), int64(len(b)), minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	flipped := bytes.Clone(good.Bytes())
	flipped[len(flipped)/3] ^= 0x55
	for name, bad := range map[string][]byte{"truncated": good.Bytes()[:good.Len()/2], "corrupt": flipped} {
		put(bad)
		code, body = c.raw(http.MethodPost, "/v1/sandboxes/"+id+"/resume", nil)
		if code != http.StatusBadRequest || !strings.Contains(body, "corrupt") {
			t.Fatalf("resume from a %s archive: %d %s", name, code, body)
		}
		t.Logf("%s archive: %d %s", name, code, body)
		if got := c.inspect(id); got.State != api.StatePaused || !got.Archived {
			t.Fatalf("after a failed restore: %+v", got)
		}
	}
	put(good.Bytes())

	// node1 is gone for good: stopped, and out of the gateway's table.
	c.nodes[0].Stop()
	c.records = c.records[1:]
	c.writeNodes()
	code, body = c.raw(http.MethodGet, "/v1/sandboxes/"+id, nil)
	if code != http.StatusConflict || !strings.Contains(body, "archived") {
		t.Fatalf("inspect of an archived sandbox whose node is gone: %d %s", code, body)
	}
	// Resumed through the gateway: node2 takes it in, same id.
	code, body = c.raw(http.MethodPost, "/v1/sandboxes/"+id+"/resume", nil)
	if code != http.StatusOK {
		t.Fatalf("resume on another node: %d %s\n%s", code, body, c.nodes[1].Log())
	}
	got := c.inspect(id)
	if got.ID != id || got.State != api.StateRunning || got.Archived || got.Env["KEPT"] != "yes" || got.Labels["app"] != "archive" {
		t.Fatalf("resumed: %+v", got)
	}
	if again := c.sh(id, "cd /root/work && sha256sum blob note"); again != sums {
		t.Fatalf("files changed: %q, were %q", again, sums)
	}
	if env := c.sh(id, "echo $KEPT"); env != "yes\n" {
		t.Fatalf("environment: %q", env)
	}
	nctx, ncancel := context.WithTimeout(ctx, 10*time.Second)
	list, err := c.nodes[1].Client().List(nctx, client.ListOptions{})
	ncancel()
	if err != nil || len(list) != 1 || list[0].ID != id {
		t.Fatalf("node2 holds %+v, %v", list, err)
	}
	// The store keeps only a pointer to node2, no disk.
	if _, err := mc.StatObject(ctx, "e2e", key, minio.StatObjectOptions{}); err == nil {
		t.Error("the archived disk stayed in the store after the restore")
	}

	// The store down: the pause holds, the archive fails saying why.
	sb2, err := c.client.Create(ctx, on("2"))
	if err != nil {
		t.Fatal(err)
	}
	c.sh(sb2.ID, "echo still > /root/here")
	s3.Stop()
	code, body = c.raw(http.MethodPost, "/v1/sandboxes/"+sb2.ID+"/pause?archive=true", nil)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "archive store") || !strings.Contains(body, "paused") {
		t.Fatalf("pause?archive=true with the store down: %d %s", code, body)
	}
	t.Logf("store down: %d %s", code, body)
	if got := c.inspect(sb2.ID); got.State != api.StatePaused || got.Archived {
		t.Fatalf("after a failed archive: %+v", got)
	}
	code, body = c.raw(http.MethodPost, "/v1/sandboxes/"+sb2.ID+"/archive", nil)
	if code != http.StatusServiceUnavailable {
		t.Fatalf("archive with the store down: %d %s", code, body)
	}
	if _, err := c.client.Resume(ctx, sb2.ID); err != nil {
		t.Fatal(err)
	}
	if out := c.sh(sb2.ID, "cat /root/here"); out != "still\n" {
		t.Fatalf("files after a failed archive: %q", out)
	}
	// A running sandbox is not archived.
	code, body = c.raw(http.MethodPost, "/v1/sandboxes/"+sb2.ID+"/archive", nil)
	if code != http.StatusConflict || !strings.Contains(body, "pause it first") {
		t.Fatalf("archive of a running sandbox: %d %s", code, body)
	}
	if err := s3.Restart(); err != nil {
		t.Fatal(err)
	}
}

// TestArchiveMoves: an archived sandbox whose node is gone, resumed on
// two nodes at once, is restored by exactly one (the other answers 409
// naming it), with its timeout carried over; its node, back, drops the
// stale stub and the gateway follows its answer to the node that holds
// the sandbox now. A sandbox with snapshots is not archived (they would
// not follow it); one whose timeout came while no node held it is
// removed when resumed.
func TestArchiveMoves(t *testing.T) {
	t.Parallel()
	s3 := s3test.Start(t)
	c := archiveCluster(t, 3, s3.Endpoint)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	on1 := api.CreateRequest{NodeSelector: map[string]string{"n": "1"}, TimeoutSeconds: 3600}

	sb, err := c.client.Create(ctx, on1)
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	sums := c.sh(id, archiveFiles)
	// With a snapshot on its node: refused, naming it.
	snap, err := c.client.Snapshot(ctx, id, api.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	code, body := c.raw(http.MethodPost, "/v1/sandboxes/"+id+"/pause?archive=true", nil)
	if code != http.StatusConflict || !strings.Contains(body, snap.ID) {
		t.Fatalf("archive of a sandbox with a snapshot: %d %s", code, body)
	}
	t.Logf("with a snapshot: %d %s", code, body)
	if err := c.client.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	if code, body = c.raw(http.MethodPost, "/v1/sandboxes/"+id+"/archive", nil); code != http.StatusOK {
		t.Fatalf("archive: %d %s", code, body)
	}
	archived := c.inspect(id)
	if archived.ExpiresAt == nil {
		t.Fatalf("the archived sandbox has no timeout: %+v", archived)
	}

	// One that times out while no node holds it.
	short, err := c.client.Create(ctx, api.CreateRequest{NodeSelector: map[string]string{"n": "1"}, TimeoutSeconds: 12})
	if err != nil {
		t.Fatal(err)
	}
	if code, body = c.raw(http.MethodPost, "/v1/sandboxes/"+short.ID+"/pause?archive=true", nil); code != http.StatusOK {
		t.Fatalf("archive: %d %s", code, body)
	}

	// node1 goes (its state kept); node2 and node3 resume the sandbox at
	// once, as two gateways would.
	c.nodes[0].Stop()
	rec1 := c.records[0]
	c.records = c.records[1:]
	c.writeNodes()
	type answer struct {
		node string
		sb   *api.Sandbox
		err  error
	}
	answers := make(chan answer, 2)
	for _, d := range c.nodes[1:] {
		go func() {
			rctx, rcancel := context.WithTimeout(ctx, 2*time.Minute)
			defer rcancel()
			got, err := d.Client().Resume(rctx, id)
			answers <- answer{d.NetName, got, err}
		}()
	}
	var won *api.Sandbox
	for range 2 {
		a := <-answers
		switch {
		case a.err == nil && won == nil:
			won = a.sb
		case a.err != nil && errors.Is(a.err, client.ErrConflict) && strings.Contains(a.err.Error(), "resum"):
			t.Logf("the other resume: %v", a.err)
		default:
			t.Fatalf("resume on %s: %+v %v (winner %v)", a.node, a.sb, a.err, won)
		}
	}
	if won == nil {
		t.Fatal("no node restored the sandbox")
	}
	winner := won.Node
	if won.ExpiresAt == nil || !won.ExpiresAt.Equal(*archived.ExpiresAt) {
		t.Fatalf("timeout after the move: %v, was %v", won.ExpiresAt, archived.ExpiresAt)
	}
	t.Logf("restored on %s", winner)

	// Past its timeout, the other one is removed on resume.
	time.Sleep(time.Until(short.CreatedAt.Add(13 * time.Second)))
	code, body = c.raw(http.MethodPost, "/v1/sandboxes/"+short.ID+"/resume", nil)
	if code != http.StatusNotFound || !strings.Contains(body, "timed out") {
		t.Fatalf("resume of a sandbox whose timeout came while archived: %d %s", code, body)
	}

	// node1 comes back: its stub is stale. It drops it, and the gateway,
	// which routes by the id's tag to node1, follows it to the winner.
	c.nodes[0].Start()
	c.records = append([]api.Node{rec1}, c.records...)
	c.writeNodes()
	var gerr error
	if !waitFor(30*time.Second, 100*time.Millisecond, func() bool {
		nctx, ncancel := context.WithTimeout(ctx, 5*time.Second)
		defer ncancel()
		_, gerr = c.nodes[0].Client().Get(nctx, id)
		return errors.Is(gerr, client.ErrNotFound)
	}) {
		t.Fatalf("node1 kept its stale stub: %v\n%s", gerr, c.nodes[0].Log())
	}
	t.Logf("node1: %v", gerr)
	if !strings.Contains(gerr.Error(), winner) {
		t.Fatalf("node1's answer does not name %s: %v", winner, gerr)
	}
	// The E2B facade's call (the gateway has not cached the move yet):
	// node1's facade names the winner, and the gateway follows.
	e2bInfo := func() (int, string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.e2bAddr+"/sandboxes/"+id, nil)
		req.Header.Set("X-API-Key", e2b.APIKey(c.token))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := e2bInfo(); code != http.StatusOK || !strings.Contains(body, `"sandboxID":"`+id+`"`) || !strings.Contains(body, `"running"`) {
		t.Fatalf("E2B info through the gateway after node1 came back: %d %s\n%s", code, body, c.gwLog)
	}
	got := c.inspect(id)
	if got.Node != winner || got.State != api.StateRunning || got.Archived {
		t.Fatalf("through the gateway after node1 came back: %+v", got)
	}
	if again := c.sh(id, "cd /root/work && sha256sum blob note"); again != sums {
		t.Fatalf("files changed: %q, were %q", again, sums)
	}
	list, err := c.nodes[0].Client().List(ctx, client.ListOptions{})
	if err != nil || len(list) != 0 {
		t.Fatalf("node1 lists %+v, %v", list, err)
	}
	// The loser of the race kept nothing of it.
	held := 0
	for _, d := range c.nodes[1:] {
		list, err := d.Client().List(ctx, client.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		held += len(list)
	}
	if held != 1 {
		t.Fatalf("nodes 2 and 3 hold %d sandboxes, want 1 (the winner's)", held)
	}
	// Removed through the gateway, from its node; node1 forgets it at
	// its next start.
	if err := c.client.Delete(ctx, id, true); err != nil {
		t.Fatal(err)
	}
}
