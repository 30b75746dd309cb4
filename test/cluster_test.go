package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
	"github.com/paddock-dev/paddock/internal/e2b"
	"github.com/paddock-dev/paddock/wire"
)

// cluster is several paddock nodes on this host behind one gateway
// process, for one test.
type cluster struct {
	t         *testing.T
	nodes     []*Daemon
	records   []api.Node
	nodesFile string
	gwAddr    string
	e2bAddr   string // the gateway's E2B listener
	token     string
	gwLog     *syncBuffer
	client    *client.Client
	env       []string // added to the gateway's environment
}

// startCluster starts n nodes (tags "a", "b", ...) with TCP listeners
// that take only the node token, each with its own directories, network,
// uid range and cgroup parent (takeSlot), and a gateway in
// front of them fed by a nodes file. Everything is removed when the test
// ends, failed or not.
func startCluster(t *testing.T, n int) *cluster {
	return startClusterE2B(t, n, false)
}

// startClusterE2B is startCluster, with withE2B the nodes and the gateway
// serving the E2B facade too.
func startClusterE2B(t *testing.T, n int, withE2B bool, gatewayArgs ...string) *cluster {
	t.Helper()
	dir := t.TempDir()
	c := &cluster{t: t, nodesFile: filepath.Join(dir, "nodes.json"), token: "client-token-" + randHex(8)}
	nodeToken := "node-token-" + randHex(8)
	nodeTokenFile, tokenFile := filepath.Join(dir, "node.token"), filepath.Join(dir, "client.token")
	os.WriteFile(nodeTokenFile, []byte(nodeToken+"\n"), 0o600)
	os.WriteFile(tokenFile, []byte(c.token+"\n"), 0o600)
	slot := takeSlot(t)
	for i := 1; i <= n; i++ {
		tag := string(rune('a' + i - 1))
		addr := freeHostPort(t)
		d := prepareDaemon(t)
		d.NetName = slot.name("hg", i)
		d.Cgroup = "paddock-" + d.NetName
		d.UIDStart = slot.uidStart(i)
		d.args = append(d.args, "--listen", "tcp://"+addr, "--token-file", nodeTokenFile, "--id-prefix", tag,
			"--network-name", d.NetName, "--network-subnet", slot.subnet(i),
			"--cgroup-parent", d.Cgroup, "--uid-start", fmt.Sprint(d.UIDStart))
		rec := api.Node{Name: fmt.Sprintf("node%d", i), Tag: tag, Address: "http://" + addr, State: api.NodeReady}
		if withE2B {
			e2bAddr := freeHostPort(t)
			d.args = append(d.args, "--e2b-listen", "tcp://"+e2bAddr)
			rec.E2BAddress = "http://" + e2bAddr
		}
		d.Start()
		c.nodes = append(c.nodes, d)
		c.records = append(c.records, rec)
	}
	c.writeNodes()
	c.gwAddr = freeHostPort(t)
	args := []string{"--listen", "tcp://" + c.gwAddr, "--token-file", tokenFile,
		"--node-token-file", nodeTokenFile, "--nodes-file", c.nodesFile, "--log-level", "debug"}
	if withE2B {
		c.e2bAddr = freeHostPort(t)
		args = append(args, "--e2b-listen", "tcp://"+c.e2bAddr)
	}
	c.serveGateway(append(args, gatewayArgs...)...)
	return c
}

// serveGateway starts the cluster's gateway at c.gwAddr with args (after
// "gateway") and waits until it answers c.client.
func (c *cluster) serveGateway(args ...string) {
	t := c.t
	t.Helper()
	c.gwLog = startGatewayEnv(t, c.env, args...)
	cl, err := client.New("tcp://"+c.gwAddr, client.WithToken(c.token))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	c.client = cl
	if !waitFor(10*time.Second, 20*time.Millisecond, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := cl.Version(ctx)
		return err == nil
	}) {
		t.Fatalf("gateway did not come up:\n%s", c.gwLog)
	}
}

// writeNodes writes the node records where the gateway reads them, and
// waits until it has the new table.
func (c *cluster) writeNodes() {
	c.t.Helper()
	b, _ := json.Marshal(c.records)
	tmp := c.nodesFile + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		c.t.Fatal(err)
	}
	if err := os.Rename(tmp, c.nodesFile); err != nil {
		c.t.Fatal(err)
	}
	if c.client == nil {
		return
	}
	if !waitFor(10*time.Second, 50*time.Millisecond, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		nodes, err := c.client.Nodes(ctx)
		got, _ := json.Marshal(nodes)
		return err == nil && bytes.Equal(got, b)
	}) {
		c.t.Fatalf("the gateway did not take the new nodes file")
	}
}

