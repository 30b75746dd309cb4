package server

import (
	"context"
	"net/http/httptest"
	"testing"
)

// TestDecider: the audit names the client as it called itself (checked)
// and the credential it used; a credential a gateway forwarded counts
// only beside a token, and only in TokenCredential's form.
func TestDecider(t *testing.T) {
	node := TokenCredential("Bearer node-token")
	for _, tc := range []struct {
		name, client, cred, forwarded, want string
	}{
		{"unix socket", "cli", "unix socket", "", "cli (unix socket)"},
		{"token", "console", byTokenCred, "", "console (" + node + ")"},
		{"through a gateway", "cli", byTokenCred, "token 0a1b2c3d", "cli (token 0a1b2c3d at a gateway, which called with " + node + ")"},
		{"forwarded on the socket", "cli", "unix socket", "token 0a1b2c3d", "cli (unix socket)"},
		{"forwarded, malformed", "cli", byTokenCred, "token 0A1B2C3D) (x", "cli (" + node + ")"},
		{"forwarded, not a token", "cli", byTokenCred, "root", "cli (" + node + ")"},
		{"a hostile name", "cli (root)", byTokenCred, "", "api (" + node + ")"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/", nil)
			r.Header.Set("Authorization", "Bearer node-token")
			r.Header.Set(ClientHeader, tc.client)
			if tc.forwarded != "" {
				r.Header.Set(ForwardedCredentialHeader, tc.forwarded)
			}
			r = r.WithContext(context.WithValue(r.Context(), credentialKey{}, tc.cred))
			if got := decider(r); got != tc.want {
				t.Errorf("decider: %q; want %q", got, tc.want)
			}
		})
	}
}
