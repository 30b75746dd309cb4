package e2b

import (
	"errors"
	"maps"
	"net/http"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

func TestMetadataHeaders(t *testing.T) {
	h := http.Header{}
	h.Set("X-Metadata-Owner", "me")
	h.Set("x-metadata-x-tag", "v 1")
	h.Set("X-Other", "ignored")
	got, err := metadataHeaders(h)
	want := map[string]string{"user.e2b.owner": "me", "user.e2b.x-tag": "v 1"}
	if err != nil || !maps.Equal(got, want) {
		t.Fatalf("metadataHeaders = %v, %v; want %v", got, err, want)
	}
	if m := fileMetadata(map[string]string{"user.e2b.owner": "me", "user.other": "x", "user.e2b.": "y"}); !maps.Equal(m, map[string]string{"owner": "me"}) {
		t.Fatalf("fileMetadata = %v", m)
	}
	if m, err := metadataHeaders(http.Header{}); m != nil || err != nil {
		t.Fatalf("no headers: %v %v", m, err)
	}
	for name, bad := range map[string]http.Header{
		"value not ASCII": {"X-Metadata-K": {"caf\u00e9"}},
		"value with NL":   {"X-Metadata-K": {"a\nb"}},
		"value too long":  {"X-Metadata-K": {strings.Repeat("v", maxMetadataValue+1)}},
		"key not a token": {"X-Metadata-K(": {"v"}},
		"empty key":       {"X-Metadata-": {"v"}},
	} {
		if _, err := metadataHeaders(bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: %v, want invalid", name, err)
		}
	}
	many := http.Header{}
	for i := range maxMetadataKeys + 1 {
		many.Set("X-Metadata-K"+strings.Repeat("x", i), "v")
	}
	if _, err := metadataHeaders(many); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("too many keys: %v", err)
	}
}
