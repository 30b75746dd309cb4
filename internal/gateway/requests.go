package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/egress"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// Requests keeps sandboxes' egress requests (the sandbox manager): a
// sandbox asks for a host through its self endpoint, or a refusal asks
// for it when the sandbox's policy mode is "ask".
type Requests interface {
	// AskEgress files sandbox id's request, or returns the one pending
	// (or approved) for the same host; made reports a new one.
	AskEgress(ctx context.Context, id string, ask api.RequestAsk, auto bool) (req api.EgressRequest, made bool, err error)
	// EgressRequests lists sandbox id's requests, oldest first.
	EgressRequests(ctx context.Context, id string) ([]api.EgressRequest, error)
	// EgressGrantUsed hears that a grant for one use was used at a
	// time, and ends at until.
	EgressGrantUsed(id, request string, at, until time.Time)
}

// SetRequests sets where egress requests go; without it a sandbox's ask
// answers 503.
func (g *Gateway) SetRequests(r Requests) {
	g.mu.Lock()
	g.requests = r
	g.mu.Unlock()
}

func (g *Gateway) requestsSink() Requests {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.requests
}

// grantUsed is the engine's report of a grant for one use.
func (g *Gateway) grantUsed(id, request string, at, until time.Time) {
	if r := g.requestsSink(); r != nil {
		r.EgressGrantUsed(id, request, at, until)
	}
	g.poke(id)
}

// maxAskBody bounds the body of a sandbox's ask.
const maxAskBody = 4 << 10

// selfRequests is where a sandbox asks for hosts and reads the answers
// (also served as /v1/requests, the name the issue gave it).
const selfRequests = "/v1/self/requests"

// serveRequests answers a sandbox's /v1/self/requests calls: POST asks
// for a host, GET lists its requests or shows one (/v1/self/requests/ID).
// It reports whether the path was one of them.
func (g *Gateway) serveRequests(w http.ResponseWriter, r *http.Request, id string) bool {
	path := strings.TrimSuffix(r.URL.Path, "/")
	if rest, ok := strings.CutPrefix(path, "/v1/requests"); ok && (rest == "" || rest[0] == '/') {
		path = selfRequests + rest
	}
	rid, one := strings.CutPrefix(path, selfRequests+"/")
	if path != selfRequests && (!one || rid == "" || strings.Contains(rid, "/")) {
		return false
	}
	reqs := g.requestsSink()
	switch {
	case reqs == nil:
		selfError(w, errdefs.New(errdefs.ErrUnavailable, "this daemon takes no egress requests"))
	case !one && r.Method == http.MethodPost:
		var ask api.RequestAsk
		dec := json.NewDecoder(io.LimitReader(r.Body, maxAskBody+1))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&ask); err != nil {
			selfError(w, errdefs.Invalid("body", "want {\"host\": \"example.com\", \"reason\": \"why\"} (at most %d bytes): %v", maxAskBody, err))
			return true
		}
		req, made, err := reqs.AskEgress(r.Context(), id, ask, false)
		if err != nil {
			selfError(w, err)
			return true
		}
		code := http.StatusOK
		if made {
			code = http.StatusCreated
		}
		selfJSON(w, code, req)
	case r.Method != http.MethodGet:
		w.Header().Set("Allow", "GET, POST")
		selfError(w, errdefs.Invalid("method", "%s is not allowed here (GET, or POST to /v1/requests)", r.Method))
	default:
		list, err := reqs.EgressRequests(r.Context(), id)
		if err != nil {
			selfError(w, err)
			return true
		}
		if !one {
			selfJSON(w, http.StatusOK, list)
			return true
		}
		for _, req := range list {
			if req.ID == rid {
				selfJSON(w, http.StatusOK, req)
				return true
			}
		}
		selfError(w, errdefs.NotFound("request", rid))
	}
	return true
}

func selfJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// selfError answers err as the API does ({"code", "message"}, the status
// of its category).
func selfError(w http.ResponseWriter, err error) {
	if errdefs.Code(err) == "internal" {
		err = errors.New("internal error")
	}
	selfJSON(w, errdefs.HTTPStatus(err), api.Error{Code: errdefs.Code(err), Message: err.Error()})
}

// autoAsk is a refusal that asks for its host (policy mode "ask").
type autoAsk struct {
	id  string
	ask api.RequestAsk
}

// maybeAsk files a request for the host of refusal e of sandbox id when
// its policy's mode is "ask" and no deny rule refused it (e has a
// suggestion then). It never blocks: asks are made one at a time by
// askLoop, and those beyond its queue are dropped (the next refusal of
// the host asks again).
func (g *Gateway) maybeAsk(id string, e egress.Event) {
	if e.Suggest == "" || e.Exfiltration || g.eng.Mode(id) != api.PolicyModeAsk {
		return
	}
	host := askHost(e)
	if host == "" {
		return
	}
	reason := "refused: " + e.Reason
	if len(reason) > 200 {
		reason = reason[:200]
	}
	select {
	case g.asks <- autoAsk{id: id, ask: api.RequestAsk{Host: host, Reason: reason}}:
	default:
	}
}

// askHost is the host a request for refusal e names: the name when there
// is one, else the address and port.
func askHost(e egress.Event) string {
	if e.Host != "" {
		if _, err := netip.ParseAddr(e.Host); err != nil {
			return strings.ToLower(strings.TrimSuffix(e.Host, "."))
		}
	}
	ip := e.IP
	if ip == "" {
		ip = e.Host
	}
	if ip == "" {
		return ""
	}
	if e.Port == 0 {
		return ip
	}
	return net.JoinHostPort(ip, strconv.Itoa(int(e.Port)))
}

func (g *Gateway) askLoop() {
	defer g.wg.Done()
	for {
		select {
		case <-g.stop:
			return
		case a := <-g.asks:
			reqs := g.requestsSink()
			if reqs == nil {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if _, _, err := reqs.AskEgress(ctx, a.id, a.ask, true); err != nil {
				g.log.Debug("asking for a refused host", "sandbox", a.id, "host", a.ask.Host, "err", err)
			}
			cancel()
		}
	}
}
