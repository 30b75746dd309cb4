package router

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/server"
)

// TestStreamAfterBody: a node that answers a request as soon as it has
// read its body, with a stream, has the whole stream passed on. The
// Transport used to read on for the client's body's end after the node
// had it; the server, answering meanwhile, closed that body under it, and
// the failed read cut the node's connection and the stream with it.
func TestStreamAfterBody(t *testing.T) {
	const size = 4 << 20
	chunk := make([]byte, 64<<10)
	node := server.RequireToken(nodeToken, quiet, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			return
		}
		w.WriteHeader(http.StatusOK)
		for sent := 0; sent < size; sent += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	nodeAddr := serve(t, node, 0, nil)
	rt := New(Config{NodeTokens: tokens(t, nodeToken), Log: quiet})
	rt.SetNodes([]api.Node{{Name: "n1", Tag: "a", Address: "http://" + nodeAddr, State: api.NodeReady}})
	gwAddr := serve(t, rt.Handler(tokens(t, clientToken)), 0, nil)

	for i := range 100 {
		req, _ := http.NewRequest("POST", "http://"+gwAddr+"/v1/sandboxes/a1234/exec", strings.NewReader(`{"cmd":["zeros"]}`))
		req.Header.Set("Authorization", "Bearer "+clientToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var head [512]byte
		k, _ := io.ReadFull(resp.Body, head[:])
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("stream %d: %d %q", i, resp.StatusCode, head[:k])
		}
		if n += int64(k); err != nil || n != size {
			t.Fatalf("stream %d: %d of %d bytes, %v", i, n, size, err)
		}
	}
}
