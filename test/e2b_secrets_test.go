package test

import (
	"context"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"
)

// TestE2BHeaderSecretsSwept checks that the secrets E2B's header
// transforms become live as long as something names them: shared by two
// sandboxes with the same rule, gone when a network update replaces the
// rule, when the last sandbox naming one is killed, and when a sandbox
// ends without the facade (the native API).
func TestE2BHeaderSecretsSwept(t *testing.T) {
	t.Parallel()
	e := startE2BDaemon(t)
	ctx := context.Background()
	secrets := func() []string {
		t.Helper()
		all, err := e.Client().Secrets(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, s := range all {
			if strings.HasPrefix(s.Name, "e2b_") {
				out = append(out, s.Name)
			}
		}
		sort.Strings(out)
		return out
	}
	waitSecrets := func(what string, n int) []string {
		t.Helper()
		var got []string
		if !waitFor(30*time.Second, 100*time.Millisecond, func() bool { got = secrets(); return len(got) == n }) {
			t.Fatalf("%s: header secrets %v, want %d", what, got, n)
		}
		return got
	}
	rule := func(value string) string {
		return `{"allowOut":["api.example.com"],"rules":{"api.example.com":[{"transform":{"headers":{"Authorization":"Bearer ` + value + `"}}}]}}`
	}
	create := func(network string) string {
		t.Helper()
		ans := e2bCall(t, e, "POST", "/sandboxes", `{"network":`+network+`}`)
		if ans.status != http.StatusCreated {
			t.Fatalf("create: %d %s", ans.status, ans.body)
		}
		return jsonField(t, ans.body, "sandboxID")
	}

	a := create(rule("one"))
	b := create(rule("one"))
	first := waitSecrets("two sandboxes, one rule", 1)

	// a's rule replaced: a new secret; the old one stays, b names it.
	if ans := e2bCall(t, e, "PUT", "/sandboxes/"+a+"/network", rule("two")); ans.status != http.StatusNoContent {
		t.Fatalf("updateNetwork: %d %s", ans.status, ans.body)
	}
	both := waitSecrets("after a's update", 2)
	// b's replaced too: the first is named by nothing.
	if ans := e2bCall(t, e, "PUT", "/sandboxes/"+b+"/network", `{"allowOut":["api.example.com"]}`); ans.status != http.StatusNoContent {
		t.Fatalf("updateNetwork: %d %s", ans.status, ans.body)
	}
	left := waitSecrets("after b's update", 1)
	if left[0] == first[0] || (left[0] != both[0] && left[0] != both[1]) {
		t.Fatalf("kept %v of %v, want the one a names", left, both)
	}
	// Killed through the facade: gone.
	if ans := e2bCall(t, e, "DELETE", "/sandboxes/"+a, ""); ans.status != http.StatusNoContent {
		t.Fatalf("kill: %d %s", ans.status, ans.body)
	}
	waitSecrets("after a's kill", 0)

	// Removed through the native API: gone at the next periodic sweep.
	c := create(rule("three"))
	waitSecrets("a third rule", 1)
	if err := e.Client().Delete(ctx, c, true); err != nil {
		t.Fatal(err)
	}
	waitSecrets("after a native removal", 0)
	if err := e.Client().Delete(ctx, b, true); err != nil {
		t.Fatal(err)
	}
}
