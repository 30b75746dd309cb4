package sandbox

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

func TestPullTarget(t *testing.T) {
	pin := "sha256:" + strings.Repeat("ab", 32)
	for _, tc := range []struct {
		name     string
		req      api.PullRequest
		ref, tag string
		badField string
	}{
		{"tag", api.PullRequest{Reference: "127.0.0.1:5000/app:v1"}, "127.0.0.1:5000/app:v1", "", ""},
		{"pinned tag", api.PullRequest{Reference: "127.0.0.1:5000/team/app:v1", Digest: pin}, "127.0.0.1:5000/team/app@" + pin, "127.0.0.1:5000/team/app:v1", ""},
		{"pinned bare name", api.PullRequest{Reference: "localhost:5000/app", Digest: pin}, "localhost:5000/app@" + pin, "localhost:5000/app:latest", ""},
		{"pin equal to the reference's", api.PullRequest{Reference: "r.example/app@" + pin, Digest: pin}, "r.example/app@" + pin, "", ""},
		{"pin differing from the reference's", api.PullRequest{Reference: "r.example/app@sha256:" + strings.Repeat("cd", 32), Digest: pin}, "", "", "digest"},
		{"malformed pin", api.PullRequest{Reference: "r.example/app", Digest: "sha256:xyz"}, "", "", "digest"},
		{"no reference", api.PullRequest{}, "", "", "reference"},
		{"bad reference", api.PullRequest{Reference: "r.example/APP!:v1", Digest: pin}, "", "", "reference"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ref, tag, err := pullTarget(tc.req)
			if tc.badField != "" {
				if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.badField) {
					t.Fatalf("err = %v, want invalid %s", err, tc.badField)
				}
				return
			}
			if err != nil || ref != tc.ref || tag != tc.tag {
				t.Fatalf("pullTarget = %q, %q, %v; want %q, %q", ref, tag, err, tc.ref, tc.tag)
			}
		})
	}
}

func TestLoopbackRegistry(t *testing.T) {
	for ref, want := range map[string]bool{
		"127.0.0.1:5000/app":       true,
		"127.3.4.5/app:v1":         true,
		"[::1]:5000/app":           true,
		"localhost:5000/app":       true,
		"localhost/app":            true,
		"10.0.0.1:5000/app":        false,
		"registry.example/app":     false,
		"localhost.example/app":    false,
		"127.0.0.1.nip.io/app:v1":  false,
		"app:v1":                   false,
		"0.0.0.0:5000/app":         false,
		"[::ffff:127.0.0.1]/app":   true,
		"169.254.169.254/metadata": false,
	} {
		if _, got := loopbackRegistry(ref); got != want {
			t.Errorf("loopbackRegistry(%q) = %v, want %v", ref, got, want)
		}
	}
}

// roundTripFunc answers requests that get past the guard.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestPullTransportKeepsPlainHTTPOnLoopback(t *testing.T) {
	var reached []string
	var got int64
	tr := &pullTransport{
		next: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			reached = append(reached, r.URL.String())
			return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("12345"))}, nil
		}),
		report:           func(n int64) { got = n },
		httpLoopbackOnly: true,
	}
	for url, allowed := range map[string]bool{
		"http://127.0.0.1:5000/v2/":              true,
		"https://blobs.example/x":                true,
		"http://10.0.0.1/v2/app/blobs/sha256:00": false,
		"http://169.254.169.254/latest":          false,
	} {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		resp, err := tr.RoundTrip(req)
		if allowed != (err == nil) {
			t.Errorf("%s: err = %v, want allowed=%v", url, err, allowed)
			continue
		}
		if err == nil {
			io.ReadAll(resp.Body)
		} else if !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: err = %v, want invalid", url, err)
		}
	}
	if len(reached) != 2 || got != 10 {
		t.Fatalf("reached %v, counted %d bytes", reached, got)
	}
}
