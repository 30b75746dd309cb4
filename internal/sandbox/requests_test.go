package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/egress"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/runtime/fake"
)

// policyLog is an Egress that keeps the last policy applied to each
// sandbox.
type policyLog struct {
	mu   sync.Mutex
	last map[string]*api.Policy
}

func (p *policyLog) ValidatePolicy(pol *api.Policy) error { return egress.ValidatePolicy(pol) }

func (p *policyLog) SetPolicy(id string, pol *api.Policy) ([]string, error) {
	if err := egress.ValidatePolicy(pol); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last[id] = pol.Clone()
	return nil, nil
}

func (p *policyLog) grants(id string) []api.PolicyGrant {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.last[id] == nil {
		return nil
	}
	return p.last[id].Grants
}

func newRequestsTestbed(t *testing.T) (*testbed, *policyLog) {
	t.Helper()
	if images.err != nil {
		t.Fatal(images.err)
	}
	pl := &policyLog{last: map[string]*api.Policy{}}
	tb := &testbed{t: t, host: fake.NewHost(), dir: t.TempDir(), images: images.store, egress: pl}
	tb.start()
	t.Cleanup(tb.stop)
	return tb, pl
}

// TestEgressRequests: a sandbox's ask is checked, kept once per host,
// bounded; an approval reaches the egress path as a grant, for a time or
// once; a denial revokes it; all of it survives a restart of the daemon.
func TestEgressRequests(t *testing.T) {
	tb, pl := newRequestsTestbed(t)
	ctx := context.Background()
	id := tb.create().ID

	for _, bad := range []string{"", "*.example.com", "10.0.0.0/8", "https://example.com/", "a..b", "example.com:0", "example.com:99999", "-x.com", strings.Repeat("a", 300)} {
		if _, _, err := tb.m.AskEgress(ctx, id, api.RequestAsk{Host: bad}, false); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ask for %q: %v, want invalid", bad, err)
		}
	}
	for _, reason := range []string{"\x1b[2Jhidden", "bidi \u202e", string([]byte{0xff}), strings.Repeat("x", 501)} {
		if _, _, err := tb.m.AskEgress(ctx, id, api.RequestAsk{Host: "ok.example", Reason: reason}, false); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("reason %q: %v, want invalid", reason, err)
		}
	}
	r1, made, err := tb.m.AskEgress(ctx, id, api.RequestAsk{Host: "API.Example.com.", Reason: "pip install"}, false)
	if err != nil || !made || r1.Host != "api.example.com" || r1.State != api.RequestPending || r1.ID != id+".1" {
		t.Fatalf("ask: %+v made %v err %v", r1, made, err)
	}
	if again, made, err := tb.m.AskEgress(ctx, id, api.RequestAsk{Host: "api.example.com"}, true); err != nil || made || again.ID != r1.ID {
		t.Fatalf("a second ask for the host: %+v made %v err %v, want the first", again, made, err)
	}
	// Pending requests are bounded; the sandbox is told why.
	for i := 2; i <= maxPendingRequests; i++ {
		if _, _, err := tb.m.AskEgress(ctx, id, api.RequestAsk{Host: fmt.Sprintf("h%d.example", i)}, false); err != nil {
			t.Fatalf("ask %d: %v", i, err)
		}
	}
	if _, _, err := tb.m.AskEgress(ctx, id, api.RequestAsk{Host: "one-too-many.example"}, false); !errors.Is(err, errdefs.ErrTooMany) || !strings.Contains(err.Error(), "wait") {
		t.Fatalf("ask past the bound: %v, want too many", err)
	}

	// Approve for a time: the grant reaches the egress path.
	got, err := tb.m.DecideEgress(ctx, id, r1.ID, true, api.RequestDecision{DurationSeconds: 3600}, "cli (unix socket)")
	if err != nil || got.State != api.RequestApproved || got.Until == nil || got.DecidedBy != "cli (unix socket)" {
		t.Fatalf("approve: %+v %v", got, err)
	}
	if g := pl.grants(id); len(g) != 1 || g[0].Match != "api.example.com" || g[0].Request != r1.ID || g[0].Until == nil {
		t.Fatalf("grants applied: %+v", g)
	}
	if p, _ := tb.m.Policy(ctx, id); len(p.Grants) != 0 {
		t.Fatalf("the API's policy shows grants: %+v", p)
	}
	if _, err := tb.m.DecideEgress(ctx, id, id+".99", true, api.RequestDecision{}, "x"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("deciding an unknown request: %v", err)
	}
	if _, err := tb.m.DecideEgress(ctx, id, id+".2", true, api.RequestDecision{Once: true, DurationSeconds: 5}, "x"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("once and a duration: %v", err)
	}
	// Once: the grant holds until its use is reported.
	if _, err := tb.m.DecideEgress(ctx, id, id+".2", true, api.RequestDecision{Once: true}, "cli (unix socket)"); err != nil {
		t.Fatal(err)
	}
	if g := pl.grants(id); len(g) != 2 || !g[1].Once || g[1].Until != nil {
		t.Fatalf("grants after a one-use approval: %+v", g)
	}
	now := time.Now()
	tb.m.EgressGrantUsed(id, id+".2", now.Add(-10*time.Second), now.Add(-7*time.Second))
	list, _ := tb.m.EgressRequests(ctx, id)
	if list[1].State != api.RequestExpired || list[1].Used == nil {
		t.Fatalf("a used one-time approval: %+v", list[1])
	}

	// A restart keeps them, and applies the grant again.
	tb.stop()
	pl.last = map[string]*api.Policy{}
	tb.start()
	list, err = tb.m.EgressRequests(ctx, "")
	if err != nil || len(list) != maxPendingRequests || list[0].State != api.RequestApproved || list[1].State != api.RequestExpired {
		t.Fatalf("after a restart: %d requests, %v", len(list), err)
	}
	if g := pl.grants(id); len(g) != 1 || g[0].Request != r1.ID {
		t.Fatalf("grants after a restart: %+v", g)
	}
	// A denial revokes the approval.
	if got, err := tb.m.DecideEgress(ctx, id, r1.ID, false, api.RequestDecision{Note: "no"}, "cli (unix socket)"); err != nil || got.State != api.RequestDenied {
		t.Fatalf("deny: %+v %v", got, err)
	}
	if g := pl.grants(id); len(g) != 0 {
		t.Fatalf("grants after the revocation: %+v", g)
	}
	// A new number continues the sequence.
	r, _, err := tb.m.AskEgress(ctx, id, api.RequestAsk{Host: "203.0.113.7:5432"}, false)
	if err != nil || r.ID != id+".17" || r.Host != "203.0.113.7:5432" {
		t.Fatalf("ask after a restart: %+v %v", r, err)
	}
}
