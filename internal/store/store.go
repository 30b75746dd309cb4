// Package store owns paddock's embedded record store: one bbolt file under
// the state dir, with JSON records in named buckets. Every write is a bbolt
// transaction, committed with fsync, so a kill -9 leaves either the old or
// the new record, never a torn one.
package store

import (
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"paddock/internal/errdefs"
)

// Store is an open record store.
type Store struct {
	db *bolt.DB
}

// Open opens (creating if needed) the store at path.
func Open(path string) (*Store, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second, NoFreelistSync: true})
	if err != nil {
		return nil, fmt.Errorf("opening store %s: %w", path, err)
	}
	return &Store{db: db}, nil
}

// Close closes the store.
func (s *Store) Close() error { return s.db.Close() }

// Put writes v as JSON under bucket/key.
func (s *Store) Put(bucket, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding %s/%s: %w", bucket, key, err)
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		bk, err := tx.CreateBucketIfNotExists([]byte(bucket))
		if err != nil {
			return err
		}
		return bk.Put([]byte(key), b)
	})
}

// Get reads bucket/key into v; errdefs.ErrNotFound if missing.
func (s *Store) Get(bucket, key string, v any) error {
	return s.db.View(func(tx *bolt.Tx) error {
		bk := tx.Bucket([]byte(bucket))
		var b []byte
		if bk != nil {
			b = bk.Get([]byte(key))
		}
		if b == nil {
			return errdefs.NotFound(bucket, key)
		}
		return json.Unmarshal(b, v)
	})
}

// Delete removes bucket/key; removing a missing key is not an error.
func (s *Store) Delete(bucket, key string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket([]byte(bucket))
		if bk == nil {
			return nil
		}
		return bk.Delete([]byte(key))
	})
}

// Each calls fn for every record in bucket, in key order.
func (s *Store) Each(bucket string, fn func(key string, raw json.RawMessage) error) error {
	return s.db.View(func(tx *bolt.Tx) error {
		bk := tx.Bucket([]byte(bucket))
		if bk == nil {
			return nil
		}
		return bk.ForEach(func(k, v []byte) error {
			return fn(string(k), append(json.RawMessage(nil), v...))
		})
	})
}
