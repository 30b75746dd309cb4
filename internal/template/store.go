package template

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"sync"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/store"
)

const bucket = "templates"

// BaseKey is the cache key a template's first step builds on: its image
// (by content) and the network policy its steps run under.
func BaseKey(imageID string, policy *api.Policy) string {
	p, _ := json.Marshal(policy)
	return digest("paddock-template-v1", imageID, string(p))
}

// StepKey is a step's cache key: the previous step's key, the step as
// written and, for a copy, the digest of the files it copies.
func StepKey(parent string, step api.TemplateStep, content string) string {
	s, _ := json.Marshal(step)
	return digest(parent, string(s), content)
}

func digest(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s\n", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Store keeps template records. Step caching needs no store of its own:
// a step is cached while some template holds its snapshot.
type Store struct {
	st  *store.Store
	log *slog.Logger

	mu        sync.Mutex
	templates map[string]*api.Template
}

// Open loads the template records.
func Open(st *store.Store, log *slog.Logger) (*Store, error) {
	s := &Store{st: st, log: log, templates: map[string]*api.Template{}}
	err := st.Each(bucket, func(key string, raw json.RawMessage) error {
		var t api.Template
		if err := json.Unmarshal(raw, &t); err != nil {
			log.Warn("skipping an unreadable template record", "template", key, "err", err)
			return nil
		}
		s.templates[t.Name] = &t
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("loading templates: %w", err)
	}
	return s, nil
}

// Get returns a template.
func (s *Store) Get(name string) (api.Template, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.templates[name]
	if t == nil {
		return api.Template{}, errdefs.NotFound("template", name)
	}
	return *t, nil
}

// List returns every template by name.
func (s *Store) List() []api.Template {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]api.Template, 0, len(s.templates))
	for _, t := range s.templates {
		out = append(out, *t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Put records t, replacing a template of the same name, and returns the
// record it replaced, if any.
func (s *Store) Put(t api.Template) (*api.Template, error) {
	t.WarmReady = 0
	if err := s.st.Put(bucket, t.Name, t); err != nil {
		return nil, fmt.Errorf("recording template: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.templates[t.Name]
	s.templates[t.Name] = &t
	return old, nil
}

// Delete removes a template's record and returns it.
func (s *Store) Delete(name string) (api.Template, error) {
	s.mu.Lock()
	t := s.templates[name]
	s.mu.Unlock()
	if t == nil {
		return api.Template{}, errdefs.NotFound("template", name)
	}
	if err := s.st.Delete(bucket, name); err != nil {
		return api.Template{}, err
	}
	s.mu.Lock()
	delete(s.templates, name)
	s.mu.Unlock()
	return *t, nil
}

// Cached returns the snapshot some template holds for a step key.
func (s *Store) Cached(key string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.templates {
		for _, st := range t.Steps {
			if st.Key == key {
				return st.Snapshot, true
			}
		}
	}
	return "", false
}

// Holds reports whether any template holds snapshot id.
func (s *Store) Holds(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.templates {
		for _, st := range t.Steps {
			if st.Snapshot == id {
				return true
			}
		}
	}
	return false
}
