package egress

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strings"
	"time"
)

// reqState is one HTTP request on its way through the proxy.
type reqState struct {
	f      *flow
	pol    *compiled
	scheme string
	host   string // the decided host; "" when decided by the original address
	port   uint16
	plan   *secretPlan
	ev     *Event
}

type reqKey struct{}

// serveHTTP decides and forwards one request: plain HTTP (transparent or
// as an HTTP proxy), a request inside an intercepted TLS connection, or a
// CONNECT.
func (p *Proxy) serveHTTP(w http.ResponseWriter, r *http.Request) {
	f, _ := r.Context().Value(flowKey{}).(*flow)
	if f == nil {
		http.Error(w, "paddock egress: no connection state", http.StatusInternalServerError)
		return
	}
	https := r.TLS != nil
	ev := Event{Time: time.Now(), Kind: KindHTTP, Method: r.Method, Path: r.URL.Path, Intercepted: https, Port: f.port}
	if f.dst.IsValid() {
		ev.IP = f.dst.Addr().String()
	}
	if r.Method == http.MethodConnect {
		if f.explicit && r.ProtoMajor == 1 {
			p.serveConnect(w, r, f)
			return
		}
		ev.Path = ""
		p.refuse(w, f, &ev, http.StatusMethodNotAllowed, Decision{Reason: "CONNECT is for the proxy address only"}, false)
		return
	}
	pol := p.cfg.Engine.get(f.id)
	if pol == nil {
		p.refuse(w, f, &ev, http.StatusForbidden, noPolicy, false)
		return
	}
	host, port, bad := p.target(f, r)
	ev.Host, ev.Port = host, port
	if bad != "" {
		p.refuse(w, f, &ev, http.StatusForbidden, Decision{Reason: bad}, false)
		return
	}
	if bad := badHeaders(r.Header); bad != "" {
		p.refuse(w, f, &ev, http.StatusBadRequest, Decision{Reason: bad}, false)
		return
	}
	d := pol.decide(DecideArgs{Sandbox: f.id, Kind: KindHTTP, TLS: https, Host: host, IP: f.dst.Addr(), Port: port, Method: r.Method, Path: r.URL.Path}, p.public)
	ev.Action, ev.Rule, ev.Reason = "allow", d.Rule, d.Reason
	if !d.Allow {
		p.refuse(w, f, &ev, http.StatusForbidden, d, false)
		return
	}
	rs := &reqState{f: f, pol: pol, scheme: "http", host: host, port: port, ev: &ev}
	if https {
		rs.scheme = "https"
	}
	if len(pol.bindings) > 0 {
		plan, refusal := p.planSecrets(f, pol, https, host, port, r)
		if refusal != nil {
			ev.Exfiltration = refusal.exfil
			p.refuse(w, f, &ev, refusal.status, refusal.d, refusal.exfil)
			return
		}
		rs.plan = plan
		if plan != nil {
			if err := plan.apply(r); err != nil {
				p.refuse(w, f, &ev, http.StatusForbidden, Decision{Reason: err.Error()}, false)
				return
			}
			ev.Secrets = plan.injected
		}
	}
	if r.Body != nil && r.Body != http.NoBody {
		body := r.Body
		if rs.plan != nil && len(rs.plan.forbidden) > 0 {
			body = readCloser{newPlaceholderScanner(body, rs.plan.forbidden), body}
		}
		r.Body = countingReader{body, &ev.BytesOut}
	}
	ctx := context.WithValue(r.Context(), reqKey{}, rs)
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(ci httptrace.GotConnInfo) {
		ev.IP = addrPort(ci.Conn.RemoteAddr()).Addr().String()
	}})
	p.rp.ServeHTTP(w, r.WithContext(ctx))
	p.emit(f, ev)
}

type readCloser struct {
	io.Reader
	io.Closer
}

// target returns the host a request is for and the port it goes to, or
// why it is refused.
func (p *Proxy) target(f *flow, r *http.Request) (host string, port uint16, bad string) {
	if f.explicit {
		// Proxy-form: GET http://host[:port]/path. HTTPS goes through CONNECT.
		if !r.URL.IsAbs() || r.URL.Scheme != "http" || r.URL.Host == "" {
			return "", 0, "this is paddock's egress proxy: send absolute-form http:// requests or CONNECT"
		}
		host, port, err := splitHostPort(r.URL.Host)
		if err != nil {
			return "", 0, "bad host: " + err.Error()
		}
		if port == 0 {
			port = 80
		}
		return host, port, ""
	}
	// Go takes the host of an absolute-form request line over the Host
	// header, and so does this decision and the request sent on.
	host, _, err := splitHostPort(r.Host)
	if err != nil {
		return "", 0, "bad Host header: " + err.Error()
	}
	switch {
	case f.sni != "" && host != f.sni:
		return host, f.port, fmt.Sprintf("Host %q differs from the TLS server name %q (domain fronting)", host, f.sni)
	case f.connectHost != "" && host != f.connectHost:
		return host, f.port, fmt.Sprintf("Host %q differs from the CONNECT host %q", host, f.connectHost)
	}
	return host, f.port, ""
}

