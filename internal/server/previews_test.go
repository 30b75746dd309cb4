package server

import (
	"testing"

	"github.com/paddock-dev/paddock/api"
)

func TestPreviewHost(t *testing.T) {
	s := &Server{}
	if err := s.SetPreviewDomain("https://Previews.Example.COM."); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		host string
		pid  string
		port int
		ok   bool
	}{
		{"3000-abc123-0011223344556677.previews.example.com", "abc123.0011223344556677", 3000, true},
		{"3000-ABC123-0011223344556677.Previews.Example.com.:8443", "abc123.0011223344556677", 3000, true},
		{"80-my-box-00aa.previews.example.com", "my-box.00aa", 80, true},
		{"previews.example.com", "", 0, false},
		{"3000-abc.previews.example.com", "", 0, false},
		{"03000-abc-00.previews.example.com", "", 0, false},
		{"70000-abc-00.previews.example.com", "", 0, false},
		{"x-abc-00.previews.example.com", "", 0, false},
		{"3000-abc-00.evilpreviews.example.com", "", 0, false},
		{"3000-abc-00.previews.example.com.evil.test", "", 0, false},
		{"", "", 0, false},
		{"[::1]:80", "", 0, false},
	} {
		pid, port, ok := s.previewHost(tc.host)
		if pid != tc.pid || port != tc.port || ok != tc.ok {
			t.Errorf("previewHost(%q) = %q, %d, %v; want %q, %d, %v", tc.host, pid, port, ok, tc.pid, tc.port, tc.ok)
		}
	}
	for _, bad := range []string{"ftp://x.example", "https://10.0.0.1", "https://example.com/sub", "https://user@example.com", "nodots"} {
		if err := (&Server{}).SetPreviewDomain(bad); err == nil {
			t.Errorf("SetPreviewDomain(%q) took it", bad)
		}
	}
	if got := s.previewURL(api.Preview{ID: "abc123.0011223344556677", Port: 3000}); got != "https://3000-abc123-0011223344556677.previews.example.com/" {
		t.Errorf("previewURL = %q", got)
	}
}
