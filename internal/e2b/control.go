package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/sandbox"
)

// Labels that carry E2B's view of a sandbox in paddock's record, so that
// create costs no write beyond the manager's own.
const (
	metaPrefix = "e2b.meta/"
	// labelAutoPause marked autoPause sandboxes of daemons before the
	// record's on_timeout; it is still left out of their metadata.
	labelAutoPause = "e2b.auto-pause"
	clientID       = "paddock"
	// defaultTimeout is E2B's default sandbox lifetime, in seconds.
	defaultTimeout = 300
	maxListLimit   = 1000
)

var metaKeyPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]{0,53}$`)

func (s *Server) controlRoutes() *http.ServeMux {
	mux := http.NewServeMux()
	for _, r := range []struct {
		pattern string
		h       http.HandlerFunc
	}{
		{"POST /sandboxes", s.create},
		{"POST /v2/sandboxes", s.create},
		{"GET /sandboxes", s.listV1},
		{"GET /v2/sandboxes", s.listV2},
		{"GET /sandboxes/{id}", s.info},
		{"DELETE /sandboxes/{id}", s.kill},
		{"POST /sandboxes/{id}/timeout", s.setTimeout},
		{"POST /sandboxes/{id}/refreshes", s.refresh},
		{"POST /sandboxes/{id}/pause", s.pause},
		{"POST /sandboxes/{id}/resume", s.connect},
		{"POST /sandboxes/{id}/connect", s.connect},
		{"POST /v2/sandboxes/{id}/connect", s.connect},
		{"GET /sandboxes/{id}/metrics", s.metrics},
		{"POST /sandboxes/{id}/snapshots", s.createSnapshot},
		{"GET /snapshots", s.listSnapshots},
		{"DELETE /templates/{id}", s.deleteSnapshot},
		{"POST /sandboxes/{id}/fork", s.fork},
		{"PUT /sandboxes/{id}/network", s.updateNetwork},
		{"GET " + SignerPath, s.lookupSigner},
	} {
		mux.HandleFunc(r.pattern, r.h)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeAPIError(w, http.StatusNotFound, fmt.Sprintf("no such endpoint: %s %s", r.Method, r.URL.Path))
	})
	return mux
}

// fail answers a control-plane or /files call with err's status
// (paddock's one mapping, errdefs.HTTPStatus) in E2B's error body.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	code := errdefs.HTTPStatus(err)
	msg := err.Error()
	setMoved(w, err)
	if code >= 500 && code != http.StatusServiceUnavailable {
		s.log.Error("E2B request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		msg = "internal error; see the daemon log"
	}
	writeAPIError(w, code, msg)
}

// createRequest is the body of POST /sandboxes and /v2/sandboxes. Fields
// paddock has no counterpart for (network, mcp, volumeMounts, ...) are
// accepted and ignored, as an older server would.
type createRequest struct {
	TemplateID string            `json:"templateID"`
	Timeout    *int64            `json:"timeout"`
	Metadata   map[string]string `json:"metadata"`
	EnvVars    map[string]string `json:"envVars"`
	AutoPause  bool              `json:"autoPause"`
	AutoResume *struct {
		Enabled bool `json:"enabled"`
	} `json:"autoResume"`
	AllowInternetAccess *bool          `json:"allow_internet_access"`
	Network             *networkConfig `json:"network"`
}

// decodeBody reads a JSON body (empty is allowed) into v.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("%w: request body exceeds 1 MiB", errdefs.ErrTooLarge)
	}
	if strings.TrimSpace(string(b)) == "" {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		var ute *json.UnmarshalTypeError
		if errors.As(err, &ute) {
			return errdefs.Invalid(ute.Field, "expected %s, got JSON %s", ute.Type, ute.Value)
		}
		return errdefs.Invalid("body", "malformed JSON: %v", err)
	}
	return nil
}

// sandboxRef is the answer to create and connect.
type sandboxRef struct {
	SandboxID       string  `json:"sandboxID"`
	TemplateID      string  `json:"templateID"`
	ClientID        string  `json:"clientID"`
	EnvdVersion     string  `json:"envdVersion"`
	EnvdAccessToken string  `json:"envdAccessToken"`
	Domain          *string `json:"domain"`
	// TrafficAccessToken is set for a sandbox whose ports are not
	// public (allowPublicTraffic false).
	TrafficAccessToken *string `json:"trafficAccessToken"`
}

func (s *Server) ref(sb api.Sandbox) sandboxRef {
	ref := sandboxRef{SandboxID: sb.ID, TemplateID: templateOf(sb), ClientID: clientID, EnvdVersion: EnvdVersion, EnvdAccessToken: s.accessToken(sb.ID), Domain: s.domainRef()}
	if sb.Labels[labelPrivate] != "" {
		t := s.trafficToken(sb.ID)
		ref.TrafficAccessToken = &t
	}
	return ref
}

// domainRef is the sandboxes' domain as create and getInfo answer it.
func (s *Server) domainRef() *string {
	if s.domain == "" {
		return nil
	}
	d := s.domain
	return &d
}

// timeoutParam is a request's timeout in seconds, def when not given: a
// positive int32, as E2B's API has it.
func timeoutParam(v *int64, def int64) (int64, error) {
	t := def
	if v != nil {
		t = *v
	}
	if t <= 0 || t > math.MaxInt32 {
		return 0, errdefs.Invalid("timeout", "%d is not a positive number of seconds", t)
	}
	return t, nil
}

func templateOf(sb api.Sandbox) string {
	if sb.From != "" {
		return sb.From
	}
	return sb.Image
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var req createRequest
	if err := decodeBody(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	timeout, err := timeoutParam(req.Timeout, defaultTimeout)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	labels := map[string]string{}
	for k, v := range req.Metadata {
		if !metaKeyPattern.MatchString(k) {
			s.fail(w, r, errdefs.Invalid("metadata", "key %q must be 1-54 letters, digits, '.', '_', '/' or '-', starting with a letter or digit", k))
			return
		}
		labels[metaPrefix+k] = v
	}
	var nc networkConfig
	if req.Network != nil {
		nc = *req.Network
		nc.AllowInternetAccess = nil // a create's is beside network
	}
	policy, err := s.policy(nc, req.AllowInternetAccess)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer s.releaseSecrets(policy)
	networkLabels(labels, nc, req.AllowInternetAccess)
	creq := api.CreateRequest{Env: req.EnvVars, Labels: labels, Workdir: homeOf(DefaultUser)}
	if len(policy.Allow)+len(policy.Deny)+len(policy.Presets)+len(policy.Secrets) > 0 {
		creq.Policy = policy
	}
	// Without autoResume, a paused sandbox stays paused until connect:
	// envd calls to it fail as E2B's do.
	autoResume := req.AutoResume != nil && req.AutoResume.Enabled
	creq.AutoResume = &autoResume
	template := req.TemplateID
	if template == "" {
		template = DefaultTemplate
	}
	// From takes an image name, a template name or a snapshot id; an
	// E2B snapshot name is resolved to its newest snapshot.
	if id := s.snapshotFor(r.Context(), template); id != "" {
		template = id
	}
	creq.From = template
	creq.TimeoutSeconds = timeout
	if req.AutoPause {
		creq.OnTimeout = api.TimeoutPause
	}
	sb, err := s.mgr.Create(r.Context(), creq)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.ref(sb))
}

// detail is a sandbox as getInfo and list describe it.
type detail struct {
	SandboxID       string            `json:"sandboxID"`
	TemplateID      string            `json:"templateID"`
	ClientID        string            `json:"clientID"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	Domain          *string           `json:"domain"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int64             `json:"memoryMB"`
	DiskSizeMB      int64             `json:"diskSizeMB"`
	Metadata        map[string]string `json:"metadata"`
	State           string            `json:"state"`
	// AllowInternetAccess is what the create said, nil when it said
	// nothing.
	AllowInternetAccess *bool `json:"allowInternetAccess,omitempty"`
}

// stateOf is E2B's state of a sandbox: running or paused; "" for states
// E2B has no name for (failed, being created), which are not listed.
func stateOf(st api.State) string {
	switch st {
	case api.StateRunning, api.StateFrozen:
		return "running"
	case api.StatePaused, api.StateStopped:
		return "paused"
	}
	return ""
}

// metadataOf is a sandbox's E2B metadata: the labels set through this
// facade, and those set through the native API as they are.
func metadataOf(sb api.Sandbox) map[string]string {
	md := map[string]string{}
	for k, v := range sb.Labels {
		switch {
		case strings.HasPrefix(k, metaPrefix):
			md[strings.TrimPrefix(k, metaPrefix)] = v
		case k == labelAutoPause, k == labelInternet, k == labelPrivate, k == labelMaskHost:
		default:
			md[k] = v
		}
	}
	return md
}

func (s *Server) detail(sb api.Sandbox) detail {
	d := detail{
		SandboxID: sb.ID, TemplateID: templateOf(sb), ClientID: clientID,
		StartedAt: sb.CreatedAt, EndAt: sb.CreatedAt, EnvdVersion: EnvdVersion,
		CPUCount:   int(math.Ceil(sb.Resources.CPUs)),
		MemoryMB:   sb.Resources.MemoryBytes >> 20,
		DiskSizeMB: sb.Resources.DiskBytes >> 20,
		Metadata:   metadataOf(sb),
		State:      stateOf(sb.State),
		Domain:     s.domainRef(),
	}
	if sb.ExpiresAt != nil {
		d.EndAt = *sb.ExpiresAt
	}
	if v, ok := sb.Labels[labelInternet]; ok {
		on := v == "true"
		d.AllowInternetAccess = &on
	}
	return d
}

func (s *Server) info(w http.ResponseWriter, r *http.Request) {
	sb, err := s.mgr.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	d := s.detail(sb)
	d.EnvdAccessToken = s.accessToken(sb.ID)
	writeJSON(w, http.StatusOK, d)
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := s.mgr.Remove(r.Context(), id, true); err != nil {
		s.fail(w, r, err)
		return
	}
	s.forget(id)
	s.sweepSoon()
	w.WriteHeader(http.StatusNoContent)
}

// forget drops what the facade holds in memory for a removed sandbox.
func (s *Server) forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.tags, id)
}

type timeoutRequest struct {
	Timeout *int64 `json:"timeout"`
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	var req timeoutRequest
	if err := decodeBody(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.Timeout == nil || *req.Timeout < 0 || *req.Timeout > math.MaxInt32 {
		s.fail(w, r, errdefs.Invalid("timeout", "must be a number of seconds from 0"))
		return
	}
	if err := s.extend(r.Context(), r.PathValue("id"), time.Duration(*req.Timeout)*time.Second, false); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// refresh is the older keep-alive: {duration} seconds more, at most an
// hour, never shortening.
func (s *Server) refresh(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Duration int64 `json:"duration"`
	}
	if err := decodeBody(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.Duration < 0 || req.Duration > 3600 {
		s.fail(w, r, errdefs.Invalid("duration", "must be 0 to 3600 seconds"))
		return
	}
	if err := s.extend(r.Context(), r.PathValue("id"), time.Duration(req.Duration)*time.Second, true); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// extend makes sandbox id's timeout be up d from now (a kill, or a pause
// for those created with autoPause: the record's OnTimeout); with
// onlyLater an earlier end is kept.
func (s *Server) extend(ctx context.Context, id string, d time.Duration, onlyLater bool) error {
	sb, err := s.mgr.Get(ctx, id)
	if err != nil {
		return err
	}
	end := time.Now().Add(d)
	if onlyLater && sb.ExpiresAt != nil && sb.ExpiresAt.After(end) {
		return nil
	}
	if d == 0 {
		// E2B ends (or pauses) the sandbox now; paddock's 0 would mean
		// "never".
		d = time.Millisecond
	}
	_, err = s.mgr.SetTimeout(ctx, id, d)
	return err
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	sb, err := s.mgr.Get(r.Context(), id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if sb.State == api.StatePaused {
		s.fail(w, r, errdefs.Conflict("sandbox %s is already paused", id))
		return
	}
	if _, err := s.mgr.Pause(r.Context(), id); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.hold(r.Context(), id); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// hold stops a paused sandbox's timeout: E2B keeps paused sandboxes until
// they are killed or resumed.
func (s *Server) hold(ctx context.Context, id string) error {
	_, err := s.mgr.SetTimeout(ctx, id, 0)
	return err
}

// connect answers with the sandbox, resuming it first if it is paused
// (201) or as it is (200); a timeout given is applied from now on
// resume and extends a running sandbox's.
func (s *Server) connect(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var req timeoutRequest
	if err := decodeBody(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.Timeout != nil && (*req.Timeout <= 0 || *req.Timeout > math.MaxInt32) {
		s.fail(w, r, errdefs.Invalid("timeout", "%d is not a positive number of seconds", *req.Timeout))
		return
	}
	sb, err := s.mgr.Get(r.Context(), id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	code := http.StatusOK
	switch sb.State {
	case api.StatePaused, api.StateStopped, api.StateFrozen:
		d := time.Duration(defaultTimeout) * time.Second
		if req.Timeout != nil {
			d = time.Duration(*req.Timeout) * time.Second
		}
		err = s.resume(r.Context(), id, d)
		code = http.StatusCreated
	case api.StateRunning:
		if req.Timeout != nil {
			err = s.extend(r.Context(), id, time.Duration(*req.Timeout)*time.Second, true)
		}
	default:
		err = errdefs.Conflict("sandbox %s is %s", id, sb.State)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, code, s.ref(sb))
}

// resume brings a paused sandbox back and gives it d to live.
func (s *Server) resume(ctx context.Context, id string, d time.Duration) error {
	if _, err := s.mgr.Resume(ctx, id); err != nil {
		return err
	}
	return s.extend(ctx, id, d, false)
}

// listFilter selects sandboxes for list, and orders them.
type listFilter struct {
	metadata map[string]string
	states   map[string]bool
	// template, when set, is the templateID (or image) listed.
	template string
	// startedAfter, when set, leaves out sandboxes started before it.
	startedAfter time.Time
	// ascending lists the oldest first; E2B's default is newest first.
	ascending bool
}

func parseListFilter(q url.Values, defaultStates ...string) (listFilter, error) {
	f := listFilter{metadata: map[string]string{}, states: map[string]bool{}}
	if raw := q.Get("metadata"); raw != "" {
		// The SDKs encode each key and value, then the whole query.
		pairs, err := url.ParseQuery(raw)
		if err != nil {
			return f, errdefs.Invalid("metadata", "%q is not key=value pairs", raw)
		}
		for k, vs := range pairs {
			dk, err1 := url.QueryUnescape(k)
			dv, err2 := url.QueryUnescape(vs[0])
			if err1 != nil || err2 != nil {
				return f, errdefs.Invalid("metadata", "%q is not URL-encoded", raw)
			}
			f.metadata[dk] = dv
		}
	}
	for _, v := range q["state"] {
		for _, st := range strings.Split(v, ",") {
			if st != "running" && st != "paused" {
				return f, errdefs.Invalid("state", "%q is not running or paused", st)
			}
			f.states[st] = true
		}
	}
	if len(f.states) == 0 {
		for _, st := range defaultStates {
			f.states[st] = true
		}
	}
	switch o := q.Get("order"); o {
	case "", "desc":
	case "asc":
		f.ascending = true
	default:
		return f, errdefs.Invalid("order", "%q is not asc or desc", o)
	}
	if v := q.Get("startedAfter"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return f, errdefs.Invalid("startedAfter", "%q is not an RFC 3339 date-time", v)
		}
		f.startedAfter = t
	}
	if v := q.Get("template"); v != "" {
		if len(v) > 256 || strings.ContainsAny(v, "\x00\n") {
			return f, errdefs.Invalid("template", "%q is not a template name", v)
		}
		f.template = v
	}
	return f, nil
}

func (s *Server) list(ctx context.Context, f listFilter) []detail {
	var out []detail
	for _, sb := range s.mgr.List(ctx, sandbox.Filter{}) {
		d := s.detail(sb)
		if d.State == "" || !f.states[d.State] || d.StartedAt.Before(f.startedAfter) {
			continue
		}
		if f.template != "" && d.TemplateID != f.template && sb.Image != f.template {
			continue
		}
		match := true
		for k, v := range f.metadata {
			if got, ok := d.Metadata[k]; !ok || got != v {
				match = false
				break
			}
		}
		if match {
			out = append(out, d)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].StartedAt.Equal(out[j].StartedAt) {
			return out[i].StartedAt.After(out[j].StartedAt) != f.ascending
		}
		return out[i].SandboxID < out[j].SandboxID
	})
	return out
}

func (s *Server) listV1(w http.ResponseWriter, r *http.Request) {
	f, err := parseListFilter(r.URL.Query(), "running")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := s.list(r.Context(), f)
	if out == nil {
		out = []detail{}
	}
	writeJSON(w, http.StatusOK, out)
}

// listV2 pages through the sandboxes, newest first; X-Next-Token names
// the first sandbox of the next page.
func (s *Server) listV2(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f, err := parseListFilter(q, "running", "paused")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	limit, err := limitParam(q.Get("limit"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	all := s.list(r.Context(), f)
	start, err := pageStart(q.Get("nextToken"), len(all), func(i int) (time.Time, string) { return all[i].StartedAt, all[i].SandboxID }, f.ascending)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	page := all[start:]
	if len(page) > limit {
		w.Header().Set("X-Next-Token", pageToken(page[limit].StartedAt, page[limit].SandboxID))
		page = page[:limit]
	}
	if page == nil {
		page = []detail{}
	}
	writeJSON(w, http.StatusOK, page)
}

// pageToken names where a list page starts: the time (Unix nanoseconds)
// and id of its first item, so that the page is found even when that
// item is gone.
func pageToken(at time.Time, id string) string {
	return strconv.FormatInt(at.UnixNano(), 10) + "_" + id
}

// pageStart is the index in a list of n items, ordered by key (time, then
// id; newest first unless ascending), where the page tok names starts: 0
// for no token.
func pageStart(tok string, n int, key func(int) (time.Time, string), ascending bool) (int, error) {
	if tok == "" {
		return 0, nil
	}
	ns, id, ok := strings.Cut(tok, "_")
	t, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil || len(id) > 128 || id == "" {
		return 0, errdefs.Invalid("nextToken", "%q is not a token this API gave", tok)
	}
	at := time.Unix(0, t)
	// The first item at or past the token's place in the order.
	return sort.Search(n, func(i int) bool {
		it, iid := key(i)
		if !it.Equal(at) {
			return it.After(at) == ascending
		}
		return iid >= id
	}), nil
}

// metric is one sample of getMetrics.
type metric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// maxMetricsRange is how far back getMetrics' start may reach (the
// telemetry hub keeps a week).
const maxMetricsRange = 7 * 24 * time.Hour

// metrics answers with the telemetry hub's samples of the sandbox, the
// ones /v1/sandboxes/{id}/metrics shows: the latest while it runs, or
// those between ?start= and ?end= (Unix seconds). E2B's cpuUsedPct is a
// share of the sandbox's CPUs; paddock's cpu_percent is of one core:
// cpuUsedPct is cpu_percent / cpus.
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	if s.tel == nil {
		s.fail(w, r, errdefs.New(errdefs.ErrUnavailable, "telemetry is not configured on this daemon"))
		return
	}
	id := r.PathValue("id")
	sb, err := s.mgr.Get(r.Context(), id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	now := time.Now()
	q := r.URL.Query()
	from, err := unixParam(q, "start", now.Add(-maxMetricsRange))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	to, err := unixParam(q, "end", now)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if from.Before(now.Add(-maxMetricsRange)) {
		from = now.Add(-maxMetricsRange)
	}
	if to.Before(from) {
		s.fail(w, r, errdefs.Invalid("end", "is before start"))
		return
	}
	if to.Before(sb.CreatedAt.Truncate(time.Second)) {
		// Nothing was measured before the sandbox existed.
		writeJSON(w, http.StatusOK, []metric{})
		return
	}
	// A create answers before telemetry hears of the sandbox.
	if err := s.mgr.Observed(r.Context(), id); err != nil {
		s.fail(w, r, err)
		return
	}
	m, err := s.tel.Metrics(id, from, to)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := []metric{}
	if q.Has("start") || q.Has("end") {
		for _, smp := range m.History {
			out = append(out, metricOf(sb, smp))
		}
	} else if m.Current != nil && (sb.State == api.StateRunning || sb.State == api.StateFrozen) {
		out = append(out, metricOf(sb, *m.Current))
	}
	writeJSON(w, http.StatusOK, out)
}

// metricOf is one telemetry sample as E2B describes it.
func metricOf(sb api.Sandbox, smp api.Sample) metric {
	m := metric{
		Timestamp: smp.Time.UTC(), TimestampUnix: smp.Time.Unix(),
		CPUCount: int(math.Ceil(sb.Resources.CPUs)),
		MemUsed:  smp.MemoryBytes, MemTotal: smp.MemoryLimitBytes,
		DiskUsed: smp.DiskUsedBytes, DiskTotal: smp.DiskBytes,
	}
	if sb.Resources.CPUs > 0 {
		m.CPUUsedPct = math.Min(100, smp.CPUPercent/sb.Resources.CPUs)
	}
	if m.MemTotal <= 0 {
		m.MemTotal = sb.Resources.MemoryBytes
	}
	if m.DiskTotal <= 0 {
		m.DiskTotal = sb.Resources.DiskBytes
	}
	return m
}

// unixParam reads a time given in Unix seconds.
func unixParam(q url.Values, name string, def time.Time) (time.Time, error) {
	v := q.Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, errdefs.Invalid(name, "%q is not a Unix time in seconds", v)
	}
	return time.Unix(n, 0), nil
}
