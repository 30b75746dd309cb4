package router

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/e2b"
)

// TestE2BSignedCache: a signed URL without E2b-Sandbox-Id asks every
// node once; fetched again it goes to the sandbox's node alone; when
// that node answers 404 (the sandbox is gone) the entry is dropped and
// the next fetch asks every node again. Real nodes (httptest servers)
// count what they are asked.
func TestE2BSignedCache(t *testing.T) {
	type counts struct{ signer, files atomic.Int32 }
	var gone atomic.Bool
	node := func(name, knows string, c *counts) *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case e2b.SignerPath:
				c.signer.Add(1)
				if r.URL.Query().Get("signature") == "v1_sig" && knows != "" {
					fmt.Fprintf(w, `{"sandboxID":%q}`, knows)
					return
				}
				w.WriteHeader(http.StatusNotFound)
			case "/files":
				c.files.Add(1)
				if gone.Load() {
					w.WriteHeader(http.StatusNotFound)
					return
				}
				io.WriteString(w, name+" "+r.Header.Get("E2b-Sandbox-Id"))
			default:
				w.WriteHeader(http.StatusTeapot)
			}
		}))
		t.Cleanup(s.Close)
		return s
	}
	var ca, cb counts
	a, b := node("a", "", &ca), node("b", "b5678", &cb)
	rt := New(Config{NodeTokens: tokens(t, nodeToken), Log: quiet})
	rt.SetNodes([]api.Node{
		{Name: "na", Tag: "a", Address: "http://127.0.0.1:1", E2BAddress: a.URL, State: api.NodeReady},
		{Name: "nb", Tag: "b", Address: "http://127.0.0.1:1", E2BAddress: b.URL, State: api.NodeReady},
	})
	gw := httptest.NewServer(rt.E2BHandler(tokens(t, clientToken)))
	t.Cleanup(gw.Close)
	exp := strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)
	fetch := func(sig string) (int, string) {
		t.Helper()
		resp, err := http.Get(gw.URL + "/files?path=x&signature=" + sig + "&signature_expiration=" + exp)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	// A fan-out ends at the first node that knows the signature and
	// cancels the others' requests, which may arrive later or never:
	// node b's count (b is asked in every fan-out) says whether the
	// nodes were asked.
	asked := func() (int32, int32, int32) {
		return ca.signer.Load(), cb.signer.Load(), ca.files.Load() + cb.files.Load()
	}
	step := func(what, sig string, code int, body string, fanout bool, files int32) {
		t.Helper()
		a0, b0, f0 := asked()
		c, got := fetch(sig)
		a1, b1, f1 := asked()
		want := int32(0)
		if fanout {
			want = 1
		}
		if c != code || (body != "" && got != body) || b1-b0 != want || f1-f0 != files {
			t.Errorf("%s: %d %q; nodes a and b asked for the signer %d and %d times, for the file %d; want %d %q, fan-out %v, %d",
				what, c, got, a1-a0, b1-b0, f1-f0, code, body, fanout, files)
		}
	}
	step("first fetch", "v1_sig", 200, "b b5678", true, 1)
	step("second fetch", "v1_sig", 200, "b b5678", false, 1)
	step("third fetch", "v1_sig", 200, "b b5678", false, 1)
	gone.Store(true)
	step("the sandbox gone", "v1_sig", 404, "", false, 1)
	step("after a 404, asked again", "v1_sig", 404, "", true, 1)
	gone.Store(false)
	step("an unknown signature", "v1_other", 401, "", true, 0)
	step("is not remembered", "v1_other", 401, "", true, 0)
}

func TestSignersBoundAndExpiry(t *testing.T) {
	var s signers
	now := time.Unix(1000, 0)
	s.put("x", "a1", now, time.Time{})
	if s.get("x", now.Add(signerTTL-time.Second)) != "a1" || s.get("x", now.Add(signerTTL)) != "" {
		t.Error("an entry lasts signerTTL")
	}
	s.put("y", "a1", now, now.Add(time.Minute))
	if s.get("y", now.Add(59*time.Second)) != "a1" || s.get("y", now.Add(time.Minute)) != "" {
		t.Error("an entry ends with its signature")
	}
	s.put("z", "a1", now, now.Add(-time.Second))
	if s.get("z", now) != "" {
		t.Error("an expired signature is not remembered")
	}
	for i := range maxSigners + 100 {
		s.put(strconv.Itoa(i), "a1", now, time.Time{})
	}
	if n := len(s.m); n > maxSigners {
		t.Errorf("%d entries, bound %d", n, maxSigners)
	}
	s.put("w", "a1", now, time.Time{})
	s.drop("w")
	if s.get("w", now) != "" {
		t.Error("a dropped entry is gone")
	}
}
