package store

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"

	"paddock/internal/errdefs"
)

type rec struct {
	Name string `json:"name"`
	N    int    `json:"n"`
}

func TestPutGetDeleteEach(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put("b", "k1", rec{"one", 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.Put("b", "k2", rec{"two", 2}); err != nil {
		t.Fatal(err)
	}
	var r rec
	if err := s.Get("b", "k1", &r); err != nil || r.N != 1 {
		t.Fatalf("Get k1 = %+v, %v", r, err)
	}
	if err := s.Get("b", "missing", &r); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Get missing: %v, want ErrNotFound", err)
	}
	if err := s.Get("nobucket", "k", &r); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Get in missing bucket: %v, want ErrNotFound", err)
	}
	if err := s.Delete("b", "k1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("b", "k1"); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	s.Close()

	// Records survive reopening.
	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var keys []string
	err = s.Each("b", func(k string, raw json.RawMessage) error {
		var r rec
		if err := json.Unmarshal(raw, &r); err != nil {
			return err
		}
		keys = append(keys, k+"="+r.Name)
		return nil
	})
	if err != nil || len(keys) != 1 || keys[0] != "k2=two" {
		t.Fatalf("Each = %v, %v", keys, err)
	}
}