// splitHostPort splits host[:port] (port 0 when absent), lower-cases the
// host and strips IPv6 brackets and a trailing dot.
func splitHostPort(hp string) (string, uint16, error) {
	if hp == "" {
		return "", 0, nil
	}
	host, ps, err := net.SplitHostPort(hp)
	if err != nil {
		if strings.Contains(err.Error(), "missing port") {
			return normHost(hp), 0, nil
		}
		return "", 0, err
	}
	if ps == "" {
		return normHost(host), 0, nil
	}
	port, err := parsePort(ps)
	if err != nil {
		return "", 0, err
	}
	return normHost(host), port, nil
}

func badHeaders(h http.Header) string {
	for k, vs := range h {
		if !validToken(k) {
			return fmt.Sprintf("header name %q is not valid", k)
		}
		for _, v := range vs {
			if !validHeaderValue(v) {
				return fmt.Sprintf("header %s holds CR, LF or another control byte", k)
			}
		}
	}
	return ""
}

// serveConnect opens a tunnel for an explicit proxy client: it decides
// the CONNECT host first (so a refusal is a readable 403), then treats
// the tunnel like a transparent connection to that host.
func (p *Proxy) serveConnect(w http.ResponseWriter, r *http.Request, f *flow) {
	ev := Event{Time: time.Now(), Kind: KindTLS, Method: http.MethodConnect}
	host, port, err := splitHostPort(r.Host)
	ev.Host, ev.Port = host, port
	if err != nil || host == "" || port == 0 {
		p.refuse(w, f, &ev, http.StatusBadRequest, Decision{Reason: "CONNECT wants host:port"}, false)
		return
	}
	pol := p.cfg.Engine.get(f.id)
	if pol == nil {
		p.refuse(w, f, &ev, http.StatusForbidden, noPolicy, false)
		return
	}
	f2 := &flow{id: f.id, peer: f.peer, port: port, start: time.Now()}
	var d Decision
	if ip, err := netip.ParseAddr(host); err == nil {
		ip = ip.Unmap()
		f2.dst = netip.AddrPortFrom(ip, port)
		ev.IP = ip.String()
		ev.Kind = KindTCP
		d = pol.decideIP(ip, port, p.public)
	} else {
		f2.connectHost = host
		d = pol.decideTLS(host, port)
	}
	if !d.Allow {
		ev.Rule, ev.Reason = d.Rule, d.Reason
		p.refuse(w, f, &ev, http.StatusForbidden, d, false)
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	var pre []byte
	if n := brw.Reader.Buffered(); n > 0 {
		pre, _ = brw.Reader.Peek(n)
		pre = append([]byte(nil), pre...)
	}
	if fc, ok := conn.(*flowConn); ok {
		conn = fc.Conn
	}
	if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		conn.Close()
		return
	}
	p.handleStream(f2, conn, pre)
}

// deniedBody is the JSON a refused HTTP request gets.
type deniedBody struct {
	Error   string `json:"error"`
	Message string `json:"message"`
	Reason  string `json:"reason"`
	Rule    string `json:"rule,omitempty"`
	Suggest string `json:"suggest,omitempty"`
}

// refuse answers a request the proxy will not send and reports it.
func (p *Proxy) refuse(w http.ResponseWriter, f *flow, ev *Event, status int, d Decision, exfil bool) {
	ev.Action, ev.Status, ev.Rule, ev.Reason, ev.Exfiltration = "deny", status, d.Rule, d.Reason, exfil
	ev.Suggest = d.Suggest
	body := deniedBody{Error: "paddock egress: denied", Reason: d.Reason, Rule: d.Rule, Suggest: d.Suggest}
	body.Message = "paddock egress proxy refused this request: " + d.Reason
	if exfil {
		body.Error = "paddock egress: secret placeholder outside its scope"
	}
	if d.Suggest != "" {
		body.Message += "; to allow it, add " + d.Suggest + " to the sandbox's policy (paddock policy set)"
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Paddock-Egress", "denied")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(body)
	p.emit(f, *ev)
}

func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	rs := pr.In.Context().Value(reqKey{}).(*reqState)
	host := rs.host
	if host == "" {
		host = rs.f.dst.Addr().String()
	}
	pr.Out.URL.Scheme = rs.scheme
	pr.Out.URL.Host = hostPort(host, rs.port)
	pr.Out.Host = pr.In.Host
	if pr.Out.Host == "" {
		pr.Out.Host = pr.Out.URL.Host
	}
}

