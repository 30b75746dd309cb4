// Package store owns paddock's embedded record store: one bbolt file under
// the state dir, with JSON records in named buckets. Every write is a bbolt
// transaction, committed with fsync, so a kill -9 leaves either the old or
// the new record, never a torn one; PutNow makes a record durable through a
// small journal beside it instead (journal.go), for the one write a
// caller waits on.
package store

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sort"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/durable"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// foldDelay is how long journaled records wait before they are folded
// into the database, so that a burst of them costs one commit.
const foldDelay = 100 * time.Millisecond

// Store is an open record store.
type Store struct {
	db  *bolt.DB
	log *slog.Logger

	// wmu orders the writes to the database (Put, Delete, folds) with
	// each other.
	wmu sync.Mutex
	// qmu guards queue: the Puts and Deletes waiting for the next group
	// commit (commit).
	qmu   sync.Mutex
	queue []*commitReq

	// jmu guards the journal: the file, the offset of the next entry, the
	// last sequence number, and the entries not folded yet (pending, in
	// sequence order), which reads consult before the database.
	jmu     sync.Mutex
	journal *os.File
	off     int64
	seq     uint64
	pending []entry
	folding *time.Timer
	// foldDelay is how long journaled records wait for a fold (the
	// const's; a test that crashes the store lengthens it).
	foldDelay time.Duration
	closed    bool
	// broken is set when a journal write failed: what it left may be a
	// whole entry, so its sequence number is spent (the next fold records
	// it as folded, and replay skips it) and the journal is not used
	// again until the store is reopened.
	broken bool
	// spent is the last sequence number recorded as folded while broken.
	spent uint64

	// syncs asks syncer to fdatasync the journal (PutQuick); syncerDone
	// is closed when it has stopped.
	syncs      chan struct{}
	syncerDone chan struct{}
}

// Open opens (creating if needed) the store at path, and its journal at
// path.journal; records the journal holds that the database lacks (a
// crash before they were folded) are folded first.
func Open(path string) (*Store, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second, NoFreelistSync: true})
	if err != nil {
		return nil, fmt.Errorf("opening store %s: %w", path, err)
	}
	s := &Store{db: db, log: slog.Default(), foldDelay: foldDelay}
	j, entries, err := openJournal(path + ".journal")
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("opening store %s: %w", path, err)
	}
	s.journal = j
	s.syncs = make(chan struct{}, 1)
	s.syncerDone = make(chan struct{})
	go s.syncer()
	folded, err := s.folded()
	if err != nil {
		s.Close()
		return nil, err
	}
	s.seq = folded
	for _, e := range entries {
		if e.seq > folded {
			s.pending = append(s.pending, e)
			s.seq = e.seq
		}
	}
	if err := s.fold(nil); err != nil {
		s.Close()
		return nil, fmt.Errorf("replaying journal: %w", err)
	}
	return s, nil
}

// folded reads the last sequence number folded into the database.
func (s *Store) folded() (uint64, error) {
	var n uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		if bk := tx.Bucket([]byte(metaBucket)); bk != nil {
			if b := bk.Get([]byte(foldedKey)); len(b) == 8 {
				n = binary.LittleEndian.Uint64(b)
			}
		}
		return nil
	})
	return n, err
}

// Close folds what the journal holds and closes the store.
func (s *Store) Close() error {
	s.jmu.Lock()
	s.closed = true
	if s.folding != nil {
		s.folding.Stop()
	}
	s.jmu.Unlock()
	err := s.fold(nil)
	if s.syncs != nil {
		close(s.syncs)
		<-s.syncerDone
	}
	if s.journal != nil {
		s.journal.Close()
	}
	if cerr := s.db.Close(); err == nil {
		err = cerr
	}
	return err
}

// fold writes the pending journal entries to the database, then write
// (if not nil) in the same transaction, and records how far the journal
// is folded. Entries journaled meanwhile stay pending.
func (s *Store) fold(write func(tx *bolt.Tx) error) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.foldLocked(write)
}

