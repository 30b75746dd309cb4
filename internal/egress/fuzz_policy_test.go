package egress

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/netip"
	"reflect"
	"testing"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// FuzzPolicy: a policy document, whatever its bytes, is refused as
// invalid (never another category) or accepted; an accepted one
// compiles, survives a deep copy, each of its rules is accepted alone as
// the CLI takes it, and deciding any connection, request or name against
// it does not panic and gives a reason for every allow.
func FuzzPolicy(f *testing.F) {
	f.Fuzz(func(t *testing.T, doc []byte, host string, port uint16, path string) {
		var p api.Policy
		dec := json.NewDecoder(bytes.NewReader(doc))
		dec.DisallowUnknownFields()
		if dec.Decode(&p) != nil {
			return
		}
		if err := ValidatePolicy(&p); err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("refused as %s, want invalid: %v", errdefs.Code(err), err)
			}
			return
		}
		if c := clonePolicy(&p); !reflect.DeepEqual(c, &p) {
			t.Fatalf("clone %+v differs from %+v", c, &p)
		}
		for _, r := range append(append([]api.PolicyRule(nil), p.Allow...), p.Deny...) {
			if _, err := ParseRule(r.Match, r.Methods); err != nil {
				t.Fatalf("rule %q accepted in a policy but not alone: %v", ruleString(r), err)
			}
		}
		eng := NewEngine(EngineConfig{})
		if err := eng.Set("s", &p); err != nil {
			t.Fatalf("a valid policy is refused by the engine: %v", err)
		}
		ip, _ := netip.ParseAddr(host)
		for _, a := range []DecideArgs{
			{Sandbox: "s", Kind: KindTLS, Host: host, IP: ip, Port: port},
			{Sandbox: "s", Kind: KindHTTP, TLS: true, Host: host, IP: ip, Port: port, Method: "GET", Path: path},
			{Sandbox: "s", Kind: KindHTTP, Host: host, IP: ip, Port: port, Method: "POST", Path: path},
			{Sandbox: "s", Kind: KindTCP, IP: ip, Port: port},
		} {
			d := eng.Decide(a)
			if d.Allow && d.Reason == "" {
				t.Fatalf("%+v allowed without a reason", a)
			}
		}
		eng.DecideName("s", host)
	})
}
