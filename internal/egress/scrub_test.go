package egress

import (
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/api"
)

// formSecret has the characters that escapes differ on.
const formSecret = "tok/EN+a=b&c<d>'e\" f_0123456789"

// echoForms maps a form's name to the value in that form, as a hostile
// bound host would echo it.
var echoForms = map[string]func(v string) string{
	"json slash and plus": func(v string) string {
		return strings.NewReplacer("/", `\/`, "+", `\u002b`, "&", `\u0026`, "<", `\u003C`, ">", `\u003e`, `"`, `\"`).Replace(v)
	},
	"json every character": func(v string) string {
		var b strings.Builder
		for _, r := range v {
			fmt.Fprintf(&b, `\u%04x`, r)
		}
		return b.String()
	},
	"html decimal": func(v string) string {
		return strings.NewReplacer("+", "&#43;", "/", "&#47;", "&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&#39;").Replace(v)
	},
	"html hex, no semicolons": func(v string) string {
		var b strings.Builder
		for _, r := range v {
			fmt.Fprintf(&b, "&#x%X", r)
		}
		return b.String()
	},
	"percent lower case": func(v string) string {
		q := url.QueryEscape(v)
		for i := 0; i+2 < len(q); i++ {
			if q[i] == '%' {
				q = q[:i+1] + strings.ToLower(q[i+1:i+3]) + q[i+3:]
			}
		}
		return q
	},
	"percent every byte": func(v string) string {
		var b strings.Builder
		for i := 0; i < len(v); i++ {
			fmt.Fprintf(&b, "%%%02x", v[i])
		}
		return b.String()
	},
	"base64 inside a blob": func(v string) string {
		return base64.StdEncoding.EncodeToString([]byte(`{"k":"` + v + `"}`))
	},
	"base64url unpadded": func(v string) string { return base64.RawURLEncoding.EncodeToString([]byte("x" + v)) },
	"hex":                func(v string) string { return hex.EncodeToString([]byte(v)) },
	"raw":                func(v string) string { return v },
}

// echoFormsHandler echoes the credential it got (Authorization, less
// "Bearer ") in the form ?form= names, in the body, or with ?in=trailer
// in a declared trailer, with ?in=undeclared in a trailer it did not
// announce.
func echoFormsHandler(w http.ResponseWriter, r *http.Request) {
	v := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	enc := echoForms[r.URL.Query().Get("form")]
	if enc == nil {
		http.Error(w, "no such form", 400)
		return
	}
	switch r.URL.Query().Get("in") {
	case "trailer":
		w.Header().Set("Trailer", "X-Echo")
		io.WriteString(w, "see the trailer\n")
		w.Header().Set("X-Echo", enc(v))
	case "undeclared":
		io.WriteString(w, "see the trailer\n")
		w.Header().Set(http.TrailerPrefix+"X-Echo", enc(v))
	default:
		io.WriteString(w, "echo: "+enc(v)+"\n")
	}
}

// TestSecretEchoForms: a bound host that echoes the injected secret in a
// trailer or in any common encoding hands the sandbox its placeholder,
// never the value; and the secret goes only to the port the binding
// names (the scheme's when it names none).
func TestSecretEchoForms(t *testing.T) {
	h := newHarness(t)
	srv := startTLS(t, nil, http.HandlerFunc(echoFormsHandler), "api.example.com")
	other := startTLS(t, nil, http.HandlerFunc(echoFormsHandler), "api.example.com")
	dst, otherDst := serverAddr(t, srv), serverAddr(t, other)
	if err := h.store.Create("TOKEN", []byte(formSecret)); err != nil {
		t.Fatal(err)
	}
	h.setPolicy("sb1", &api.Policy{
		Allow: mustRules(t, "api.example.com"),
		Secrets: []api.SecretBinding{{Name: "TOKEN", Hosts: []string{fmt.Sprintf("api.example.com:%d", dst.Port())},
			Inject: api.SecretInjection{Header: "Authorization", Format: "Bearer %s"}}},
	})
	ph := h.store.Placeholder("sb1", "TOKEN")
	get := func(t *testing.T, dst netip.AddrPort, target, auth string) string {
		t.Helper()
		req := "GET " + target + " HTTP/1.1\r\nHost: api.example.com\r\nConnection: close\r\n"
		if auth != "" {
			req += "Authorization: " + auth + "\r\n"
		}
		return rawTLSAll(t, h, "api.example.com", dst, req+"\r\n")
	}
	for name, enc := range echoForms {
		for _, in := range []string{"body", "trailer", "undeclared"} {
			t.Run(name+" in "+in, func(t *testing.T) {
				raw := get(t, dst, "/?form="+url.QueryEscape(name)+"&in="+in, "")
				if !strings.HasPrefix(raw, "HTTP/1.1 200") {
					t.Fatalf("%q", raw)
				}
				if e := enc(formSecret); strings.Contains(raw, e) || strings.Contains(raw, formSecret) || strings.Contains(raw, formSecret[4:20]) {
					t.Fatalf("the secret reached the sandbox as %q:\n%s", e, raw)
				}
			})
		}
	}
	t.Run("another port of the bound host", func(t *testing.T) {
		raw := get(t, otherDst, "/?form=raw", "")
		if !strings.HasPrefix(raw, "HTTP/1.1 200") || strings.Contains(raw, formSecret) || !strings.Contains(raw, "echo: \n") {
			t.Fatalf("a request to port %d got the secret bound to port %d:\n%s", otherDst.Port(), dst.Port(), raw)
		}
		if raw := get(t, otherDst, "/?form=raw", "Bearer "+ph); !strings.HasPrefix(raw, "HTTP/1.1 403") || strings.Contains(raw, formSecret) {
			t.Fatalf("the placeholder to another port was not refused:\n%s", raw)
		}
	})
}

// rawTLSAll sends req over TLS through the proxy and returns every byte
// of the answer, as the sandbox reads it (trailers included).
func rawTLSAll(t *testing.T, h *harness, sni string, dst netip.AddrPort, req string) string {
	t.Helper()
	tc := sendTLS(t, h, sni, dst, req)
	defer tc.Close()
	b, err := io.ReadAll(tc)
	if err != nil && len(b) == 0 {
		t.Fatalf("reading the answer: %v", err)
	}
	return string(b)
}
