package egress

import (
	"errors"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// TestEngineGrants: a grant allows its host as an allow rule would,
// named after its request; deny rules still win; it ends at its time,
// and a grant for one use ends OnceGrace after its first use, which is
// reported once.
func TestEngineGrants(t *testing.T) {
	var used atomic.Int32
	usedAt := make(chan time.Time, 4)
	eng := NewEngine(EngineConfig{GrantUsed: func(id, request string, at, until time.Time) {
		if id != "s" || request != "s.2" || until.Sub(at) != OnceGrace {
			t.Errorf("GrantUsed(%s, %s, %s, %s)", id, request, at, until)
		}
		used.Add(1)
		usedAt <- at
	}})
	tls := func(host string) DecideArgs { return DecideArgs{Sandbox: "s", Kind: KindTLS, Host: host, Port: 443} }
	soon := time.Now().Add(300 * time.Millisecond)
	err := eng.Set("s", &api.Policy{
		Deny: mustRules(t, "denied.com"),
		Grants: []api.PolicyGrant{
			{Request: "s.1", Match: "timed.com", Until: &soon},
			{Request: "s.2", Match: "once.com", Once: true},
			{Request: "s.3", Match: "denied.com"},
			{Request: "s.4", Match: "203.0.113.7:5432"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if d := eng.Decide(tls("timed.com")); !d.Allow || d.Rule != "request:s.1" {
		t.Fatalf("a timed grant: %+v", d)
	}
	if d := eng.DecideName("s", "timed.com"); !d.Allow {
		t.Fatalf("the resolver refuses a granted name: %+v", d)
	}
	if d := eng.Decide(tls("denied.com")); d.Allow {
		t.Fatalf("a grant beat a deny rule: %+v", d)
	}
	if d := eng.Decide(DecideArgs{Sandbox: "s", Kind: KindTCP, IP: netip.MustParseAddr("203.0.113.7"), Port: 5432}); !d.Allow {
		t.Fatalf("an address grant: %+v", d)
	}
	// One use: allowed, reported once, then allowed only for OnceGrace.
	for range 3 {
		if d := eng.Decide(tls("once.com")); !d.Allow || d.Rule != "request:s.2" {
			t.Fatalf("a one-use grant: %+v", d)
		}
	}
	at := <-usedAt
	time.Sleep(50 * time.Millisecond)
	if n := used.Load(); n != 1 {
		t.Fatalf("GrantUsed called %d times", n)
	}
	p, _ := eng.Policy("s")
	if g := p.Grants[1]; g.Until == nil || !g.Until.Equal(at.Add(OnceGrace)) {
		t.Fatalf("the used grant: %+v", g)
	}
	// The timed grant ends.
	time.Sleep(time.Until(soon) + 10*time.Millisecond)
	if d := eng.Decide(tls("timed.com")); d.Allow {
		t.Fatalf("an ended grant still allows: %+v", d)
	}
	if p, _ := eng.Policy("s"); len(p.Grants) != 3 {
		t.Fatalf("the ended grant stays in the policy: %+v", p.Grants)
	}
	if d := eng.Decide(tls("once.com")); !d.Allow {
		t.Fatal("the one-use grant ended before its grace")
	}

	for _, bad := range []*api.Policy{
		{Mode: "maybe"},
		{Grants: []api.PolicyGrant{{Match: "a.com"}}},
		{Grants: []api.PolicyGrant{{Request: "r", Match: "*."}}},
	} {
		if err := ValidatePolicy(bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%+v: %v, want invalid", bad, err)
		}
	}
	if eng.Set("m", &api.Policy{Mode: api.PolicyModeAsk}) != nil || eng.Mode("m") != api.PolicyModeAsk || eng.Mode("none") != "" {
		t.Fatal("mode")
	}
}