func (p *Proxy) roundTrip(r *http.Request) (*http.Response, error) {
	rs := r.Context().Value(reqKey{}).(*reqState)
	st := p.state(rs.f.id, rs.pol)
	if r.ProtoMajor == 2 {
		return st.h2.RoundTrip(r)
	}
	return st.h1.RoundTrip(r)
}

var errEncoded = errors.New("the upstream sent an encoded body that cannot be scrubbed of secrets")

func (p *Proxy) modifyResponse(resp *http.Response) error {
	rs := resp.Request.Context().Value(reqKey{}).(*reqState)
	rs.ev.Status = resp.StatusCode
	if rs.plan != nil && len(rs.plan.scrub) > 0 {
		if ce := resp.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
			return errEncoded
		}
		rs.plan.scrubHeader(resp.Header)
		// Trailers are named now (the answer's Trailer header) and
		// filled in when the body ends: both are scrubbed.
		rs.plan.scrubHeader(resp.Trailer)
		if resp.StatusCode == http.StatusSwitchingProtocols {
			if rwc, ok := resp.Body.(io.ReadWriteCloser); ok {
				resp.Body = &scrubConn{ReadWriteCloser: rwc, s: newScrubber(rwc, rs.plan.sameLength)}
			}
		} else {
			resp.Body = &trailerScrubber{ReadCloser: newScrubber(resp.Body, rs.plan.scrub), resp: resp, plan: rs.plan}
			resp.ContentLength = -1
			resp.Header.Del("Content-Length")
		}
	}
	if rwc, ok := resp.Body.(io.ReadWriteCloser); ok && resp.StatusCode == http.StatusSwitchingProtocols {
		resp.Body = &countingRWC{ReadWriteCloser: rwc, in: &rs.ev.BytesIn, out: &rs.ev.BytesOut}
		return nil
	}
	resp.Body = countingReader{resp.Body, &rs.ev.BytesIn}
	return nil
}

type countingRWC struct {
	io.ReadWriteCloser
	in, out *int64
}

func (c *countingRWC) Read(b []byte) (int, error) {
	n, err := c.ReadWriteCloser.Read(b)
	*c.in += int64(n)
	return n, err
}

func (c *countingRWC) Write(b []byte) (int, error) {
	n, err := c.ReadWriteCloser.Write(b)
	*c.out += int64(n)
	return n, err
}

// upstreamError answers a request that could not be sent or answered.
func (p *Proxy) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	rs := r.Context().Value(reqKey{}).(*reqState)
	ev := rs.ev
	var re *refusedError
	var pe *errPlaceholder
	var ue x509.UnknownAuthorityError
	var he x509.HostnameError
	var ce *tls.CertificateVerificationError
	switch {
	case errors.As(err, &re):
		ev.Action, ev.Status, ev.Rule, ev.Reason, ev.Suggest = "deny", http.StatusForbidden, re.d.Rule, re.d.Reason, re.d.Suggest
		p.writeDenied(w, http.StatusForbidden, re.d, false)
		return
	case errors.As(err, &pe):
		ev.Action, ev.Status, ev.Reason, ev.Exfiltration = "deny", http.StatusForbidden, pe.Error(), true
		p.writeDenied(w, http.StatusForbidden, Decision{Reason: pe.Error()}, true)
		return
	case errors.As(err, &ce) || errors.As(err, &ue) || errors.As(err, &he):
		ev.Error = "upstream certificate not trusted: " + err.Error()
	case errors.Is(err, errEncoded):
		ev.Error = err.Error()
	case errors.Is(err, context.Canceled):
		ev.Error = "the sandbox went away"
		return
	default:
		ev.Error = "upstream: " + err.Error()
	}
	ev.Status = http.StatusBadGateway
	w.Header().Set("X-Paddock-Egress", "upstream-error")
	http.Error(w, "paddock egress: "+ev.Error, http.StatusBadGateway)
}

