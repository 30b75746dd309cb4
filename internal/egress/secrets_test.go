package egress

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

func TestSecretStore(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenSecretStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	value := []byte("ghp_VerySecretValue_0123456789abcdef")
	if err := s.Create("GITHUB_TOKEN", value); err != nil {
		t.Fatal(err)
	}
	if err := s.Create("OTHER", []byte("other-value-xyz")); err != nil {
		t.Fatal(err)
	}
	if err := s.Create("GITHUB_TOKEN", []byte("again")); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("duplicate Create: %v", err)
	}
	for _, bad := range []struct{ name, value string }{{"bad name", "v"}, {"X", ""}, {"X", "a\r\nb"}, {"X", "a\x00"}} {
		if err := s.Create(bad.name, []byte(bad.value)); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Create(%q, %q) = %v", bad.name, bad.value, err)
		}
	}
	// On disk: names, never values; the key file is 0600.
	for _, f := range []string{secretKeyFile, secretDataFile} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v", f, err, st.Mode())
		}
	}
	files, _ := os.ReadDir(dir)
	for _, f := range files {
		b, _ := os.ReadFile(filepath.Join(dir, f.Name()))
		if bytes.Contains(b, value) || bytes.Contains(b, []byte("other-value")) {
			t.Fatalf("%s holds a secret value", f.Name())
		}
		if strings.HasPrefix(f.Name(), ".") {
			t.Errorf("temp file %s left behind", f.Name())
		}
	}
	data, _ := os.ReadFile(filepath.Join(dir, secretDataFile))
	if !bytes.Contains(data, []byte(`"version":1`)) || !bytes.Contains(data, []byte("GITHUB_TOKEN")) {
		t.Errorf("file: %s", data)
	}

	// Reopened: the same secrets and placeholders.
	ph := s.Placeholder("sb1", "GITHUB_TOKEN")
	s2, err := OpenSecretStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s2.Get("GITHUB_TOKEN")
	if err != nil || !bytes.Equal(got, value) {
		t.Fatalf("Get after reopen: %q %v", got, err)
	}
	if names := s2.List(); strings.Join(names, ",") != "GITHUB_TOKEN,OTHER" {
		t.Errorf("List = %v", names)
	}
	if s2.Placeholder("sb1", "GITHUB_TOKEN") != ph {
		t.Error("placeholder changed across a reopen")
	}
	if s2.Placeholder("sb2", "GITHUB_TOKEN") == ph || len(ph) != placeholderLen || !strings.HasPrefix(ph, PlaceholderPrefix) {
		t.Errorf("placeholder %q: not per sandbox or badly formed", ph)
	}
	env := s2.Placeholders("sb1", []api.SecretBinding{{Name: "GITHUB_TOKEN"}, {Name: "other"}})
	if env["PADDOCK_SECRET_GITHUB_TOKEN"] != ph || len(env) != 2 || env["PADDOCK_SECRET_OTHER"] == "" {
		t.Errorf("Placeholders = %v", env)
	}

	if err := s2.Delete("OTHER"); err != nil {
		t.Fatal(err)
	}
	if err := s2.Delete("OTHER"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second Delete: %v", err)
	}
	if _, err := s2.Get("OTHER"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get deleted: %v", err)
	}
	s3, _ := OpenSecretStore(dir)
	if names := s3.List(); len(names) != 1 {
		t.Errorf("after delete and reopen: %v", names)
	}

	// A tampered entry does not open; a key readable by others is refused.
	data, _ = os.ReadFile(filepath.Join(dir, secretDataFile))
	os.WriteFile(filepath.Join(dir, secretDataFile), bytes.Replace(data, []byte("GITHUB_TOKEN"), []byte("GITHUB_TOKEX"), 1), 0o600)
	s4, err := OpenSecretStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s4.Get("GITHUB_TOKEX"); err == nil {
		t.Error("an entry moved to another name opened")
	}
	os.Chmod(filepath.Join(dir, secretKeyFile), 0o644)
	if _, err := OpenSecretStore(dir); err == nil {
		t.Error("a world-readable key was accepted")
	}
}

// TestDerivedKey: a derived key is the same after the store is opened
// again, distinct per purpose and per store, and written nowhere.
func TestDerivedKey(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenSecretStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	a, b := s.DerivedKey("a"), s.DerivedKey("b")
	if len(a) != 32 || bytes.Equal(a, b) {
		t.Fatalf("keys for two purposes: %x %x", a, b)
	}
	again, err := OpenSecretStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again.DerivedKey("a"), a) {
		t.Error("a derived key changed when the store was opened again")
	}
	other, err := OpenSecretStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(other.DerivedKey("a"), a) {
		t.Error("two stores derive the same key")
	}
	if names := again.List(); len(names) != 0 {
		t.Errorf("deriving keys listed secrets: %v", names)
	}
}

func TestCA(t *testing.T) {
	ca, err := NewCA("sb1")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Leaf("api.example.com")
	if err != nil {
		t.Fatal(err)
	}
	again, _ := ca.Leaf("api.example.com")
	if again != leaf {
		t.Error("leaf not cached")
	}
	loaded, err := LoadCA(ca.CertPEM(), ca.KeyPEM())
	if err != nil {
		t.Fatal(err)
	}
	if !loaded.Certificate().Equal(ca.Certificate()) {
		t.Error("LoadCA gave another certificate")
	}
	pool := ca.Certificate()
	if err := leaf.Leaf.CheckSignatureFrom(pool); err != nil {
		t.Error(err)
	}
	other, _ := NewCA("sb2")
	if _, err := LoadCA(ca.CertPEM(), other.KeyPEM()); err == nil {
		t.Error("LoadCA took a key of another CA")
	}
	ip, err := ca.Leaf("203.0.113.7")
	if err != nil || len(ip.Leaf.IPAddresses) != 1 {
		t.Errorf("address leaf: %v", err)
	}
}
