package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"paddock/internal/e2b"
)

func TestE2BKey(t *testing.T) {
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte("a-daemon-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	root := newRoot(&out, &errOut)
	root.SetArgs([]string{"e2b-key", "--token-file", tokFile})
	if err := root.Execute(); err != nil {
		t.Fatalf("e2b-key: %v (%s)", err, errOut.String())
	}
	if got, want := strings.TrimSpace(out.String()), e2b.APIKey("a-daemon-token-0123456789"); got != want {
		t.Errorf("e2b-key printed %q, want %q (the key of the trimmed token)", got, want)
	}

	t.Setenv("PADDOCK_TOKEN", "")
	root = newRoot(&out, &errOut)
	root.SetArgs([]string{"e2b-key"})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "no token") {
		t.Errorf("e2b-key without a token: %v, want an error saying there is no token", err)
	}
}