// foldLocked is fold with wmu held.
func (s *Store) foldLocked(write func(tx *bolt.Tx) error) error {
	s.jmu.Lock()
	batch := append([]entry(nil), s.pending...)
	through := uint64(0)
	if len(batch) > 0 {
		through = batch[len(batch)-1].seq
	}
	if s.broken && s.seq > s.spent {
		through = s.seq
	}
	s.jmu.Unlock()
	if through == 0 && write == nil {
		return nil
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		for _, e := range batch {
			bk, err := tx.CreateBucketIfNotExists([]byte(e.bucket))
			if err != nil {
				return err
			}
			if e.deletes() {
				err = bk.Delete([]byte(e.key))
			} else {
				err = bk.Put([]byte(e.key), e.value)
			}
			if err != nil {
				return err
			}
		}
		if through > 0 {
			meta, err := tx.CreateBucketIfNotExists([]byte(metaBucket))
			if err != nil {
				return err
			}
			var b [8]byte
			binary.LittleEndian.PutUint64(b[:], through)
			if err := meta.Put([]byte(foldedKey), b[:]); err != nil {
				return err
			}
		}
		if write != nil {
			return write(tx)
		}
		return nil
	})
	if err != nil || through == 0 {
		return err
	}
	s.jmu.Lock()
	if s.broken && through > s.spent {
		s.spent = through
	}
	// The folded entries are let go. Resliced, the backing array would
	// keep them (their keys and records) alive until the next growth: a
	// thousand deletes left the ids of the sandboxes they removed in it,
	// each pinning a page of the heap allocated at their peak (issue 21).
	if rest := s.pending[len(batch):]; len(rest) > 0 {
		s.pending = slices.Clone(rest)
	} else {
		// Everything in the file is folded: the next entry may
		// overwrite it from the start.
		s.pending = nil
		s.off = 0
	}
	s.jmu.Unlock()
	return nil
}

// commitReq is a write waiting for a commit (see commit).
type commitReq struct {
	write func(tx *bolt.Tx) error
	done  chan error
}

// commit writes write in a database transaction, durable when it
// returns. Writes that wait while another commits go in one transaction
// together (a group commit: one bbolt commit, two fsyncs, for all of
// them), so that concurrent callers (deletes of many sandboxes at once)
// do not queue for a commit each. A batch that fails is retried one
// write at a time, so that each caller gets its own error.
func (s *Store) commit(write func(tx *bolt.Tx) error) error {
	req := &commitReq{write: write, done: make(chan error, 1)}
	s.qmu.Lock()
	s.queue = append(s.queue, req)
	s.qmu.Unlock()
	s.wmu.Lock()
	select {
	case err := <-req.done: // committed by the caller before us
		s.wmu.Unlock()
		return err
	default:
	}
	s.qmu.Lock()
	batch := s.queue
	s.queue = nil
	s.qmu.Unlock()
	err := s.foldLocked(func(tx *bolt.Tx) error {
		for _, r := range batch {
			if err := r.write(tx); err != nil {
				return err
			}
		}
		return nil
	})
	for _, r := range batch {
		if err != nil && len(batch) > 1 {
			r.done <- s.foldLocked(r.write)
		} else {
			r.done <- err
		}
	}
	s.wmu.Unlock()
	return <-req.done
}

// Put writes v as JSON under bucket/key.
func (s *Store) Put(bucket, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding %s/%s: %w", bucket, key, err)
	}
	return s.commit(func(tx *bolt.Tx) error {
		bk, err := tx.CreateBucketIfNotExists([]byte(bucket))
		if err != nil {
			return err
		}
		return bk.Put([]byte(key), b)
	})
}

// PutNow writes v as JSON under bucket/key, durably when it returns, as
// Put does, but with one small write and one fdatasync to the journal
// rather than a database commit; the record is folded into the database
// shortly after (before any later Put or Delete, and on Open after a
// crash). When the journal is full it is Put.
func (s *Store) PutNow(bucket, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding %s/%s: %w", bucket, key, err)
	}
	return s.putJournal(bucket, key, b, true)
}

// PutQuick is PutNow without waiting for the disk: when it returns the
// record is in the journal in the host's page cache, where it survives the
// process (a kill -9; the next Open replays it), and a host crash once the
// journal's fdatasync, started at once in the background, is done (a
// fraction of a millisecond to a few, with the host's disk flush). A host
// crash before that loses the record. The one caller is the create of a
// sandbox, whose processes such a crash ends anyway (docs/ARCHITECTURE.md,
// "State and restarts").
func (s *Store) PutQuick(bucket, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding %s/%s: %w", bucket, key, err)
	}
	return s.putJournal(bucket, key, b, false)
}

// DeleteQuick is Delete through the journal, durable as PutQuick's
// writes are: after a kill -9 at once, after a host crash once the
// background fdatasync is done. A host crash before that brings the key
// back, and nothing written to the journal after it: entries are
// replayed in order, up to the first one that is torn. The caller is
// the end of a sandbox's teardown, which a daemon that finds the record
// again does over (docs/ARCHITECTURE.md, "Teardown").
func (s *Store) DeleteQuick(bucket, key string) error {
	return s.putJournal(bucket, key, nil, false)
}

