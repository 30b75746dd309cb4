package sandbox

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// A sandbox's egress requests live in its record (record.Requests), so
// they survive restarts and go with it. A sandbox asks; a person decides;
// an approval is a grant in the policy the egress path applies
// (effectivePolicy), never in the policy the API shows and replaces.
const (
	// maxPendingRequests bounds a sandbox's undecided requests: past it,
	// an ask answers 429 until someone decides.
	maxPendingRequests = 16
	// maxRequests bounds those its record keeps: the oldest denied or
	// ended ones make room.
	maxRequests = 64
	// maxRequestText bounds a reason or a note.
	maxRequestText = 500
)

// AskEgress files sandbox id's request for a host, or returns the one
// pending or approved for it already (made false). auto marks a request
// a refusal made (policy mode "ask"), whose reason is the daemon's.
func (m *Manager) AskEgress(ctx context.Context, id string, ask api.RequestAsk, auto bool) (api.EgressRequest, bool, error) {
	if m.cfg.Egress == nil {
		return api.EgressRequest{}, false, errdefs.New(errdefs.ErrUnavailable, "this daemon has no network egress")
	}
	host, err := askHost(ask.Host)
	if err != nil {
		return api.EgressRequest{}, false, err
	}
	if err := m.cfg.Egress.ValidatePolicy(&api.Policy{Allow: []api.PolicyRule{{Match: host}}}); err != nil {
		return api.EgressRequest{}, false, errdefs.Invalid("host", "%q is not a host a rule can allow", host)
	}
	reason := strings.TrimSpace(ask.Reason)
	if auto {
		reason = printable(reason)
	} else if err := checkText("reason", reason); err != nil {
		return api.EgressRequest{}, false, err
	}
	b, err := m.lookup(id)
	if err != nil {
		return api.EgressRequest{}, false, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	pending := 0
	for _, r := range b.rec.Requests {
		r = requestView(r, now)
		if r.Host == host && (r.State == api.RequestPending || r.State == api.RequestApproved) {
			return r, false, nil
		}
		if r.State == api.RequestPending {
			pending++
		}
	}
	if pending >= maxPendingRequests {
		return api.EgressRequest{}, false, errdefs.New(errdefs.ErrTooMany, "sandbox %s has %d requests waiting for a decision; wait for one before asking again", id, pending)
	}
	if len(b.rec.Requests) >= maxRequests {
		i := slices.IndexFunc(b.rec.Requests, func(r api.EgressRequest) bool {
			s := requestView(r, now).State
			return s == api.RequestDenied || s == api.RequestExpired
		})
		if i < 0 {
			return api.EgressRequest{}, false, errdefs.New(errdefs.ErrTooMany, "sandbox %s holds %d requests, none of them ended", id, len(b.rec.Requests))
		}
		b.rec.Requests = slices.Delete(b.rec.Requests, i, i+1)
	}
	b.rec.RequestSeq++
	req := api.EgressRequest{ID: id + "." + strconv.Itoa(b.rec.RequestSeq), Sandbox: id, Host: host, Reason: reason,
		Auto: auto, State: api.RequestPending, Created: now}
	b.rec.Requests = append(b.rec.Requests, req)
	m.persistLocked(b)
	m.notify(b).Event(id, "request", fmt.Sprintf("request %s: asks for %s", req.ID, host), req)
	m.log.Info("egress request", "sandbox", id, "request", req.ID, "host", host, "auto", auto)
	return req, true, nil
}

// EgressRequests lists sandbox id's requests (every sandbox's when id is
// empty), oldest first.
func (m *Manager) EgressRequests(ctx context.Context, id string) ([]api.EgressRequest, error) {
	var boxes []*box
	if id != "" {
		b, err := m.lookup(id)
		if err != nil {
			return nil, err
		}
		boxes = []*box{b}
	} else {
		m.mu.Lock()
		for _, b := range m.boxes {
			if !b.gone {
				boxes = append(boxes, b)
			}
		}
		m.mu.Unlock()
	}
	now := time.Now()
	out := []api.EgressRequest{}
	for _, b := range boxes {
		b.mu.Lock()
		for _, r := range b.rec.Requests {
			out = append(out, requestView(r, now))
		}
		b.mu.Unlock()
	}
	slices.SortStableFunc(out, func(a, b api.EgressRequest) int { return cmp.Compare(a.Created.UnixNano(), b.Created.UnixNano()) })
	return out, nil
}

// DecideEgress approves or denies request rid of sandbox id, as by (who
// decided, for the audit event). An approval widens the sandbox's policy
// by the request's host at once (until d's duration ends, for one use,
// or for the sandbox's life); a denial of an approved request revokes it.
func (m *Manager) DecideEgress(ctx context.Context, id, rid string, approve bool, d api.RequestDecision, by string) (api.EgressRequest, error) {
	switch {
	case d.DurationSeconds < 0:
		return api.EgressRequest{}, errdefs.Invalid("duration_seconds", "must not be negative")
	case d.Once && d.DurationSeconds > 0:
		return api.EgressRequest{}, errdefs.Invalid("once", "an approval is for one use or for a time, not both")
	case !approve && (d.Once || d.DurationSeconds > 0):
		return api.EgressRequest{}, errdefs.Invalid("decision", "a denial takes no duration")
	case d.DurationSeconds > 10*365*24*3600:
		return api.EgressRequest{}, errdefs.Invalid("duration_seconds", "at most ten years")
	}
	note := strings.TrimSpace(d.Note)
	if err := checkText("note", note); err != nil {
		return api.EgressRequest{}, err
	}
	if m.cfg.Egress == nil {
		return api.EgressRequest{}, errdefs.New(errdefs.ErrUnavailable, "this daemon has no network egress")
	}
	b, err := m.lookup(id)
	if err != nil {
		return api.EgressRequest{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	i := slices.IndexFunc(b.rec.Requests, func(r api.EgressRequest) bool { return r.ID == rid })
	if i < 0 {
		return api.EgressRequest{}, errdefs.NotFound("request", rid)
	}
	mv, err := next(b, actPolicy)
	if err != nil {
		return api.EgressRequest{}, err
	}
	now := time.Now()
	req := b.rec.Requests[i]
	req.Decided, req.DecidedBy, req.Note = &now, by, note
	req.Until, req.Once, req.Used = nil, false, nil
	req.State = api.RequestDenied
	if approve {
		req.State, req.Once = api.RequestApproved, d.Once
		if d.DurationSeconds > 0 {
			until := now.Add(time.Duration(d.DurationSeconds) * time.Second)
			req.Until = &until
		}
	}
	reqs := slices.Clone(b.rec.Requests)
	reqs[i] = req
	if mv.step == stepLive {
		if _, err := m.cfg.Egress.SetPolicy(id, withGrants(b.rec.Policy, reqs, now)); err != nil {
			return api.EgressRequest{}, fmt.Errorf("applying the decision: %w", err)
		}
	}
	b.rec.Requests = reqs
	m.persistLocked(b)
	b.touch()
	msg := fmt.Sprintf("request %s for %s %s by %s", rid, req.Host, decisionText(req), by)
	m.notify(b).Event(id, "request", msg, req)
	m.log.Info("egress request decided", "sandbox", id, "request", rid, "host", req.Host, "state", req.State, "until", req.Until, "once", req.Once, "by", by)
	return req, nil
}

func decisionText(r api.EgressRequest) string {
	switch {
	case r.State == api.RequestDenied:
		return "denied"
	case r.Once:
		return "approved once"
	case r.Until != nil:
		return "approved until " + r.Until.UTC().Format(time.RFC3339)
	}
	return "approved for the sandbox's life"
}

// EgressGrantUsed records that request rid's grant for one use was used
// at a time, and ends at until (the egress engine ended it already).
func (m *Manager) EgressGrantUsed(id, rid string, at, until time.Time) {
	b, err := m.lookup(id)
	if err != nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	i := slices.IndexFunc(b.rec.Requests, func(r api.EgressRequest) bool { return r.ID == rid })
	if i < 0 || !b.rec.Requests[i].Once || b.rec.Requests[i].Used != nil {
		return
	}
	r := &b.rec.Requests[i]
	r.Used, r.Until = &at, &until
	m.persistLocked(b)
	m.notify(b).Event(id, "request", fmt.Sprintf("request %s for %s used once", rid, r.Host), *r)
}

// requestView is r as of now: an approval whose time is up has expired.
func requestView(r api.EgressRequest, now time.Time) api.EgressRequest {
	if r.State == api.RequestApproved && r.Until != nil && !now.Before(*r.Until) {
		r.State = api.RequestExpired
	}
	return r
}

// effectivePolicy is the policy the egress path applies to rec's
// sandbox: its own, with a grant for each live approval.
func effectivePolicy(rec *record) *api.Policy {
	return withGrants(rec.Policy, rec.Requests, time.Now())
}

func withGrants(p *api.Policy, reqs []api.EgressRequest, now time.Time) *api.Policy {
	var grants []api.PolicyGrant
	for _, r := range reqs {
		if requestView(r, now).State == api.RequestApproved {
			grants = append(grants, api.PolicyGrant{Request: r.ID, Match: r.Host, Until: r.Until, Once: r.Once})
		}
	}
	if grants == nil {
		return p
	}
	out := p.Clone()
	if out == nil {
		out = &api.Policy{}
	}
	out.Grants = grants
	return out
}

// askHost checks the host of an ask: a name, or an address, with an
// optional :PORT; no wildcard, network or URL.
func askHost(s string) (string, error) {
	h := strings.ToLower(strings.TrimSpace(s))
	bad := func(why string) error {
		if len(s) > 80 {
			s = s[:80] + "..."
		}
		return errdefs.Invalid("host", "%q %s (want a name or an address, with an optional :PORT: api.example.com, 203.0.113.7:5432)", s, why)
	}
	switch {
	case h == "":
		return "", bad("is empty")
	case len(h) > 260:
		return "", bad("is too long")
	}
	if a, err := netip.ParseAddr(h); err == nil {
		return a.Unmap().String(), nil
	}
	if ap, err := netip.ParseAddrPort(h); err == nil {
		if ap.Port() == 0 {
			return "", bad("has port 0")
		}
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()).String(), nil
	}
	name, port, hasPort := strings.Cut(h, ":")
	if hasPort {
		n, err := strconv.ParseUint(port, 10, 16)
		if err != nil || n == 0 {
			return "", bad("has a bad port")
		}
	}
	name = strings.TrimSuffix(name, ".")
	if len(name) > 253 {
		return "", bad("is too long")
	}
	for _, l := range strings.Split(name, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return "", bad("is not a name")
		}
		for _, c := range l {
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return "", bad("is not a name")
			}
		}
	}
	if hasPort {
		return name + ":" + port, nil
	}
	return name, nil
}

// checkText refuses a reason or note a terminal or a page could be
// fooled by: control and format characters (escapes, bidi overrides),
// invalid UTF-8, and more than maxRequestText bytes.
func checkText(field, s string) error {
	if len(s) > maxRequestText {
		return errdefs.Invalid(field, "longer than %d bytes", maxRequestText)
	}
	if !utf8.ValidString(s) {
		return errdefs.Invalid(field, "is not UTF-8")
	}
	for _, r := range s {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			return errdefs.Invalid(field, "holds the control character %U", r)
		}
	}
	return nil
}

// printable is s cut to maxRequestText bytes with what checkText refuses
// replaced.
func printable(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == utf8.RuneError || unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			return '?'
		}
		return r
	}, strings.ToValidUTF8(s, "?"))
	for len(s) > maxRequestText {
		_, n := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-n]
	}
	return s
}
