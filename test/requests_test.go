package test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// askFromInside posts a request for host from inside sandbox id to its
// self endpoint and returns the answer's status and body.
func askFromInside(d *Daemon, id, host, reason string) (int, string) {
	d.t.Helper()
	body, _ := json.Marshal(api.RequestAsk{Host: host, Reason: reason})
	r := d.run(id, string(body), "curl", "-sS", "--max-time", "5", "--noproxy", "*", "-o", "/dev/stdout", "-w", "\n%{http_code}",
		"-H", "Content-Type: application/json", "--data-binary", "@-", "http://paddock.internal/v1/self/requests")
	if r.ExitCode != 0 {
		d.t.Fatalf("asking from inside: %s", r)
	}
	out := strings.TrimSpace(r.Stdout)
	i := strings.LastIndexByte(out, '\n')
	var code int
	fmt.Sscan(out[i+1:], &code)
	return code, out[:max(i, 0)]
}

// TestEgressApproval (issue 26, bar 3): a sandbox denied a host asks for
// it from inside; the request shows in `paddock requests`; approved from
// the CLI, the retried request reaches the real upstream through the
// real proxy; the sandbox reads the answer in its self view; the
// decision is an audit event naming who decided; a policy in mode "ask"
// files the request by itself; an approval for one use ends; requests
// and approvals survive a kill -9 of the daemon; a sandbox flooding
// requests gets 429 and the daemon keeps serving.
func TestEgressApproval(t *testing.T) {
	t.Parallel()
	u := newUpstream(t, egressNames)
	d := netDaemon(t, u)
	ctx := context.Background()
	id := egressSandbox(t, d, u, nil)

	mustFail(t, curl(d, id, "http://allowed.test/"), "a host no rule allows")
	code, body := askFromInside(d, id, "allowed.test", "fetch the test page")
	var req api.EgressRequest
	if err := json.Unmarshal([]byte(body), &req); code != 201 || err != nil || req.State != api.RequestPending || req.Host != "allowed.test" {
		t.Fatalf("ask: %d %s", code, body)
	}
	if code, _ := askFromInside(d, id, "allowed.test", "again"); code != 200 {
		t.Fatalf("asking again for a pending host answered %d, want 200 (the same request)", code)
	}
	out := d.MustCLI("requests", "--state", "pending")
	if !strings.Contains(out, req.ID) || !strings.Contains(out, "allowed.test") || !strings.Contains(out, "fetch the test page") {
		t.Fatalf("paddock requests:\n%s", out)
	}
	// Still refused before the decision.
	mustFail(t, curl(d, id, "http://allowed.test/"), "a pending request")

	out = d.MustCLI("requests", "approve", req.ID, "--for", "1h", "--note", "for the test")
	if !strings.Contains(out, "approved until") {
		t.Fatalf("approve: %s", out)
	}
	mustSay(t, curl(d, id, "http://allowed.test/"), "hello from allowed.test GET /")
	mustSay(t, curl(d, id, "--cacert", "/tmp/upstream-ca.pem", "https://allowed.test/x"), "hello from allowed.test GET /x")
	// The sandbox reads the answer in its self view.
	self := d.Sh(id, "curl -sS --noproxy '*' http://paddock.internal/v1/self/requests/"+req.ID)
	if !strings.Contains(self, `"state": "approved"`) || !strings.Contains(self, `"decided_by": "cli (unix socket)"`) {
		t.Fatalf("self view of the request: %s", self)
	}
	if pol := d.Sh(id, "curl -sS --noproxy '*' http://paddock.internal/v1/self/policy"); !strings.Contains(pol, `"request": "`+req.ID+`"`) {
		t.Fatalf("self view of the policy shows no grant: %s", pol)
	}
	// The audit: the ask and the decision, naming who decided; the
	// allowed connection names the request's grant.
	evs, err := d.Client().Events(ctx, id, client.EventOptions{Types: []string{"request"}})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []string
	for _, e := range evs {
		msgs = append(msgs, e.Message)
	}
	if len(evs) != 2 || !strings.Contains(evs[1].Message, "approved until") || !strings.Contains(evs[1].Message, "by cli (unix socket)") {
		t.Fatalf("request events: %q", msgs)
	}
	if !waitFor(5*time.Second, 100*time.Millisecond, func() bool {
		evs, _ := d.Client().Events(ctx, id, client.EventOptions{Types: []string{"policy"}})
		for _, e := range evs {
			if strings.Contains(string(e.Data), `"rule":"request:`+req.ID+`"`) {
				return true
			}
		}
		return false
	}) {
		t.Fatal("no policy event names the grant that allowed the connection")
	}

	// Policy mode ask: a refusal files the request; approved once, one
	// connection goes through and the grant ends.
	ask := egressSandbox(t, d, u, &api.Policy{Mode: api.PolicyModeAsk})
	mustFail(t, curl(d, ask, "http://other.test/"), "a host no rule allows, in mode ask")
	var auto api.EgressRequest
	if !waitFor(5*time.Second, 100*time.Millisecond, func() bool {
		list, _ := d.Client().Requests(ctx, ask, api.RequestPending)
		if len(list) > 0 {
			auto = list[0]
		}
		return len(list) == 1
	}) || auto.Host != "other.test" || !auto.Auto {
		t.Fatalf("mode ask filed %+v", auto)
	}
	d.MustCLI("requests", "approve", auto.ID, "--once")
	mustSay(t, curl(d, ask, "http://other.test/"), "hello from other.test")
	time.Sleep(4 * time.Second) // OnceGrace
	mustFail(t, curl(d, ask, "http://other.test/"), "a one-use approval, used")
	if list, _ := d.Client().Requests(ctx, ask, ""); len(list) == 0 || list[0].State != api.RequestExpired || list[0].Used == nil {
		t.Fatalf("the one-use request after its use: %+v", list)
	}

	// Denied from the CLI: the sandbox reads it, its connection stays refused.
	_, body = askFromInside(d, id, "wild.test", "")
	json.Unmarshal([]byte(body), &req)
	d.MustCLI("requests", "deny", req.ID, "--note", "no")
	if self := d.Sh(id, "curl -sS --noproxy '*' http://paddock.internal/v1/requests/"+req.ID); !strings.Contains(self, `"state": "denied"`) {
		t.Fatalf("self view of a denied request: %s", self)
	}

	// Hostile asks: malformed, escapes, floods.
	if code, body := askFromInside(d, id, "*.evil.test", ""); code != 400 || !strings.Contains(body, "not a name") {
		t.Fatalf("a wildcard ask: %d %s", code, body)
	}
	if code, body := askFromInside(d, id, "x.test", "\x1b]0;pwned\x07"); code != 400 || !strings.Contains(body, "control character") {
		t.Fatalf("an ask with escapes: %d %s", code, body)
	}
	var last int
	for i := range 20 {
		if last, body = askFromInside(d, id, fmt.Sprintf("flood%d.test", i), "flood"); last == 429 {
			break
		}
	}
	if last != 429 || !strings.Contains(body, "waiting for a decision") {
		t.Fatalf("a flood of asks ended with %d %s, want 429", last, body)
	}
	if list, _ := d.Client().Requests(ctx, id, api.RequestPending); len(list) != 16 {
		t.Fatalf("%d pending requests, want the bound (16)", len(list))
	}

	// A kill -9 of the daemon keeps the requests and the approval. The
	// refusal of other.test after its one use may file one more request
	// by itself (mode ask, asynchronously, refusals of a host being
	// reported at most once a while), before or after the list is taken.
	before, err := d.Client().Requests(ctx, "", "")
	if err != nil || len(before) < 19 {
		t.Fatalf("before a restart: %d requests, %v", len(before), err)
	}
	d.Kill9()
	d.Start()
	after, err := d.Client().Requests(ctx, "", "")
	if err != nil {
		t.Fatal(err)
	}
	kept := map[string]string{}
	for _, r := range after {
		kept[r.ID] = r.State
	}
	for _, r := range before {
		if s, ok := kept[r.ID]; !ok || s != r.State {
			t.Fatalf("after a restart request %s (%s, %s) is %q, present %v", r.ID, r.Host, r.State, s, ok)
		}
	}
	for _, r := range after[len(before):] {
		if !r.Auto || r.Sandbox != ask || r.Host != "other.test" {
			t.Fatalf("after a restart an unexpected request: %+v", r)
		}
	}
	if len(after) > 20 {
		t.Fatalf("after a restart: %d requests, want 19 or 20", len(after))
	}
	mustSay(t, curl(d, id, "http://allowed.test/"), "hello from allowed.test")
}
