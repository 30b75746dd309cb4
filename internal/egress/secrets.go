package egress

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/durable"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// SecretStore keeps secrets encrypted at rest in a state directory:
//
//	secrets.key    32 random bytes, mode 0600, made on first open
//	secrets.json   {"version":1,"secrets":{"NAME":{"nonce":…,"sealed":…,"created":…}}}
//
// Each value is sealed with AES-256-GCM under the key, with the name as
// additional data (an entry moved to another name does not open). Names
// are visible in the file; values are not. Writes are atomic (temp file,
// fsync, rename, fsync of the directory).
type SecretStore struct {
	dir            string
	key            []byte
	aead           cipher.AEAD
	placeholderKey []byte

	mu      sync.Mutex
	secrets map[string]sealedSecret
}

const (
	secretKeyFile   = "secrets.key"
	secretDataFile  = "secrets.json"
	secretsVersion  = 1
	maxSecretLength = 64 << 10
)

type secretsFile struct {
	Version int                     `json:"version"`
	Secrets map[string]sealedSecret `json:"secrets"`
}

type sealedSecret struct {
	Nonce   []byte    `json:"nonce"`
	Sealed  []byte    `json:"sealed"`
	Created time.Time `json:"created"`
}

// OpenSecretStore opens (or creates) the store in dir.
func OpenSecretStore(dir string) (*SecretStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating secret dir: %w", err)
	}
	key, err := loadOrCreateKey(filepath.Join(dir, secretKeyFile))
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte("paddock placeholder v1"))
	s := &SecretStore{dir: dir, key: key, aead: aead, placeholderKey: m.Sum(nil), secrets: map[string]sealedSecret{}}
	b, err := os.ReadFile(filepath.Join(dir, secretDataFile))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return s, nil
	case err != nil:
		return nil, fmt.Errorf("reading secrets: %w", err)
	}
	var f secretsFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("reading secrets: %w", err)
	}
	if f.Version != secretsVersion {
		return nil, fmt.Errorf("reading secrets: file version %d, this paddock reads %d", f.Version, secretsVersion)
	}
	if f.Secrets != nil {
		s.secrets = f.Secrets
	}
	return s, nil
}

func loadOrCreateKey(path string) ([]byte, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	err := durable.Create(path, key, 0o600)
	if err == nil {
		return key, nil
	}
	if !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("creating secret key: %w", err)
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("reading secret key: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("secret key %s is readable by others (mode %v); want 0600", path, st.Mode().Perm())
	}
	key, err = os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading secret key: %w", err)
	}
	if len(key) != 32 {
		return nil, fmt.Errorf("secret key %s: %d bytes, want 32", path, len(key))
	}
	return key, nil
}

// Create stores a new secret. A value may not hold CR, LF or NUL (no
// credential does, and they would let a value split a header).
func (s *SecretStore) Create(name string, value []byte) error {
	if err := validSecretName(name); err != nil {
		return errdefs.Invalid("name", "%v", err)
	}
	if len(value) == 0 || len(value) > maxSecretLength {
		return errdefs.Invalid("value", "must hold 1 to %d bytes", maxSecretLength)
	}
	if strings.ContainsAny(string(value), "\r\n\x00") {
		return errdefs.Invalid("value", "may not hold CR, LF or NUL")
	}
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return err
	}
	e := sealedSecret{Nonce: nonce, Sealed: s.aead.Seal(nil, nonce, value, []byte(name)), Created: time.Now().UTC()}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.secrets[name]; ok {
		return errdefs.Conflict("secret %q exists; delete it first", name)
	}
	s.secrets[name] = e
	if err := s.save(); err != nil {
		delete(s.secrets, name)
		return err
	}
	return nil
}

// List returns the names of the secrets, sorted.
func (s *SecretStore) List() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, 0, len(s.secrets))
	for n := range s.secrets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Delete removes a secret.
func (s *SecretStore) Delete(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.secrets[name]
	if !ok {
		return errdefs.NotFound("secret", name)
	}
	delete(s.secrets, name)
	if err := s.save(); err != nil {
		s.secrets[name] = e
		return err
	}
	return nil
}

// Get returns a secret's value. It is for the proxy only: no API returns it.
func (s *SecretStore) Get(name string) ([]byte, error) {
	s.mu.Lock()
	e, ok := s.secrets[name]
	s.mu.Unlock()
	if !ok {
		return nil, errdefs.NotFound("secret", name)
	}
	v, err := s.aead.Open(nil, e.Nonce, e.Sealed, []byte(name))
	if err != nil {
		return nil, fmt.Errorf("opening secret %q: %w", name, err)
	}
	return v, nil
}

// DerivedKey returns a 32-byte key for purpose, derived from the store's
// key: the same across restarts, distinct per purpose, and stored nowhere
// (the E2B facade derives its envd access tokens from one).
func (s *SecretStore) DerivedKey(purpose string) []byte {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte("paddock derived key\x00" + purpose))
	return m.Sum(nil)
}

// Placeholder is what sandbox sees instead of the secret name's value.
func (s *SecretStore) Placeholder(sandbox, name string) string {
	return placeholder(s.placeholderKey, sandbox, name)
}

// Placeholders returns the environment a sandbox gets for its bindings:
// PADDOCK_SECRET_<NAME> → its placeholder.
func (s *SecretStore) Placeholders(sandbox string, bindings []api.SecretBinding) map[string]string {
	env := make(map[string]string, len(bindings))
	for _, b := range bindings {
		env[EnvVar(b.Name)] = s.Placeholder(sandbox, b.Name)
	}
	return env
}

// save writes the file atomically; s.mu is held.
func (s *SecretStore) save() error {
	b, err := json.Marshal(secretsFile{Version: secretsVersion, Secrets: s.secrets})
	if err != nil {
		return err
	}
	if err := durable.WriteFile(filepath.Join(s.dir, secretDataFile), b, 0o600); err != nil {
		return fmt.Errorf("saving secrets: %w", err)
	}
	return nil
}
