package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/paddock-dev/paddock/internal/shrink"
	"github.com/paddock-dev/paddock/internal/telemetry/metrics"
)

// OOMWatch turns a rise in a sandbox's OOM kill count, as the sampler
// sees it, into an oom event. It is a metrics.Observer. The count it last
// reported is kept in the event itself (OOMData.Total), so a daemon
// restart neither repeats nor misses a kill.
type OOMWatch struct {
	log *Log

	// last holds the sandboxes it watches: those Started or Resumed, and
	// not Forgotten since. Observe leaves any other id alone: the sampler
	// may still report a sandbox a moment after its removal, which must
	// not bring it back here (nor its event log's state): a thousand
	// removals left 78 such ids, each pinning a page of the heap allocated
	// at their peak (issue 21).
	mu       sync.Mutex
	last     map[string]oomTotal
	lastPeak int // for shrink.Map
}

// oomTotal is the kill count last seen of a sandbox; one resumed after a
// daemon restart has it read from its event log first.
type oomTotal struct {
	kills uint64
	known bool
}

var _ metrics.Observer = (*OOMWatch)(nil)

// NewOOMWatch returns an OOMWatch writing to log.
func NewOOMWatch(log *Log) *OOMWatch {
	return &OOMWatch{log: log, last: map[string]oomTotal{}}
}

// Observe implements metrics.Observer.
func (w *OOMWatch) Observe(id string, s metrics.Sample) {
	w.mu.Lock()
	t, ok := w.last[id]
	w.mu.Unlock()
	if !ok {
		return // not watched, or forgotten since the sampler read it
	}
	last := t.kills
	if !t.known {
		last = w.lastReported(id)
	}
	// A count below the last one is a new cgroup (the sandbox started
	// again), counting from zero: it only moves the baseline.
	if s.OOMKills > last {
		d := OOMData{Kills: s.OOMKills - last, Total: s.OOMKills, MemoryLimitBytes: s.MemoryLimitBytes}
		msg := fmt.Sprintf("the OOM killer killed %d process(es) at the memory limit of %d MiB", d.Kills, d.MemoryLimitBytes>>20)
		if _, err := w.log.Append(id, Event{Type: OOM, Time: s.Time, Message: msg, Data: Data(d)}); err != nil && !errors.Is(err, ErrRemoved) {
			w.log.log.Warn("recording oom event", "sandbox", id, "err", err)
		}
	}
	w.mu.Lock()
	if _, ok := w.last[id]; ok {
		w.last[id] = oomTotal{kills: s.OOMKills, known: true}
	}
	w.mu.Unlock()
}

// lastReported is the total of id's last oom event, 0 if none.
func (w *OOMWatch) lastReported(id string) uint64 {
	evs, err := w.log.List(id, Query{Types: []Type{OOM}, Limit: 1000})
	if err != nil || len(evs) == 0 {
		return 0
	}
	var d OOMData
	if json.Unmarshal(evs[len(evs)-1].Data, &d) != nil {
		return 0
	}
	return d.Total
}

// Forget drops what is known of id (the sandbox was stopped or deleted).
func (w *OOMWatch) Forget(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.last, id)
	w.last = shrink.Map(w.last, &w.lastPeak)
}

// Started tells w that sandbox id got a new cgroup (it was started again),
// whose count starts at zero whatever the earlier events said.
func (w *OOMWatch) Started(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.last[id] = oomTotal{known: true}
}

// Resumed tells w to watch sandbox id, found running (a daemon restart):
// the total its last oom event recorded is the count already reported.
func (w *OOMWatch) Resumed(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.last[id]; !ok {
		w.last[id] = oomTotal{}
	}
}