// cli runs the CLI against the gateway.
func (c *cluster) cli(stdin string, args ...string) Result {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, paddockBin, args...)
	cmd.Env = append(os.Environ(), "PADDOCK_HOST=tcp://"+c.gwAddr, "PADDOCK_TOKEN="+c.token)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr, cmd.Stdin = &out, &errb, strings.NewReader(stdin)
	err := cmd.Run()
	r := Result{Stdout: out.String(), Stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.Code = ee.ExitCode()
	case err != nil:
		c.t.Fatalf("paddock %v: %v", args, err)
	}
	return r
}

// raw sends a request to the gateway with its token and returns the
// status and body.
func (c *cluster) raw(method, path string, body io.Reader) (int, string) {
	c.t.Helper()
	conn, err := net.Dial("tcp", c.gwAddr)
	if err != nil {
		c.t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	req, _ := http.NewRequest(method, "http://"+c.gwAddr, body)
	req.URL.Opaque = path // as written: no cleaning of dot segments
	req.Header.Set("Authorization", "Bearer "+c.token)
	if err := req.Write(conn); err != nil && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
		c.t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestClusterGateway drives three real nodes through a real gateway with
// the SDK and the CLI: creates spread over the nodes, exec (streamed
// output, exit codes, input, a terminal), files, a port connection, lists
// across nodes, bad ids and hostile input, a node killed with SIGKILL (its
// sandboxes answer 503 naming it while the others serve), marked lost,
// and back; placement when every node is full.
func TestClusterGateway(t *testing.T) {
	c := startCluster(t, 3)
	cl := c.client
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// Creates spread: one on each node, its id starting with its tag.
	ids := map[string]string{} // tag → sandbox
	for range 3 {
		sb, err := cl.Create(ctx, api.CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		ids[sb.ID[:1]] = sb.ID
	}
	if len(ids) != 3 || ids["a"] == "" || ids["b"] == "" || ids["c"] == "" {
		t.Fatalf("three creates landed on %v; want one on each of a, b, c", ids)
	}
	for i, tag := range []string{"a", "b", "c"} {
		if _, err := c.nodes[i].Client().Get(ctx, ids[tag]); err != nil {
			t.Fatalf("sandbox %s is not on node %d: %v", ids[tag], i+1, err)
		}
	}

	// Exec: streamed output and exit code, twice (the second on a lane
	// bound to the sandbox), on each node.
	for tag, id := range ids {
		for round := range 2 {
			var out, errb bytes.Buffer
			st, err := cl.Exec(ctx, id, api.ExecRequest{Cmd: []string{"sh", "-c", "for i in 1 2 3; do echo $i; done; echo oops >&2; exit 7"}},
				client.ExecIO{Stdout: &out, Stderr: &errb})
			if err != nil || st.ExitCode != 7 || out.String() != "1\n2\n3\n" || errb.String() != "oops\n" {
				t.Fatalf("node %s exec %d: %+v, %v, stdout %q, stderr %q", tag, round, st, err, out.String(), errb.String())
			}
		}
	}
	a, b, cc := ids["a"], ids["b"], ids["c"]

	// Input (an upgraded stream, spliced), and a terminal.
	var out bytes.Buffer
	st, err := cl.Exec(ctx, b, api.ExecRequest{Cmd: []string{"sh", "-c", "tr a-z A-Z; exit 3"}},
		client.ExecIO{Stdin: strings.NewReader("through the gateway\n"), Stdout: &out})
	if err != nil || st.ExitCode != 3 || out.String() != "THROUGH THE GATEWAY\n" {
		t.Fatalf("exec with input: %+v, %v, %q", st, err, out.String())
	}
	s, err := cl.ExecStream(ctx, cc, api.ExecRequest{Cmd: []string{"sh", "-c", "tty; stty size"}, TTY: &api.TTY{Cols: 91, Rows: 17}}, true)
	if err != nil {
		t.Fatal(err)
	}
	out.Reset()
	st, err = s.Wait(&out, io.Discard)
	s.Close()
	if err != nil || st.ExitCode != 0 || !strings.Contains(out.String(), "/dev/pts/") || !strings.Contains(out.String(), "17 91") {
		t.Fatalf("exec with a terminal: %+v, %v, %q", st, err, out.String())
	}

	// Files: up and down through the gateway, 4 MiB.
	data := bytes.Repeat([]byte("paddock cluster "), 256<<10)
	if _, err := cl.WriteFile(ctx, cc, "/tmp/big", bytes.NewReader(data), client.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	rc, err := cl.ReadFile(ctx, cc, "/tmp/big")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("file back: %d bytes, %v; want %d", len(got), err, len(data))
	}

	// A port's raw connection (upgraded, spliced): echo with half-close.
	c.nodes[0].startPortServer(a, "echo", 4000, "")
	conn, err := cl.DialPort(ctx, a, 4000)
	if err != nil {
		t.Fatal(err)
	}
	echoHalfClose(t, conn)
	conn.Close()

	// Lists gather every node.
	list, err := cl.List(ctx, client.ListOptions{})
	if err != nil || len(list) != 3 {
		t.Fatalf("list through the gateway: %d sandboxes, %v; want 3", len(list), err)
	}

	// The CLI: exec with output and exit code, input, ls, nodes.
	if r := c.cli("", "exec", a, "--", "sh", "-c", "echo from the cli; exit 5"); r.Code != 5 || r.Stdout != "from the cli\n" {
		t.Fatalf("cli exec: %+v", r)
	}
	if r := c.cli("abc", "exec", "-i", b, "--", "cat"); r.Code != 0 || r.Stdout != "abc" {
		t.Fatalf("cli exec -i: %+v", r)
	}
	if r := c.cli("", "ls", "-q"); r.Code != 0 || len(lines(r.Stdout)) != 3 {
		t.Fatalf("cli ls: %+v", r)
	}
	if r := c.cli("", "nodes"); r.Code != 0 || !strings.Contains(r.Stdout, "node3") || !strings.Contains(r.Stdout, "ready") {
		t.Fatalf("cli nodes: %+v", r)
	}

	// Unknown and stale ids, hostile input.
	if _, err := cl.Get(ctx, "zzzzzzzzzzzz"); !errors.Is(err, client.ErrNotFound) || !strings.Contains(err.Error(), "the tags: a, b, c") {
		t.Fatalf("unknown tag: %v", err)
	}
	if _, err := cl.Get(ctx, "a00000000000"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("stale id: %v", err)
	}
	if _, err := cl.Exec(ctx, "zzzzzzzzzzzz", api.ExecRequest{Cmd: []string{"true"}}, client.ExecIO{}); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("exec, unknown tag: %v", err)
	}
	for _, p := range []string{"/v1/sandboxes/" + a + "/../../v1/nodes", "/v1/sandboxes/a%2f..%2fx", "/v1/sandboxes/A_B/exec", "/v1/snapshots/snap-%2e%2e"} {
		if code, body := c.raw("GET", p, nil); code != http.StatusBadRequest && code != http.StatusNotFound {
			t.Errorf("GET %s: %d %s; want 400 or 404", p, code, body)
		}
	}
	if code, body := c.raw("POST", "/v1/sandboxes", bytes.NewReader(bytes.Repeat([]byte(" "), 2<<20))); code != http.StatusRequestEntityTooLarge {
		t.Errorf("2 MiB create: %d %s; want 413", code, body)
	}
	if code, body := c.raw("POST", "/v1/sandboxes", strings.NewReader(`{"image": 7}`)); code != http.StatusBadRequest || !strings.Contains(body, "image") {
		t.Errorf("bad create: %d %s; want 400 naming image", code, body)
	}
	badLane(t, c, a)

	if r := c.cli("", "exec", b, "--", "true"); r.Code != 0 {
		t.Fatalf("cli exec on node2: %+v", r)
	}
	// Node b killed: its sandboxes answer 503 naming it, the others
	// serve, lists say what is missing, creates go elsewhere.
	c.nodes[1].Kill9()
	if _, err := cl.Get(ctx, b); !errors.Is(err, client.ErrUnavailable) || !strings.Contains(err.Error(), "node2") {
		t.Fatalf("get on the killed node: %v", err)
	}
	// The first exec may be on a lane that was open to it (which broke
	// off, as it would without a gateway); the next asks the gateway.
	for round := range 2 {
		_, err = cl.Exec(ctx, b, api.ExecRequest{Cmd: []string{"true"}}, client.ExecIO{})
		if !errors.Is(err, client.ErrUnavailable) || (round == 1 && !strings.Contains(err.Error(), "node2")) {
			t.Fatalf("exec %d on the killed node: %v; want unavailable naming node2", round, err)
		}
	}
	for _, id := range []string{a, cc} {
		if st, err := cl.Exec(ctx, id, api.ExecRequest{Cmd: []string{"true"}}, client.ExecIO{}); err != nil || st.ExitCode != 0 {
			t.Fatalf("exec on %s with node2 down: %+v, %v", id, st, err)
		}
	}
	if list, err := cl.List(ctx, client.ListOptions{}); err != nil || len(list) != 2 {
		t.Fatalf("list with node2 down: %d, %v; want the 2 others", len(list), err)
	}
	for range 2 {
		sb, err := cl.Create(ctx, api.CreateRequest{})
		if err != nil || sb.ID[0] == 'b' {
			t.Fatalf("create with node2 down: %+v, %v", sb, err)
		}
	}
	// Its Lease expired: lost, named as such.
	c.records[1].State = api.NodeLost
	c.writeNodes()
	if _, err := cl.Get(ctx, b); !errors.Is(err, client.ErrUnavailable) || !strings.Contains(err.Error(), "node2 (tag b)") || !strings.Contains(err.Error(), "lost") {
		t.Fatalf("get on the lost node: %v", err)
	}
	// Back: its sandbox serves again, with its files.
	c.nodes[1].Start()
	c.records[1].State = api.NodeReady
	c.writeNodes()
	out.Reset()
	if st, err := cl.Exec(ctx, b, api.ExecRequest{Cmd: []string{"hostname"}}, client.ExecIO{Stdout: &out}); err != nil || st.ExitCode != 0 || out.String() != b+"\n" {
		t.Fatalf("exec on the node back: %+v, %v, %q", st, err, out.String())
	}
	// A new client's first exec takes the gateway's lanes to the node,
	// kept from before its restart: closed ones are not used.
	if r := c.cli("", "exec", b, "--", "cat", "/etc/hostname"); r.Code != 0 || r.Stdout != b+"\n" {
		t.Fatalf("cli exec on the node back: %+v", r)
	}

	// Every node full: a clear 503 naming the resource.
	for i := range c.records {
		c.records[i].Capacity = api.NodeResources{Sandboxes: 2}
		c.records[i].Allocated = api.NodeResources{Sandboxes: 2}
	}
	c.writeNodes()
	if _, err := cl.Create(ctx, api.CreateRequest{}); !errors.Is(err, client.ErrUnavailable) || !strings.Contains(err.Error(), "sandboxes") {
		t.Fatalf("create with every node full: %v; want unavailable naming sandboxes", err)
	}
	// A selector places by labels.
	c.records[2].Labels = map[string]string{"disk": "fast"}
	c.records[2].Capacity = api.NodeResources{}
	c.writeNodes()
	sb, err := cl.Create(ctx, api.CreateRequest{NodeSelector: map[string]string{"disk": "fast"}})
	if err != nil || sb.ID[0] != 'c' {
		t.Fatalf("create selecting disk=fast: %+v, %v; want on node3", sb, err)
	}

	// Delete through the gateway.
	list, err = cl.List(ctx, client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list {
		if err := cl.Delete(ctx, sb.ID, true); err != nil {
			t.Fatalf("delete %s: %v", sb.ID, err)
		}
	}
	if list, err := cl.List(ctx, client.ListOptions{}); err != nil || len(list) != 0 {
		t.Fatalf("after deletes: %d, %v", len(list), err)
	}
}

// badLane sends hostile frames on a lane through the gateway: a request
// for an unknown node gets an error frame and the lane goes on; a frame
// that is no request, or too big, ends it.
func badLane(t *testing.T, c *cluster, id string) {
	t.Helper()
	conn, err := net.Dial("tcp", c.gwAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(conn, "GET /v1/lane HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", c.token, api.LaneProtocol)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("lane upgrade: %v %v", resp, err)
	}
	fw, fr := wire.NewWriter(conn), wire.NewReader(br)
	errorFrame := func(want int, what string) {
		t.Helper()
		f, err := fr.Read()
		var e api.Error
		if err != nil || f.Type != wire.Error || json.Unmarshal(f.Payload, &e) != nil || e.Status != want || !strings.Contains(e.Message, what) {
			t.Fatalf("lane answer: %v %v %q; want an error %d naming %q", f.Type, err, f.Payload, want, what)
		}
	}
	fw.WriteJSON(wire.Request, api.LaneRequest{Sandbox: "zzzzzzzzzzzz", Exec: api.ExecRequest{Cmd: []string{"true"}}})
	errorFrame(http.StatusNotFound, "no node")
	fw.WriteJSON(wire.Request, api.LaneRequest{Sandbox: id, Exec: api.ExecRequest{}})
	errorFrame(http.StatusBadRequest, "cmd")
	fw.WriteJSON(wire.Request, api.LaneRequest{Sandbox: id, Exec: api.ExecRequest{Cmd: []string{"echo", "ok"}}})
	for {
		f, err := fr.Read()
		if err != nil {
			t.Fatalf("lane exec: %v", err)
		}
		if f.Type == wire.Exit {
			break
		}
	}
	fw.Write(wire.Stdin, []byte("not a request"))
	errorFrame(http.StatusBadRequest, "request frames")
	if _, err := fr.Read(); err == nil {
		t.Fatal("the lane went on after a frame out of step")
	}
}

// TestClusterE2B runs the unchanged npm e2b SDK's scenarios through a
// gateway in front of two nodes: creates are placed on both, every later
// call (control plane by path, envd by E2b-Sandbox-Id) reaches the node
// that holds the sandbox.
func TestClusterE2B(t *testing.T) {
	t.Parallel()
	dir := npmHarness(t)
	c := startClusterE2B(t, 2, true)
	e := &e2bDaemon{Daemon: c.nodes[0], URL: "http://" + c.e2bAddr, APIKey: e2b.APIKey(c.token)}
	ctx := context.Background()
	tags := map[byte]bool{}
	for _, name := range []string{"commands", "pty", "files", "lifecycle", "killed"} {
		t.Run(name, func(t *testing.T) {
			info := runScenario(t, e, dir, name)
			for _, id := range info["sandbox"] {
				tags[id[0]] = true
				if _, err := c.client.Get(ctx, id); err == nil {
					t.Errorf("sandbox %s outlived its scenario", id)
				}
			}
		})
	}
	if !tags['a'] || !tags['b'] {
		t.Errorf("the scenarios' sandboxes were on nodes %v; want both a and b", tags)
	}
	// envd calls keep their connection: the node's success vouches for
	// it at the gateway.
	var sb struct{ SandboxID, EnvdAccessToken string }
	sb.SandboxID, sb.EnvdAccessToken = e2bCreate(t, e.URL, e.APIKey)
	var conns []string
	envd := &http.Client{Transport: &http.Transport{}} // not the control plane's connections
	defer envd.CloseIdleConnections()
	for i := range 3 {
		if i == 2 {
			// More connections from this peer than the gateway keeps
			// unauthenticated (64): the oldest of those are closed, the
			// vouched one stays.
			for range 70 {
				c, err := net.Dial("tcp", c.e2bAddr)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
			}
		}
		req, _ := http.NewRequest("GET", e.URL+"/health", nil)
		req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
		req.Header.Set("X-Access-Token", sb.EnvdAccessToken)
		req = req.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
			conns = append(conns, i.Conn.LocalAddr().String())
		}}))
		resp, err := envd.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("envd /health: %d", resp.StatusCode)
		}
	}
	if conns[0] != conns[1] || conns[1] != conns[2] {
		t.Errorf("three envd calls took connections %v; want one kept", conns)
	}
	req, _ := http.NewRequest("DELETE", e.URL+"/sandboxes/"+sb.SandboxID, nil)
	req.Header.Set("X-API-Key", e.APIKey)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("E2B kill: %v %v", resp, err)
	}

	// A wrong key, an unknown sandbox.
	for _, tc := range []struct {
		key, path, sandbox string
		want               int
	}{
		{"e2b_wrong", "/sandboxes", "", http.StatusUnauthorized},
		{e.APIKey, "/sandboxes/zzzzzzzzzzzz", "", http.StatusNotFound},
		{e.APIKey, "/sandboxes/a%2f..", "", http.StatusBadRequest},
		{"", "/health", "zzzzzzzzzzzz", http.StatusNotFound},
	} {
		req, _ := http.NewRequest("GET", e.URL+tc.path, nil)
		req.Header.Set("X-API-Key", tc.key)
		if tc.sandbox != "" {
			req.Header.Set("E2b-Sandbox-Id", tc.sandbox)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != tc.want || body.Code != tc.want || body.Message == "" {
			t.Errorf("GET %s: %d %+v; want %d in E2B's form", tc.path, resp.StatusCode, body, tc.want)
		}
	}
}
