package server

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/telemetry/execlog"
	"github.com/paddock-dev/paddock/internal/telemetry/hub"
	"github.com/paddock-dev/paddock/wire"
)

// SetTelemetry sets where metrics, events and exec output come from and
// go; without it the telemetry routes answer 503.
func (s *Server) SetTelemetry(h *hub.Hub) { s.tel = h }

// telemetryRoutes are metrics (JSON and Prometheus), events and kept exec
// output.
func (s *Server) telemetryRoutes() []route {
	return []route{
		{"GET /v1/metrics", s.allMetrics},
		{"GET /metrics", s.prometheus},
		{"GET /v1/sandboxes/{id}/metrics", s.sandboxMetrics},
		{"GET /v1/sandboxes/{id}/events", s.sandboxEvents},
		{"GET /v1/sandboxes/{id}/logs", s.sandboxLogs},
	}
}

// execStarted hands a process that just started to the exec log, and
// returns the copy of its output (nil without telemetry). Its events come
// after the sandbox's created event: an exec right after a create can
// start before telemetry has heard of the create.
func (s *Server) execStarted(ctx context.Context, id string, gc *guestapi.Client, pid int, cmd []string) *hub.ExecCopy {
	if s.tel == nil || pid <= 0 || s.mgr.Observed(ctx, id) != nil {
		return nil
	}
	ctr, err := s.mgr.ContainerKey(id, containerOf(ctx))
	if err != nil {
		return nil // the container ended with the exec's start
	}
	return s.tel.ExecStarted(id, ctr, gc, pid, cmd)
}

// telemetry returns the hub, or answers 503 and nil.
func (s *Server) telemetry(w http.ResponseWriter, r *http.Request) *hub.Hub {
	if s.tel == nil {
		writeError(w, r, s.log, errdefs.New(errdefs.ErrUnavailable, "telemetry is not configured on this daemon"))
	}
	return s.tel
}

// known checks that the path's sandbox exists, and that telemetry has
// heard of it (a create answers before that).
func (s *Server) known(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.PathValue("id")
	if err := s.mgr.Observed(r.Context(), id); err != nil {
		writeError(w, r, s.log, err)
		return "", false
	}
	return id, true
}

// timeParam reads an RFC 3339 time or a duration back from now ("10m").
func timeParam(r *http.Request, name string, now time.Time, def time.Time) (time.Time, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, errdefs.Invalid(name, "%q is neither an RFC 3339 time nor a duration such as 10m", v)
}

func uintParam(r *http.Request, name string) (uint64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(v, 10, 63)
	if err != nil {
		return 0, errdefs.Invalid(name, "%q is not a non-negative integer", v)
	}
	return n, nil
}

func (s *Server) allMetrics(w http.ResponseWriter, r *http.Request) {
	if h := s.telemetry(w, r); h != nil {
		writeJSON(w, http.StatusOK, h.Latest())
	}
}

func (s *Server) prometheus(w http.ResponseWriter, r *http.Request) {
	if h := s.telemetry(w, r); h != nil {
		promhttp.HandlerFor(h.Registry(), promhttp.HandlerOpts{ErrorLog: slogPrinter{s}}).ServeHTTP(w, r)
	}
}

// slogPrinter logs promhttp's errors.
type slogPrinter struct{ s *Server }

func (p slogPrinter) Println(v ...any) { p.s.log.Warn("serving prometheus metrics", "err", v) }

// maxHistory is how far back a metrics history may reach.
const maxHistory = 7 * 24 * time.Hour

func (s *Server) sandboxMetrics(w http.ResponseWriter, r *http.Request) {
	h := s.telemetry(w, r)
	if h == nil {
		return
	}
	id, ok := s.known(w, r)
	if !ok {
		return
	}
	now := time.Now()
	from, err := timeParam(r, "since", now, now.Add(-15*time.Minute))
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	to, err := timeParam(r, "until", now, now)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	if to.Before(from) {
		writeError(w, r, s.log, errdefs.Invalid("until", "is before since"))
		return
	}
	if from.Before(now.Add(-maxHistory)) {
		from = now.Add(-maxHistory)
	}
	var m api.Metrics
	if name := containerOf(r.Context()); name != "" {
		m, err = h.ContainerMetrics(id, name, from, to)
	} else {
		m, err = h.Metrics(id, from, to)
	}
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	writeJSON(w, http.StatusOK, m)
}

