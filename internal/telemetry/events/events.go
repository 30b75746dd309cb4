// Package events owns the per-sandbox event log: what happened to a
// sandbox (lifecycle, exec, OOM, limit changes, policy decisions, budget
// and autoscale actions), in order, each event numbered so that a client
// can resume, kept on disk within a byte cap per sandbox.
//
// Each sandbox's log is JSON lines in two segment files under the log's
// directory, <id>.jsonl and the older <id>.1.jsonl. When the current
// segment would pass half the cap it becomes the older one and the oldest
// events go, so a sandbox keeps between half its cap and its cap. Appends
// are not fsynced: a crash may lose the last events and tear the last
// line, which is ignored on read and cut off before the next append.
//
// A removed sandbox's current segment is not deleted but emptied and kept
// as a spare (package spare), which the next new log takes: under churn
// every sandbox has a log, and making and deleting a file each was a
// tenth of the daemon's CPU (issue 21).
package events

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/reqcheck"
	"github.com/paddock-dev/paddock/internal/shrink"
	"github.com/paddock-dev/paddock/internal/spare"
	"github.com/paddock-dev/paddock/internal/telemetry/internal/gone"
	"github.com/paddock-dev/paddock/internal/telemetry/internal/jsonl"
)

// Type is what an event is about (api.Event.Type).
type Type = string

const (
	Lifecycle Type = "lifecycle" // created, started, stopped, failed, deleted
	Exec      Type = "exec"      // a process started or exited: ExecData
	OOM       Type = "oom"       // the kernel's OOM killer killed a process: OOMData
	Limits    Type = "limits"    // CPU, memory or pids limits changed: LimitsData
	Snapshot  Type = "snapshot"
	Pause     Type = "pause" // paused or resumed
	Policy    Type = "policy"
	Request   Type = "request"   // an egress request asked, decided or used: api.EgressRequest
	Budget    Type = "budget"    // a warning or an exceeded budget: budget.Notice
	Autoscale Type = "autoscale" // a resize decision: autoscale.Decision
)

// Event is one entry of a sandbox's log, as the API shows it. Seq numbers
// a sandbox's events from 1, without gaps, and survives daemon restarts;
// Message is one line for humans, at most MaxMessage bytes; Data is the
// type's payload (ExecData, LimitsData, ...; the egress proxy's decision
// for policy events).
type Event = api.Event

// ExecData is the payload of an exec event.
type ExecData struct {
	// Container is the container the process runs in, "" for the first.
	Container string `json:"container,omitempty"`
	PID       int    `json:"pid"`
	// Cmd is the argv, cut to MaxCmdBytes in all.
	Cmd []string `json:"cmd,omitempty"`
	// Exited is false for the start event.
	Exited    bool   `json:"exited"`
	ExitCode  *int   `json:"exit_code,omitempty"`
	Signal    string `json:"signal,omitempty"`
	OOMKilled bool   `json:"oom_killed,omitempty"`
	// DurationMS is the run time, on exit.
	DurationMS int64 `json:"duration_ms,omitempty"`
}

// OOMData is the payload of an oom event.
type OOMData struct {
	Kills            uint64 `json:"kills"` // since the last oom event
	Total            uint64 `json:"total"` // the cgroup's count
	MemoryLimitBytes int64  `json:"memory_limit_bytes"`
}

// LimitsData is the payload of a limits event.
type LimitsData struct {
	CPUs        float64 `json:"cpus"`
	MemoryBytes int64   `json:"memory_bytes"`
	Pids        int64   `json:"pids"`
	// Previous values.
	FromCPUs        float64 `json:"from_cpus"`
	FromMemoryBytes int64   `json:"from_memory_bytes"`
	FromPids        int64   `json:"from_pids"`
	// By is who changed them: "user" or "autoscale".
	By string `json:"by"`
}

// Bounds on an event.
const (
	MaxMessage  = 1024
	MaxCmdBytes = 1024
	// MaxEventBytes bounds an event's JSON line; Append refuses bigger
	// ones with errdefs.ErrTooLarge.
	MaxEventBytes = 16 << 10
)

// Data encodes a payload for Event.Data; nil if v cannot be encoded.
func Data(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	return b
}