// putJournal journals b as bucket/key's value (an empty b deletes the
// key), waiting for the disk if sync; it falls back to a database
// commit when the journal cannot take it.
func (s *Store) putJournal(bucket, key string, b []byte, sync bool) error {
	fallback := func() error {
		if len(b) == 0 {
			return s.Delete(bucket, key)
		}
		return s.commit(func(tx *bolt.Tx) error {
			bk, err := tx.CreateBucketIfNotExists([]byte(bucket))
			if err != nil {
				return err
			}
			return bk.Put([]byte(key), b)
		})
	}
	if len(bucket) > 1<<15 || len(key) > 1<<15 {
		return fallback()
	}
	s.jmu.Lock()
	if s.closed {
		s.jmu.Unlock()
		return fmt.Errorf("writing %s/%s: %w: store closed", bucket, key, errdefs.ErrUnavailable)
	}
	if s.broken {
		s.jmu.Unlock()
		return fallback()
	}
	e := entry{seq: s.seq + 1, bucket: bucket, key: key, value: b}
	enc := e.encode()
	err := appendEntry(s.journal, s.off, enc, sync)
	if err == nil {
		s.seq = e.seq
		s.off += int64(len(enc))
		s.pending = append(s.pending, e)
		if !sync {
			select {
			case s.syncs <- struct{}{}:
			default: // one is due already, and will cover this entry
			}
		}
		if s.folding == nil {
			s.folding = time.AfterFunc(s.foldDelay, s.foldLater)
		} else {
			s.folding.Reset(s.foldDelay)
		}
	} else if err != errJournalFull {
		s.log.Error("writing the store's journal; writing to the database alone from now on", "err", err)
		s.seq = e.seq
		s.broken = true
	}
	s.jmu.Unlock()
	if err != nil {
		return fallback()
	}
	return nil
}

// syncer makes journal entries PutQuick wrote durable, one fdatasync per
// request (requests made while one runs are covered by the next).
func (s *Store) syncer() {
	defer close(s.syncerDone)
	for range s.syncs {
		if err := durable.DataSync(s.journal); err != nil {
			s.log.Error("syncing the store's journal", "err", err)
		}
	}
}

func (s *Store) foldLater() {
	if err := s.fold(nil); err != nil {
		s.log.Error("folding the store's journal", "err", err)
		s.jmu.Lock()
		if !s.closed {
			s.folding.Reset(s.foldDelay)
		}
		s.jmu.Unlock()
	}
}

// pendingValue returns the newest journaled value of bucket/key not
// folded yet (empty if the key is deleted).
func (s *Store) pendingValue(bucket, key string) ([]byte, bool) {
	s.jmu.Lock()
	defer s.jmu.Unlock()
	for i := len(s.pending) - 1; i >= 0; i-- {
		if e := s.pending[i]; e.bucket == bucket && e.key == key {
			return e.value, true
		}
	}
	return nil, false
}

// Get reads bucket/key into v; errdefs.ErrNotFound if missing.
func (s *Store) Get(bucket, key string, v any) error {
	if b, ok := s.pendingValue(bucket, key); ok {
		if len(b) == 0 {
			return errdefs.NotFound(bucket, key)
		}
		return json.Unmarshal(b, v)
	}
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
	return s.commit(func(tx *bolt.Tx) error {
		bk := tx.Bucket([]byte(bucket))
		if bk == nil {
			return nil
		}
		return bk.Delete([]byte(key))
	})
}

// Each calls fn for every record in bucket, in key order.
func (s *Store) Each(bucket string, fn func(key string, raw json.RawMessage) error) error {
	if err := s.fold(nil); err != nil {
		return err
	}
	// Entries journaled since are read from the journal: the database
	// view below does not have them yet.
	s.jmu.Lock()
	extra := map[string][]byte{}
	for _, e := range s.pending {
		if e.bucket == bucket {
			extra[e.key] = e.value
		}
	}
	s.jmu.Unlock()
	return s.db.View(func(tx *bolt.Tx) error {
		rows := map[string][]byte{}
		if bk := tx.Bucket([]byte(bucket)); bk != nil {
			if err := bk.ForEach(func(k, v []byte) error {
				rows[string(k)] = append([]byte(nil), v...)
				return nil
			}); err != nil {
				return err
			}
		}
		for k, v := range extra {
			if len(v) == 0 {
				delete(rows, k)
			} else {
				rows[k] = v
			}
		}
		keys := make([]string, 0, len(rows))
		for k := range rows {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if err := fn(k, json.RawMessage(rows[k])); err != nil {
				return err
			}
		}
		return nil
	})
}

// Release drops the database's pages from the process's memory map.
// bbolt reads the file through a shared mapping, so every page a
// transaction touched counts in the daemon's RSS until it is unmapped,
// though it is only the page cache: after a thousand sandboxes were
// removed their records' pages kept 1.8 MiB of the daemon's RSS (issue
// 21). The pages stay in the page cache, and the next read of one maps it
// again (a minor fault). The read transaction holds bbolt's mmap lock, so
// no commit remaps the file meanwhile; the file's size (tx.Size) is
// within the mapping.
func (s *Store) Release() error {
	return s.db.View(func(tx *bolt.Tx) error {
		_, _, errno := unix.Syscall(unix.SYS_MADVISE, s.db.Info().Data, uintptr(tx.Size()), unix.MADV_DONTNEED)
		if errno != 0 {
			return fmt.Errorf("releasing the store's mapped pages: %w", errno)
		}
		return nil
	})
}