var eventTypes = map[string]bool{"lifecycle": true, "exec": true, "oom": true, "limits": true, "snapshot": true,
	"fork": true, "pause": true, "policy": true, "request": true, "budget": true, "autoscale": true}

func (s *Server) sandboxEvents(w http.ResponseWriter, r *http.Request) {
	h := s.telemetry(w, r)
	if h == nil {
		return
	}
	id, ok := s.known(w, r)
	if !ok {
		return
	}
	var q hub.EventQuery
	var err error
	if q.After, err = uintParam(r, "after"); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	if q.Since, err = timeParam(r, "since", time.Now(), time.Time{}); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	if v := r.URL.Query().Get("type"); v != "" {
		for _, t := range strings.Split(v, ",") {
			if !eventTypes[t] {
				writeError(w, r, s.log, errdefs.Invalid("type", "%q is not an event type", t))
				return
			}
			q.Types = append(q.Types, t)
		}
	}
	limit, err := uintParam(r, "limit")
	if err != nil || limit > 1000 {
		writeError(w, r, s.log, errdefs.Invalid("limit", "must be 0..1000"))
		return
	}
	q.Limit = int(limit)
	follow, err := boolParam(r, "follow")
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	if !follow {
		evs, err := h.Events(id, q)
		if err != nil {
			writeError(w, r, s.log, err)
			return
		}
		writeJSON(w, http.StatusOK, api.Events{Events: evs})
		return
	}
	ch, err := h.FollowEvents(r.Context(), id, q.After)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	rc.Flush()
	enc := json.NewEncoder(w)
	want := map[string]bool{}
	for _, t := range q.Types {
		want[t] = true
	}
	for e := range ch {
		if (len(want) > 0 && !want[e.Type]) || e.Time.Before(q.Since) {
			continue
		}
		if enc.Encode(e) != nil || rc.Flush() != nil {
			return
		}
	}
}

// sandboxLogs lists the processes with kept output or, with ?exec=PID,
// streams one's output as frames (stdout, stderr, dropped, then exit if it
// has ended) from ?from=OFFSET; with follow=1 until the process ends.
func (s *Server) sandboxLogs(w http.ResponseWriter, r *http.Request) {
	h := s.telemetry(w, r)
	if h == nil {
		return
	}
	id, ok := s.known(w, r)
	if !ok {
		return
	}
	ctr, err := s.mgr.ContainerKey(id, containerOf(r.Context()))
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	v := r.URL.Query().Get("exec")
	if v == "" {
		logs, err := h.Logs(id)
		if err != nil {
			writeError(w, r, s.log, err)
			return
		}
		if r.URL.Query().Has(api.ContainerParam) {
			logs = slices.DeleteFunc(logs, func(l api.ExecLog) bool { return l.Container != ctr })
		}
		writeJSON(w, http.StatusOK, logs)
		return
	}
	pid, err := strconv.Atoi(v)
	if err != nil || pid <= 0 {
		writeError(w, r, s.log, errdefs.Invalid("exec", "%q is not a process id", v))
		return
	}
	from, err := uintParam(r, "from")
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	follow, err := boolParam(r, "follow")
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	p, err := h.Log(id, ctr, pid)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	w.Header().Set("Content-Type", api.StreamContentType)
	w.Header().Set("X-Paddock-Pid", strconv.Itoa(pid))
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	out := wire.NewWriter(w)
	next := int64(from)
	err = h.ReadLog(r.Context(), id, p.Seq, next, follow, func(c execlog.Chunk) error {
		if c.Offset > next {
			b, _ := json.Marshal(map[string]int64{"bytes": c.Offset - next})
			if err := out.Write(wire.Dropped, b); err != nil {
				return err
			}
		}
		next = c.Offset + int64(len(c.Data))
		if err := out.Write(c.Stream, c.Data); err != nil {
			return err
		}
		return rc.Flush()
	})
	if err != nil {
		if r.Context().Err() == nil {
			e, _ := json.Marshal(api.Error{Code: errdefs.Code(err), Message: err.Error()})
			out.Write(wire.Error, e)
		}
		return
	}
	// The exit frame ends the stream once the process has ended.
	if p, err = h.Log(id, ctr, pid); err == nil && p.Exit != nil {
		b, _ := json.Marshal(p.Exit)
		out.Write(wire.Exit, b)
	}
	rc.Flush()
}
