package clustertls

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// swapSecret replaces the file name under dir as kubelet updates a
// mounted Secret: a new directory, then one rename of the ..data link.
func swapSecret(t *testing.T, dir, name, content string) {
	t.Helper()
	gen, err := os.MkdirTemp(dir, "..gen-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(gen, name), []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(gen), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(dir, name)); err != nil {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestTokensParse(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		want       []string // nil: an error
	}{
		{"one", "token-0123456789abcdef\n", []string{"token-0123456789abcdef"}},
		{"two, blank lines, CRLF", "\n old-0123456789abcdef \r\n\r\nnew-0123456789abcdef", []string{"old-0123456789abcdef", "new-0123456789abcdef"}},
		{"empty", "\n  \n", nil},
		{"short", "token-0123456789abcdef\nshort\n", nil},
		{"space inside", "token-0123 456789abcdef\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set, err := parseTokens(tc.file)
			if tc.want == nil {
				if err == nil {
					t.Fatalf("parsed %q: %v", tc.file, set.all)
				}
				return
			}
			if err != nil || strings.Join(set.all, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("%q: %v %v, want %v", tc.file, set.all, err, tc.want)
			}
		})
	}
}

// TestTokensRotate rotates a token file mounted as a Secret is: the
// three steps of the rotation, then a file that does not load.
func TestTokensRotate(t *testing.T) {
	dir := t.TempDir()
	const old, new = "old-token-0123456789", "new-token-0123456789"
	swapSecret(t, dir, "node.token", old+"\n")
	tok, err := LoadTokens(filepath.Join(dir, "node.token"), quiet)
	if err != nil {
		t.Fatal(err)
	}
	check := func(present string, accepts, refuses []string) {
		t.Helper()
		deadline := time.Now().Add(3 * recheck)
		for tok.Present() != present && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if tok.Present() != present || tok.Authorization() != "Bearer "+present {
			t.Fatalf("presents %q (%q), want %q", tok.Present(), tok.Authorization(), present)
		}
		for _, a := range accepts {
			if !tok.Accepts("Bearer " + a) {
				t.Fatalf("refuses %q; holds %v", a, tok.All())
			}
		}
		for _, r := range refuses {
			if tok.Accepts("Bearer "+r) || tok.Accepts(r) {
				t.Fatalf("accepts %q; holds %v", r, tok.All())
			}
		}
	}
	check(old, []string{old}, []string{new, "", "Bearer "})
	swapSecret(t, dir, "node.token", old+"\n"+new+"\n")
	time.Sleep(recheck)
	check(old, []string{old, new}, nil)
	swapSecret(t, dir, "node.token", new+"\n"+old+"\n")
	check(new, []string{old, new}, nil)
	swapSecret(t, dir, "node.token", new+"\n")
	time.Sleep(recheck)
	check(new, []string{new}, []string{old})
	// A file that does not load keeps the last set.
	swapSecret(t, dir, "node.token", "short\n")
	time.Sleep(recheck + 100*time.Millisecond)
	check(new, []string{new}, []string{"short"})
}

func TestStaticTokens(t *testing.T) {
	tok, err := StaticTokens("a-token-0123456789", "b-token-0123456789")
	if err != nil {
		t.Fatal(err)
	}
	if tok.Present() != "a-token-0123456789" || !tok.Accepts("Bearer b-token-0123456789") || tok.Accepts("Bearer c-token-0123456789") {
		t.Fatalf("static set: %v", tok.All())
	}
	if _, err := StaticTokens("short"); err == nil {
		t.Fatal("a short static token loaded")
	}
}
