// Package spare keeps what removed sandboxes leave on the host's file
// system, emptied, for the next sandboxes: a removal empties a file or a
// directory and renames it to a spare name, and a new sandbox renames a
// spare to its own. On ext4 making an inode costs 0.1-0.4 ms of CPU under
// churn (the allocator passes over every inode freed in the last
// seconds, with a buffer lookup each) and deleting it more; a rename and
// a truncation cost a few microseconds, and nothing is made or freed.
// Making and deleting the files and directories of each sandbox was most
// of the daemon's CPU under churn (issue 21).
//
// A spare holds nothing of the sandbox that gave it: Give empties it
// (with the caller's function) before renaming it, and a spare is never
// taken up after a restart: Open deletes those an earlier daemon left, so
// a crash between the emptying and the rename leaves at worst a removed
// sandbox's file or directory emptied under its own name (its removal is
// then done again), never a spare that is not empty.
package spare

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Max is how many spares a Pool keeps: enough for the sandboxes removed
// between two creates under churn, and for a burst of creates as large
// as a pool of warm guests (50 at once in the burst benchmark: with 32,
// the daemon made every burst's last 18 logs anew, at 0.1-0.4 ms of CPU
// each). A spare is an empty file or directory.
const Max = 128

// prefix starts a spare's name: no sandbox id starts with a dot.
const prefix = ".spare-"

// Pool is the spares kept in one directory. It is safe for concurrent
// use.
type Pool struct {
	dir string

	mu sync.Mutex
	// ready holds the spares' numbers, not their names: a name made as
	// a sandbox is removed and held until a later create would keep the
	// Go heap's span it landed in from being freed (issue 21).
	ready []uint64
	busy  int    // being given, counted against Max
	seq   uint64 // numbers the next
}

// Open returns the spares of dir, deleting what an earlier daemon left
// under spare names.
func Open(dir string) (*Pool, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return nil, err
			}
		}
	}
	return &Pool{dir: dir}, nil
}

// Take renames a spare to path, on the pool's file system, and reports
// whether it did: if not, nothing is at path that was not there before
// (what is there is never replaced), and making it is the caller's.
func (p *Pool) Take(path string) bool {
	p.mu.Lock()
	if len(p.ready) == 0 {
		p.mu.Unlock()
		return false
	}
	seq := p.ready[len(p.ready)-1]
	p.ready = p.ready[:len(p.ready)-1]
	p.mu.Unlock()
	name := p.name(seq)
	err := unix.Renameat2(unix.AT_FDCWD, name, unix.AT_FDCWD, path, unix.RENAME_NOREPLACE)
	if err == nil {
		return true
	}
	if errors.Is(err, unix.EEXIST) {
		p.mu.Lock()
		p.ready = append(p.ready, seq)
		p.mu.Unlock()
		return false
	}
	os.RemoveAll(name)
	return false
}

// Give empties what is at path, on the pool's file system, with empty and
// keeps it as a spare. It reports false when it did not (the pool is
// full, or empty failed): then what is at path is the caller's to delete,
// emptied or not. Nothing of the sandbox may still use it, nor read it
// through a descriptor opened before, lest it see the next sandbox's.
func (p *Pool) Give(path string, empty func(path string) error) bool {
	p.mu.Lock()
	if len(p.ready)+p.busy >= Max {
		p.mu.Unlock()
		return false
	}
	p.busy++
	p.seq++
	seq := p.seq
	p.mu.Unlock()
	name := p.name(seq)
	err := empty(path)
	if err == nil {
		err = unix.Renameat2(unix.AT_FDCWD, path, unix.AT_FDCWD, name, unix.RENAME_NOREPLACE)
	}
	p.mu.Lock()
	p.busy--
	if err == nil {
		p.ready = append(p.ready, seq)
	}
	p.mu.Unlock()
	return err == nil
}

// Len is how many spares are ready.
func (p *Pool) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ready)
}

// name is the path of spare number seq.
func (p *Pool) name(seq uint64) string {
	return filepath.Join(p.dir, prefix+strconv.FormatUint(seq, 10))
}

// Truncate empties the file at path, a regular file of one link: Give's
// empty for a file. It truncates through a descriptor it closes at once,
// while nothing is left to write back: ext4 writes a file truncated to
// nothing back when it is next closed (auto_da_alloc), which a truncation
// by path would leave to the next sandbox's close.
func Truncate(path string) error {
	fd, err := OpenOwn(path)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Ftruncate(fd, 0)
}

// ErrNotOwn is OpenOwn's refusal of what is not a regular file of one
// link.
var ErrNotOwn = errors.New("not a file of its own")

// OpenOwn opens the file at path for writing, never through a symbolic
// link, and only if it is a regular file of one link (no other name
// shares what is written over it): the descriptor is the caller's to
// close.
func OpenOwn(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 1 {
		unix.Close(fd)
		return -1, ErrNotOwn
	}
	return fd, nil
}
