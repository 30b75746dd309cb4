package test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
	"github.com/paddock-dev/paddock/internal/server"
)

// askVia posts a request for host from inside sandbox id (reached
// through cl) to its self endpoint and returns the request filed.
func askVia(t *testing.T, cl *client.Client, id, host, reason string) api.EgressRequest {
	t.Helper()
	body, _ := json.Marshal(api.RequestAsk{Host: host, Reason: reason})
	r := runVia(t, cl, id, string(body), "curl", "-sS", "--max-time", "5", "--noproxy", "*", "--fail-with-body",
		"-H", "Content-Type: application/json", "--data-binary", "@-", "http://paddock.internal/v1/self/requests")
	var req api.EgressRequest
	if err := json.Unmarshal([]byte(r.Stdout), &req); r.ExitCode != 0 || err != nil || req.State != api.RequestPending || req.Host != host {
		t.Fatalf("asking for %s from inside %s: %s", host, id, r)
	}
	return req
}

// TestClusterEgressApproval (issue 26, bar 3 on a cluster): a real API
// server, two registered nodes with egress and a gateway watching them.
// A sandbox on the second node is denied a host and asks for it from
// inside; the gateway's `paddock requests` lists it with the first
// node's, oldest first; approved with the CLI at the gateway, the retried
// request reaches the real upstream; the decision is an event, streamed
// through the gateway, that names the client's token (by fingerprint)
// and the gateway's; stale and unknown ids answer 404; a node killed
// with -9 is named while the other's requests still list.
func TestClusterEgressApproval(t *testing.T) {
	t.Parallel()
	u := newUpstream(t, egressNames)
	egress := []string{"--dns-upstream", u.DNS, "--egress-root-ca", u.CAFile}
	c := startKubeCluster(t, 1, append(egress, "--node-labels", "room=first"), append(egress, "--node-labels", "room=second"))
	gw := c.gateways[0].client
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	first, err := gw.Create(ctx, api.CreateRequest{NodeSelector: map[string]string{"kubernetes.io/hostname": "none"}})
	if err == nil {
		t.Fatalf("a create no node matches was placed on %s", first.Node)
	}
	sb, err := gw.Create(ctx, api.CreateRequest{NodeSelector: map[string]string{"room": "second"}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Node != "f2" || c.nodeOf(sb.ID) != "f2" {
		t.Fatalf("the sandbox for room=second is on %q (tag of %q)", sb.Node, c.nodeOf(sb.ID))
	}
	other, err := gw.Create(ctx, api.CreateRequest{NodeSelector: map[string]string{"room": "first"}})
	if err != nil || other.Node != "f1" {
		t.Fatalf("the second create: %+v, %v", other, err)
	}

	mustFail(t, runVia(t, gw, sb.ID, "", "curl", "-sS", "--max-time", "5", "--noproxy", "*", "http://allowed.test/"), "a host no rule allows")
	early := askVia(t, gw, other.ID, "other.test", "on the first node")
	req := askVia(t, gw, sb.ID, "allowed.test", "fetch the test page")

	// Listed through the gateway: both nodes' requests, oldest first.
	list, missing, _, err := gw.GatheredRequests(ctx, "", api.RequestPending)
	if err != nil || len(missing) > 0 || len(list) != 2 || list[0].ID != early.ID || list[1].ID != req.ID {
		t.Fatalf("pending requests through the gateway: %+v, missing %v, %v", list, missing, err)
	}
	out := c.cli(0, "requests", "--state", "pending")
	if out.Code != 0 || !strings.Contains(out.Stdout, req.ID) || !strings.Contains(out.Stdout, "fetch the test page") || !strings.Contains(out.Stdout, early.ID) {
		t.Fatalf("paddock requests at the gateway: %+v", out)
	}

	// The decision, watched on the sandbox's event stream through the gateway.
	decided := make(chan api.Event, 1)
	fctx, stopFollow := context.WithCancel(ctx)
	defer stopFollow()
	go gw.FollowEvents(fctx, sb.ID, client.EventOptions{Types: []string{"request"}}, func(e api.Event) error {
		if strings.Contains(e.Message, "approved") {
			decided <- e
		}
		return nil
	})
	out = c.cli(0, "requests", "approve", req.ID, "--for", "1h", "--note", "through the gateway")
	cred := server.TokenCredential("Bearer " + c.token)
	if out.Code != 0 || !strings.Contains(out.Stdout, "approved until") || !strings.Contains(out.Stdout, "by cli ("+cred+" at a gateway") {
		t.Fatalf("approve at the gateway: %+v", out)
	}
	mustSay(t, runVia(t, gw, sb.ID, "", "curl", "-sS", "--max-time", "5", "--noproxy", "*", "http://allowed.test/"), "hello from allowed.test GET /")
	select {
	case e := <-decided:
		if !strings.Contains(e.Message, "by cli ("+cred+" at a gateway, which called with token ") {
			t.Fatalf("the decision's event: %q", e.Message)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the decision did not come on the event stream through the gateway")
	}
	if self := runVia(t, gw, sb.ID, "", "curl", "-sS", "--noproxy", "*", "http://paddock.internal/v1/self/requests/"+req.ID); !strings.Contains(self.Stdout, `"state": "approved"`) {
		t.Fatalf("self view of the request: %s", self)
	}

	// Stale and unknown ids: a clear 404 each, and nothing decided.
	unknownTag := "zzz"
	if tag := c.nodesAt(0)["f1"].Tag; tag == unknownTag || c.nodesAt(0)["f2"].Tag == unknownTag {
		unknownTag = "yyy"
	}
	for _, bad := range []struct{ id, want string }{
		{sb.ID + ".99", `request "` + sb.ID + `.99"`},
		{unknownTag + sb.ID[3:] + ".1", "no node of this cluster made"},
		{other.ID + ".7", `request "` + other.ID + `.7"`},
	} {
		_, err := gw.ApproveRequest(ctx, bad.id, api.RequestDecision{})
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Status != 404 || !strings.Contains(ce.Message, bad.want) {
			t.Errorf("approving %s: %v; want a 404 saying %q", bad.id, err, bad.want)
		}
		if out := c.cli(0, "requests", "deny", bad.id); out.Code == 0 || !strings.Contains(out.Stderr, bad.want) {
			t.Errorf("paddock requests deny %s: %+v", bad.id, out)
		}
	}
	if list, _ := gw.Requests(ctx, other.ID, ""); len(list) != 1 || list[0].State != api.RequestPending {
		t.Fatalf("the first node's request after the bad ids: %+v", list)
	}

	// A node that does not answer is named; the other's requests list.
	c.nodes[0].Kill9()
	out = c.cli(0, "requests")
	if out.Code != 0 || !strings.Contains(out.Stdout, req.ID) || strings.Contains(out.Stdout, early.ID) || !strings.Contains(out.Stderr, "f1 did not answer") {
		t.Fatalf("paddock requests with f1 down: %+v", out)
	}
	c.nodes[0].Start()
	if !waitFor(30*time.Second, 200*time.Millisecond, func() bool {
		list, missing, _, err := gw.GatheredRequests(ctx, "", "")
		return err == nil && len(missing) == 0 && len(list) == 2
	}) {
		t.Fatal("f1's request did not list again once it came back")
	}
}
