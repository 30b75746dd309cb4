package client

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"
)

func TestFileMode(t *testing.T) {
	for _, m := range []os.FileMode{0o644, 0o755 | os.ModeSetuid, 0o2750&0o777 | os.ModeSetgid, 0o777 | os.ModeSticky} {
		if got := ModeOf(m).OS(); got != m {
			t.Errorf("ModeOf(%v).OS() = %v", m, got)
		}
	}
	b, _ := json.Marshal(FileInfo{Mode: 0o4755})
	if !strings.Contains(string(b), `"mode":"4755"`) {
		t.Errorf("mode marshals as %s", b)
	}
	var fi FileInfo
	if err := json.Unmarshal([]byte(`{"mode":"0640"}`), &fi); err != nil || fi.Mode != 0o640 {
		t.Errorf("unmarshal: %v %v", fi.Mode, err)
	}
	if err := json.Unmarshal([]byte(`{"mode":"999"}`), &fi); err == nil {
		t.Error("a bad mode unmarshalled")
	}
}

// fakeDaemon serves canned answers on a unix socket.
func fakeDaemon(t *testing.T, h http.HandlerFunc) *Client {
	t.Helper()
	sock := t.TempDir() + "/d.sock"
	srv := httptest.NewUnstartedServer(h)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	c, err := New("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestFileErrorsAndStreams(t *testing.T) {
	c := fakeDaemon(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/sandboxes/sb/files/stat":
			if r.URL.Query().Get("path") == "/missing" {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(404)
				io.WriteString(w, `{"code":"not_found","message":"not found: /missing: no such file or directory"}`)
				return
			}
			io.WriteString(w, `{"name":"f","path":"/f","type":"file","size":3,"mode":"0644","uid":0,"gid":0,"mtime":"2024-01-01T00:00:00Z"}`)
		case "/v1/sandboxes/gone/files/stat":
			w.WriteHeader(404)
			io.WriteString(w, `{"code":"not_found","message":"not found: sandbox \"gone\""}`)
		case "/v1/sandboxes/sb/files":
			if r.Method == http.MethodPut {
				b, _ := io.ReadAll(r.Body)
				if string(b) != "payload" || r.URL.Query().Get("mode") != "0600" || r.URL.Query().Get("owner") != "alice" {
					w.WriteHeader(400)
					io.WriteString(w, `{"code":"invalid_argument","message":"bad"}`)
					return
				}
				io.WriteString(w, `{"name":"f","path":"/f","type":"file","size":7,"mode":"0600"}`)
				return
			}
			// A body cut short: the client must see an error.
			w.Header().Set("Content-Length", "100")
			io.WriteString(w, "short")
			http.NewResponseController(w).Flush()
			panic(http.ErrAbortHandler)
		case "/v1/sandboxes/sb/files/list":
			io.WriteString(w, `[{"name":"a","path":"/d/a","type":"file","mode":"0644"},{"name":"b","path":"/d/b","type":"dir","mode":"0755"}]`)
		case "/v1/sandboxes/sb/files/watch":
			w.Header().Set("Content-Type", "application/x-ndjson")
			io.WriteString(w, `{"type":"create","path":"/d/x","time":"2024-01-01T00:00:00Z"}`+"\n")
			io.WriteString(w, `{"type":"end","reason":"the watched directory was removed"}`+"\n")
		}
	})
	ctx := t.Context()
	if fi, err := c.Stat(ctx, "sb", "/f"); err != nil || fi.Size != 3 || fi.Mode != 0o644 {
		t.Errorf("stat = %+v, %v", fi, err)
	}
	_, err := c.Stat(ctx, "sb", "/missing")
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "/missing") {
		t.Errorf("stat missing: %v", err)
	}
	if ok, err := c.Exists(ctx, "sb", "/missing"); ok || err != nil {
		t.Errorf("exists missing = %v, %v", ok, err)
	}
	if ok, err := c.Exists(ctx, "gone", "/f"); ok || !errors.Is(err, ErrNotFound) {
		t.Errorf("exists in a missing sandbox = %v, %v", ok, err)
	}
	if fi, err := c.WriteFile(ctx, "sb", "/f", strings.NewReader("payload"), WriteOptions{Mode: 0o600, Owner: "alice"}); err != nil || fi.Size != 7 {
		t.Errorf("write = %+v, %v", fi, err)
	}
	rc, err := c.ReadFile(ctx, "sb", "/f")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(rc); err == nil {
		t.Error("a cut read gave no error")
	}
	rc.Close()
	entries, err := c.ListFiles(ctx, "sb", "/d", 2)
	if err != nil || len(entries) != 2 || !entries[1].IsDir() {
		t.Errorf("list = %+v, %v", entries, err)
	}
	w, err := c.Watch(ctx, "sb", "/d", true)
	if err != nil {
		t.Fatal(err)
	}
	var got []FileEvent
	timeout := time.After(5 * time.Second)
	for done := false; !done; {
		select {
		case ev, ok := <-w.Events:
			if !ok {
				done = true
				break
			}
			got = append(got, ev)
		case <-timeout:
			t.Fatal("the watch did not end")
		}
	}
	if len(got) != 1 || got[0].Type != EventCreate || !errors.Is(w.Err(), ErrNotFound) {
		t.Errorf("watch gave %+v, %v", got, w.Err())
	}
}
