package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/paddock-dev/paddock/internal/durable"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// The journal makes one record durable with one small write and one
// fdatasync, where a bbolt commit takes two fdatasyncs and, on ext4,
// usually a journal commit that waits for whatever else the host has
// written meanwhile (0.6-5 ms on a shared disk, against about 0.2 ms).
// It is a file of fixed size whose blocks were written (zeros) and synced
// when it was made, so that overwriting them changes no metadata and
// fdatasync flushes only the data.
//
// Each entry is: length of the payload (4 bytes), its CRC-32C (4 bytes),
// and the payload: sequence number (8), bucket length (2), bucket, key
// length (2), key, value; an empty value deletes the key (a record's
// value is JSON, never empty). Entries are appended in sequence order. The
// database records the last sequence number folded into it (metaBucket,
// foldedKey) in the same transaction as the fold, so an entry is applied
// exactly once: replay skips what is folded, and stops at the first entry
// that is torn or out of order (what follows it is older data, left from
// before the file was last rewound).

const (
	journalSize = 1 << 20
	entryHeader = 8
	metaBucket  = "_store"
	foldedKey   = "journal_folded"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// entry is one journaled record.
type entry struct {
	seq         uint64
	bucket, key string
	value       []byte
}

// deletes reports whether e deletes its key.
func (e entry) deletes() bool { return len(e.value) == 0 }

func (e entry) encode() []byte {
	n := 8 + 2 + len(e.bucket) + 2 + len(e.key) + len(e.value)
	b := make([]byte, entryHeader+n)
	p := b[entryHeader:]
	binary.LittleEndian.PutUint64(p, e.seq)
	binary.LittleEndian.PutUint16(p[8:], uint16(len(e.bucket)))
	i := 10 + copy(p[10:], e.bucket)
	binary.LittleEndian.PutUint16(p[i:], uint16(len(e.key)))
	i += 2 + copy(p[i+2:], e.key)
	copy(p[i:], e.value)
	binary.LittleEndian.PutUint32(b, uint32(n))
	binary.LittleEndian.PutUint32(b[4:], crc32.Checksum(p, castagnoli))
	return b
}

// decodeEntries returns the entries at the start of b that are whole,
// checksummed and in increasing sequence order.
func decodeEntries(b []byte) []entry {
	var out []entry
	var last uint64
	for off := 0; off+entryHeader <= len(b); {
		n := int(binary.LittleEndian.Uint32(b[off:]))
		if n < 12 || off+entryHeader+n > len(b) {
			break
		}
		p := b[off+entryHeader : off+entryHeader+n]
		if crc32.Checksum(p, castagnoli) != binary.LittleEndian.Uint32(b[off+4:]) {
			break
		}
		e := entry{seq: binary.LittleEndian.Uint64(p)}
		bl := int(binary.LittleEndian.Uint16(p[8:]))
		if 10+bl+2 > n {
			break
		}
		e.bucket = string(p[10 : 10+bl])
		kl := int(binary.LittleEndian.Uint16(p[10+bl:]))
		if 12+bl+kl > n {
			break
		}
		e.key = string(p[12+bl : 12+bl+kl])
		e.value = append([]byte(nil), p[12+bl+kl:]...)
		if e.seq <= last {
			break
		}
		last = e.seq
		out = append(out, e)
		off += entryHeader + n
	}
	return out
}

// openJournal opens the journal file at path, making it (written and
// synced) if it is missing or of another size, and returns its entries.
func openJournal(path string) (*os.File, []entry, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("opening journal: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("opening journal: %w", err)
	}
	if fi.Size() == journalSize {
		b := make([]byte, journalSize)
		if _, err := io.ReadFull(f, b); err != nil {
			f.Close()
			return nil, nil, fmt.Errorf("reading journal: %w", err)
		}
		return f, decodeEntries(b), nil
	}
	// New (or from a crash while it was being made: it holds nothing
	// then, since nothing is journaled before it is whole).
	err = f.Truncate(0)
	if err == nil {
		_, err = f.WriteAt(make([]byte, journalSize), 0)
	}
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		// The new file's name must last as long as its contents.
		err = durable.SyncDir(filepath.Dir(path))
	}
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("making journal: %w", err)
	}
	return f, nil, nil
}

// errJournalFull says an entry does not fit before the next fold.
var errJournalFull = errors.New("journal full")

// appendEntry writes b at off in f, and waits until it is on disk if
// sync.
func appendEntry(f *os.File, off int64, b []byte, sync bool) error {
	if off+int64(len(b)) > journalSize {
		return errJournalFull
	}
	if _, err := f.WriteAt(b, off); err != nil {
		return err
	}
	if !sync {
		return nil
	}
	return durable.DataSync(f)
}