// CutCmd bounds an argv for ExecData: at most MaxCmdBytes in all, the last
// argument kept cut with "…".
func CutCmd(cmd []string) []string {
	n := 0
	for i, a := range cmd {
		if n+len(a) > MaxCmdBytes {
			out := append([]string(nil), cmd[:i]...)
			return append(out, truncate(a, MaxCmdBytes-n)+"…")
		}
		n += len(a)
	}
	return cmd
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Config configures a Log.
type Config struct {
	// Dir holds the logs; it is made if missing.
	Dir string
	// MaxBytes is each sandbox's retention cap. Default 1 MiB; at least
	// 4 × MaxEventBytes.
	MaxBytes int64
	Logger   *slog.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Log is the event log of every sandbox. It is safe for concurrent use.
type Log struct {
	cfg Config
	log *slog.Logger

	mu        sync.Mutex
	boxes     map[string]*sandboxLog
	boxesPeak int // for shrink.Map
	// open counts the segments kept open (sandboxLog.fd), at most
	// maxOpen.
	open atomic.Int32

	spares *spare.Pool

	gone gone.Set // removed sandboxes, whose stragglers are refused; under mu
}

// ErrRemoved: the sandbox's log was removed (the sandbox was deleted).
// An event for it is a straggler of its teardown (an exec's exit the
// daemon's copy of its output reached after the removal, say), and is
// not recorded: it would make the log again, a file no sandbox owns
// (package gone).
var ErrRemoved = errors.New("the sandbox's event log was removed")

// maxOpen bounds the segments a Log keeps open between appends: a
// sandbox's few events (created, each exec's start and exit) then cost
// one open and one close, not one each, while a daemon with thousands
// of sandboxes holds no more descriptors than this for them.
const maxOpen = 128

// sandboxLog is one sandbox's log.
type sandboxLog struct {
	mu      sync.Mutex
	loaded  bool
	last    uint64 // the last seq written
	size    int64  // of the current segment
	fd      int    // the current segment, open for appending; -1 if not
	changed chan struct{}
	removed bool
	// readers counts the Lists reading the segments: while one does,
	// a removal deletes them rather than make a spare the reader could
	// read the next sandbox's events from.
	readers int
}

// Open returns the log kept in cfg.Dir.
func Open(cfg Config) (*Log, error) {
	if cfg.Dir == "" {
		return nil, errdefs.Invalid("dir", "must be set")
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = 1 << 20
	}
	if cfg.MaxBytes < 4*MaxEventBytes {
		return nil, errdefs.Invalid("max_bytes", "must be at least %d, got %d", 4*MaxEventBytes, cfg.MaxBytes)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("opening event log: %w", err)
	}
	spares, err := spare.Open(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("opening event log: %w", err)
	}
	return &Log{cfg: cfg, log: cfg.Logger, boxes: map[string]*sandboxLog{}, spares: spares}, nil
}

func (l *Log) paths(id string) (cur, old string) {
	return filepath.Join(l.cfg.Dir, id+".jsonl"), filepath.Join(l.cfg.Dir, id+".1.jsonl")
}

func (l *Log) box(id string) *sandboxLog { return l.boxUnless(id, false) }

// boxUnless is box, or nil when refuseGone is set and id's log was
// removed: looked at under l.mu, which Remove holds while it drops the
// box and adds id to gone, so that no box is made for a removed sandbox.
func (l *Log) boxUnless(id string, refuseGone bool) *sandboxLog {
	l.mu.Lock()
	defer l.mu.Unlock()
	if refuseGone && l.gone.Has(id) {
		return nil
	}
	b := l.boxes[id]
	if b == nil {
		b = &sandboxLog{changed: make(chan struct{}), fd: -1}
		l.boxes[id] = b
	}
	return b
}

// Append adds e to sandbox id's log and returns it as stored: Seq set,
// Sandbox set, Time set to now if zero, Message cut to MaxMessage.
func (l *Log) Append(id string, e Event) (Event, error) {
	if err := reqcheck.SandboxID("id", id); err != nil {
		return Event{}, err
	}
	if e.Type == "" {
		return Event{}, errdefs.Invalid("type", "must be set")
	}
	e.Sandbox = id
	if e.Time.IsZero() {
		e.Time = l.cfg.Now()
	}
	e.Time = e.Time.UTC().Round(time.Microsecond)
	e.Message = truncate(e.Message, MaxMessage)
	b := l.boxUnless(id, true)
	if b == nil {
		return Event{}, ErrRemoved
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.removed {
		return Event{}, ErrRemoved // removed while this waited for it
	}
	if err := l.load(id, b); err != nil {
		return Event{}, err
	}
	e.Seq = b.last + 1
	line, err := json.Marshal(e)
	if err != nil {
		return Event{}, fmt.Errorf("appending event: %w", err)
	}
	line = append(line, '\n')
	if len(line) > MaxEventBytes {
		return Event{}, fmt.Errorf("appending event: %w: %d bytes, at most %d", errdefs.ErrTooLarge, len(line), MaxEventBytes)
	}
	cur, old := l.paths(id)
	if b.size > 0 && b.size+int64(len(line)) > l.cfg.MaxBytes/2 {
		l.closeSegment(b)
		if err := os.Rename(cur, old); err != nil && !errors.Is(err, os.ErrNotExist) {
			return Event{}, fmt.Errorf("rotating event log: %w", err)
		}
		b.size = 0
	}
	if err := l.write(id, b, cur, line); err != nil {
		return Event{}, fmt.Errorf("appending event: %w", err)
	}
	b.size += int64(len(line))
	b.last = e.Seq
	close(b.changed)
	b.changed = make(chan struct{})
	return e, nil
}

// write appends line to id's current segment at path, kept open in b
// after while fewer than maxOpen are and b is still id's (a removal
// closes it). Called with b.mu held.
func (l *Log) write(id string, b *sandboxLog, path string, line []byte) error {
	if b.fd >= 0 {
		return jsonl.Write(b.fd, path, line)
	}
	if b.size == 0 {
		// A new segment (or an empty one, which stays: Take never
		// replaces a file).
		l.spares.Take(path)
	}
	fd, err := jsonl.Open(path)
	if err != nil {
		return err
	}
	l.mu.Lock()
	keep := l.boxes[id] == b
	l.mu.Unlock()
	if keep && l.open.Add(1) > maxOpen {
		l.open.Add(-1)
		keep = false
	}
	if keep {
		b.fd = fd
	} else {
		defer unix.Close(fd)
	}
	return jsonl.Write(fd, path, line)
}

// closeSegment closes b's current segment if it is open. Called with
// b.mu held.
func (l *Log) closeSegment(b *sandboxLog) {
	if b.fd >= 0 {
		unix.Close(b.fd)
		b.fd = -1
		l.open.Add(-1)
	}
}

// load finds where id's log left off: the last seq and the current
// segment's size, cutting a torn last line off. Called with b.mu held.
func (l *Log) load(id string, b *sandboxLog) error {
	if b.loaded {
		return nil
	}
	cur, old := l.paths(id)
	last, size, err := lastSeq(cur, true)
	if err != nil {
		return fmt.Errorf("loading event log: %w", err)
	}
	if last == 0 {
		if last, _, err = lastSeq(old, false); err != nil {
			return fmt.Errorf("loading event log: %w", err)
		}
	}
	b.last, b.size, b.loaded, b.removed = last, size, true, false
	return nil
}

// lastSeq returns the seq of the last event in the segment at path and
// its size once a torn last line is cut off (if repair). A missing file
// is empty.
func lastSeq(path string, repair bool) (uint64, int64, error) {
	data, err := jsonl.ReadWhole(path, repair)
	if err != nil {
		return 0, 0, err
	}
	whole := len(data)
	for len(data) > 0 {
		i := bytes.LastIndexByte(data[:len(data)-1], '\n') + 1
		if seq, ok := seqOf(data[i:]); ok {
			var e Event
			if json.Unmarshal(data[i:], &e) == nil {
				return seq, int64(whole), nil
			}
		}
		data = data[:i]
	}
	return 0, int64(whole), nil
}

// seqOf reads the seq from the start of an encoded event, which
// json.Marshal always writes first: `{"seq":N,`.
func seqOf(line []byte) (uint64, bool) {
	const prefix = `{"seq":`
	if !bytes.HasPrefix(line, []byte(prefix)) {
		return 0, false
	}
	line = line[len(prefix):]
	end := bytes.IndexByte(line, ',')
	if end < 0 {
		return 0, false
	}
	n, err := strconv.ParseUint(string(line[:end]), 10, 64)
	return n, err == nil
}

// Query selects events for List.
type Query struct {
	// After skips events up to this seq.
	After uint64
	// Since skips events before this time.
	Since time.Time
	// Types keeps only these types; empty keeps all.
	Types []Type
	// Limit caps the events returned: default 100, at most 1000.
	Limit int
}

// List returns sandbox id's retained events matching q, oldest first. A
// sandbox with no events has an empty list.
func (l *Log) List(id string, q Query) ([]Event, error) {
	if err := reqcheck.SandboxID("id", id); err != nil {
		return nil, err
	}
	if q.Limit <= 0 {
		q.Limit = 100
	}
	q.Limit = min(q.Limit, 1000)
	// Open both segments under the lock, so that a rotation cannot slip
	// between them; read them without it.
	b := l.box(id)
	b.mu.Lock()
	cur, old := l.paths(id)
	fo, err1 := os.Open(old)
	fc, err2 := os.Open(cur)
	b.readers++
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.readers--
		b.mu.Unlock()
	}()
	var out []Event
	for _, f := range []struct {
		f   *os.File
		err error
	}{{fo, err1}, {fc, err2}} {
		if errors.Is(f.err, os.ErrNotExist) {
			continue
		}
		if f.err != nil {
			closeAll(fo, fc)
			return nil, fmt.Errorf("reading event log: %w", f.err)
		}
		var err error
		out, err = scan(f.f, q, out)
		if err != nil {
			closeAll(fo, fc)
			return nil, fmt.Errorf("reading event log: %w", err)
		}
		if len(out) >= q.Limit {
			break
		}
	}
	closeAll(fo, fc)
	return out, nil
}

func closeAll(fs ...*os.File) {
	for _, f := range fs {
		if f != nil {
			f.Close()
		}
	}
}

// scan appends the events of one segment that match q to out, up to the
// limit. Lines that do not parse (a torn last line, a line cut by a crash)
// are skipped.
func scan(r io.Reader, q Query, out []Event) ([]Event, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	for len(out) < q.Limit {
		line, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			// Longer than any event we write: skip it.
			for err == bufio.ErrBufferFull {
				_, err = br.ReadSlice('\n')
			}
			continue
		}
		if err == io.EOF {
			return out, nil // a line without its newline is torn
		}
		if err != nil {
			return out, err
		}
		seq, ok := seqOf(line)
		if !ok || seq <= q.After {
			continue
		}
		var e Event
		if json.Unmarshal(line, &e) != nil {
			continue
		}
		if e.Time.Before(q.Since) || (len(q.Types) > 0 && !hasType(q.Types, e.Type)) {
			continue
		}
		out = append(out, e)
	}
	return out, nil
}

func hasType(ts []Type, t Type) bool {
	for _, x := range ts {
		if x == t {
			return true
		}
	}
	return false
}

// Follow streams sandbox id's events after seq after: first those
// retained, then each new one as it is appended. The channel closes when
// ctx ends or the log is removed. A reader that falls behind loses
// nothing unless the retention cap drops events before it reads them (a
// jump in Seq).
func (l *Log) Follow(ctx context.Context, id string, after uint64) (<-chan Event, error) {
	if err := reqcheck.SandboxID("id", id); err != nil {
		return nil, err
	}
	ch := make(chan Event, 64)
	b := l.box(id)
	go func() {
		defer close(ch)
		for {
			b.mu.Lock()
			changed, removed := b.changed, b.removed
			b.mu.Unlock()
			if removed {
				return
			}
			evs, err := l.List(id, Query{After: after, Limit: 1000})
			if err != nil {
				l.log.Warn("following event log", "sandbox", id, "err", err)
				return
			}
			for _, e := range evs {
				select {
				case ch <- e:
					after = e.Seq
				case <-ctx.Done():
					return
				}
			}
			if len(evs) == 1000 {
				continue
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch, nil
}

// Remove deletes sandbox id's log (the sandbox was deleted) and ends its
// followers. A later Append for id is refused (ErrRemoved).
func (l *Log) Remove(id string) error {
	if err := reqcheck.SandboxID("id", id); err != nil {
		return err
	}
	b := l.box(id)
	b.mu.Lock()
	defer b.mu.Unlock()
	l.closeSegment(b)
	cur, old := l.paths(id)
	var errs []error
	for _, p := range []string{cur, old} {
		if p == cur && b.readers == 0 && l.spares.Give(cur, spare.Truncate) {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	b.removed, b.loaded, b.last, b.size = true, false, 0, 0
	close(b.changed)
	b.changed = make(chan struct{})
	l.mu.Lock()
	if l.boxes[id] == b {
		delete(l.boxes, id)
		l.boxes = shrink.Map(l.boxes, &l.boxesPeak)
	}
	l.gone.Add(id)
	l.mu.Unlock()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("removing event log: %w", err)
	}
	return nil
}

// IDs lists the sandboxes that have a log on disk, for the daemon's
// reconcile to remove those of sandboxes it has no record of.
func (l *Log) IDs() ([]string, error) {
	entries, err := os.ReadDir(l.cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("listing event logs: %w", err)
	}
	seen := map[string]bool{}
	var ids []string
	for _, e := range entries {
		name := strings.TrimSuffix(strings.TrimSuffix(e.Name(), ".jsonl"), ".1")
		if api.IsSandboxID(name) && !seen[name] {
			seen[name] = true
			ids = append(ids, name)
		}
	}
	return ids, nil
}