func (p *Proxy) writeDenied(w http.ResponseWriter, status int, d Decision, exfil bool) {
	body := deniedBody{Error: "paddock egress: denied", Reason: d.Reason, Rule: d.Rule, Suggest: d.Suggest,
		Message: "paddock egress proxy refused this request: " + d.Reason}
	if exfil {
		body.Error = "paddock egress: secret placeholder outside its scope"
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Paddock-Egress", "denied")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(body)
}

// secretPlan is what the proxy does with secrets for one request.
type secretPlan struct {
	inject     []injection
	forbidden  map[string]string // placeholder → name: outside the scope
	scrub      []replacement     // value forms → placeholder, in responses
	sameLength []replacement     // the same, length kept, for upgraded streams
	names      []string          // the values in lower case, for header names
	injected   []string
}

type injection struct {
	b     *binding
	ph    string
	value string
}

type refusal struct {
	status int
	d      Decision
	exfil  bool
}

// planSecrets sorts the sandbox's bindings for one request: in scope
// (inject), out of scope (placeholder forbidden), and the values to
// scrub from the answer of a host that may have received them.
func (p *Proxy) planSecrets(f *flow, pol *compiled, https bool, host string, port uint16, r *http.Request) (*secretPlan, *refusal) {
	if p.cfg.Secrets == nil {
		if https && pol.hasBindingFor(host) {
			return nil, &refusal{status: http.StatusBadGateway, d: Decision{Reason: "the policy binds secrets but the proxy has no secret store"}}
		}
		return nil, nil
	}
	cleaned, _ := cleanRequestPath(r.URL.Path)
	plan := &secretPlan{forbidden: map[string]string{}}
	for _, b := range pol.bindings {
		ph := p.cfg.Secrets.Placeholder(f.id, b.Name)
		in := b.inScope(https, host, port, cleaned, r.Method)
		if !in {
			plan.forbidden[ph] = b.Name
		}
		if !in && !(https && b.matchHost(host)) {
			continue
		}
		v, err := p.cfg.Secrets.Get(b.Name)
		if err != nil {
			return nil, &refusal{status: http.StatusBadGateway, d: Decision{Reason: fmt.Sprintf("secret %s is bound but cannot be read: %v", b.Name, err)}}
		}
		value := string(v)
		if in {
			plan.inject = append(plan.inject, injection{b: b, ph: ph, value: value})
		}
		plan.addScrub(value, ph, b)
	}
	if name, where := findPlaceholder(r, plan.forbidden); name != "" {
		return nil, &refusal{status: http.StatusForbidden, exfil: true, d: Decision{
			Reason: fmt.Sprintf("the request carries the placeholder of secret %s in %s, outside the secret's scope (%s)", name, where, scopeString(pol, name)),
		}}
	}
	return plan, nil
}

func scopeString(pol *compiled, name string) string {
	for _, b := range pol.bindings {
		if b.Name == name {
			var hosts []string
			for _, h := range b.hosts {
				hosts = append(hosts, h.String())
			}
			s := strings.Join(hosts, ", ")
			if len(b.Paths) > 0 {
				s += " paths " + strings.Join(b.Paths, " ")
			}
			if len(b.Methods) > 0 {
				s += " methods " + strings.Join(b.Methods, ",")
			}
			return s
		}
	}
	return ""
}

func (plan *secretPlan) addScrub(value, ph string, b *binding) {
	user := ""
	if b.Inject.Basic != nil {
		user = b.Inject.Basic.User
	}
	forms := secretForms(value, ph, user)
	plan.scrub = append(plan.scrub, forms...)
	plan.sameLength = append(plan.sameLength, sameLength(forms)...)
	plan.names = append(plan.names, strings.ToLower(value))
}

// scrubHeader scrubs h in place: values, and names that hold a secret
// (matched regardless of case: names reach the sandbox canonicalized) are
// dropped.
func (plan *secretPlan) scrubHeader(h http.Header) {
	for k, vs := range h {
		if plan.badName(k) {
			delete(h, k)
			continue
		}
		for i, v := range vs {
			vs[i] = scrubString(plan.scrub, v)
		}
	}
}

func (plan *secretPlan) badName(k string) bool {
	lk := strings.ToLower(k)
	if scrubString(plan.scrub, lk) != lk || scrubString(plan.scrub, k) != k {
		return true
	}
	for _, n := range plan.names {
		if strings.Contains(lk, n) {
			return true
		}
	}
	return false
}

// trailerScrubber scrubs an answer's trailers once its body has ended,
// before the reverse proxy copies them.
type trailerScrubber struct {
	io.ReadCloser
	resp *http.Response
	plan *secretPlan
}

func (t *trailerScrubber) Read(p []byte) (int, error) {
	n, err := t.ReadCloser.Read(p)
	if err != nil {
		t.plan.scrubHeader(t.resp.Trailer)
	}
	return n, err
}

// findPlaceholder looks for a forbidden placeholder in the request line
// (raw and decoded), the Host and every header value (Basic credentials
// decoded), and says where it found one.
func findPlaceholder(r *http.Request, forbidden map[string]string) (name, where string) {
	if len(forbidden) == 0 {
		return "", ""
	}
	look := func(s string) string {
		for i := strings.Index(s, PlaceholderPrefix); i >= 0; {
			if i+placeholderLen <= len(s) {
				if n, ok := forbidden[s[i:i+placeholderLen]]; ok {
					return n
				}
			}
			j := strings.Index(s[i+1:], PlaceholderPrefix)
			if j < 0 {
				break
			}
			i += 1 + j
		}
		return ""
	}
	if n := look(r.RequestURI); n != "" {
		return n, "the URL"
	}
	if n := look(r.URL.Path); n != "" {
		return n, "the URL"
	}
	if q, err := url.QueryUnescape(r.URL.RawQuery); err == nil {
		if n := look(q); n != "" {
			return n, "the URL"
		}
	}
	if n := look(r.Host); n != "" {
		return n, "the Host"
	}
	for k, vs := range r.Header {
		for _, v := range vs {
			if n := look(v); n != "" {
				return n, "header " + k
			}
			if dec, ok := decodeBasic(v); ok {
				if n := look(dec); n != "" {
					return n, "header " + k + " (basic credentials)"
				}
			}
		}
	}
	return "", ""
}

func decodeBasic(v string) (string, bool) {
	const prefix = "basic "
	if len(v) < len(prefix) || !strings.EqualFold(v[:len(prefix)], prefix) {
		return "", false
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(v[len(prefix):]))
	if err != nil {
		return "", false
	}
	return string(b), true
}

// apply puts the secrets into r (see SecretBinding for where) and takes
// from it what would let an answer slip the scrubber.
func (plan *secretPlan) apply(r *http.Request) error {
	for _, in := range plan.inject {
		inj := in.b.Inject
		done := false
		switch {
		case inj.Header != "":
			cur := r.Header.Values(inj.Header)
			if len(cur) == 0 || anyContains(cur, in.ph) {
				format := inj.Format
				if format == "" {
					format = "%s"
				}
				r.Header.Set(inj.Header, strings.Replace(format, "%s", in.value, 1))
				done = true
			}
		case inj.Basic != nil:
			cur := r.Header.Get("Authorization")
			dec, _ := decodeBasic(cur)
			if cur == "" || strings.Contains(cur, in.ph) || strings.Contains(dec, in.ph) {
				r.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(inj.Basic.User+":"+in.value)))
				done = true
			}
		default:
			q := r.URL.Query()
			if cur := q.Get(inj.Query); cur == "" || strings.Contains(cur, in.ph) {
				q.Set(inj.Query, in.value)
				r.URL.RawQuery = q.Encode()
				done = true
			}
		}
		for k, vs := range r.Header {
			for i, v := range vs {
				if strings.Contains(v, in.ph) {
					vs[i] = strings.ReplaceAll(v, in.ph, in.value)
					done = true
				}
			}
			if bad := badHeaders(http.Header{k: vs}); bad != "" {
				return fmt.Errorf("injecting secret %s: %s", in.b.Name, bad)
			}
		}
		if strings.Contains(r.URL.RawQuery, in.ph) {
			r.URL.RawQuery = strings.ReplaceAll(r.URL.RawQuery, in.ph, url.QueryEscape(in.value))
			done = true
		}
		if done {
			plan.injected = append(plan.injected, in.b.Name)
		}
	}
	if len(plan.scrub) > 0 {
		// The scrubber reads plain bytes, whole: no compression the proxy
		// did not ask for itself (the transport's own gzip is undone before
		// the scrubber), no ranges that cut a secret in pieces, no
		// WebSocket compression.
		r.Header.Del("Accept-Encoding")
		r.Header.Del("Range")
		r.Header.Del("If-Range")
		r.Header.Del("Sec-WebSocket-Extensions")
	}
	return nil
}

func anyContains(vs []string, s string) bool {
	for _, v := range vs {
		if strings.Contains(v, s) {
			return true
		}
	}
	return false
}
