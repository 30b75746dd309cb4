package dns

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	mdns "github.com/miekg/dns"
)

// maxChain bounds the CNAME chain followed for one name.
const maxChain = 8

// negativeTTL is how long a negative answer (NXDOMAIN, no data) without a
// SOA to say otherwise is cached (MaxTTL caps it too).
const negativeTTL = 5 * time.Second

// lookup answers (name, qtype) from the cache or, once for all concurrent
// askers, from upstream. cached reports a cache hit.
func (s *Server) lookup(ctx context.Context, name string, qtype uint16) (_ *entry, cached bool, _ error) {
	key := cacheKey{name: name, qtype: qtype}
	now := time.Now()
	if e, ok := s.cache.get(key, now); ok {
		return e, true, nil
	}
	ch := s.flight.DoChan(key.String(), func() (any, error) {
		// Not the first asker's context: the others share the result.
		fctx, cancel := context.WithTimeout(context.Background(), queryBudget)
		defer cancel()
		var e *entry
		var err error
		if qtype == mdns.TypeA || qtype == mdns.TypeAAAA {
			e, err = s.resolveAddrs(fctx, name, qtype)
		} else {
			e, err = s.forward(fctx, name, qtype)
		}
		if err != nil {
			return nil, err
		}
		s.cache.put(key, e)
		return e, nil
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return nil, false, r.Err
		}
		return r.Val.(*entry), false, nil
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
}

// resolveAddrs resolves name's A or AAAA records, following CNAMEs (in the
// upstream's answer, and asking again where the answer stops short), and
// returns them as records owned by name, with the smallest TTL of the
// chain.
//
// Only the asked name must be allowed, not the names in its chain: the
// chain is chosen by the allowed name's owner, not by the sandbox (no data
// can leave through it), the proxy decides connections by SNI, Host or
// address, never by the chain, and CDNs put most names behind chains no
// policy author could list. Flattening keeps the chain's names from the
// sandbox, so its stub resolver has no reason to ask for them (and be
// refused).
func (s *Server) resolveAddrs(ctx context.Context, name string, qtype uint16) (*entry, error) {
	cur := name
	ttl := s.cfg.MaxTTL
	e := &entry{rcode: mdns.RcodeSuccess}
	for hops := 0; ; {
		r, err := s.exchange(ctx, cur, qtype)
		if err != nil {
			return nil, err
		}
		if r.Rcode != mdns.RcodeSuccess {
			e.rcode = r.Rcode
			e.setExpiry(min(ttl, negTTL(r, s.cfg.MaxTTL)))
			return e, nil
		}
		// Walk the chain as far as this answer goes.
		start := cur
		for {
			var next string
			for _, rr := range r.Answer {
				h := rr.Header()
				if !strings.EqualFold(h.Name, mdns.Fqdn(cur)) {
					continue
				}
				switch v := rr.(type) {
				case *mdns.A:
					if qtype == mdns.TypeA {
						e.addAddr(name, v.A, h.Ttl, true)
						ttl = min(ttl, time.Duration(h.Ttl)*time.Second)
					}
				case *mdns.AAAA:
					if qtype == mdns.TypeAAAA {
						e.addAddr(name, v.AAAA, h.Ttl, false)
						ttl = min(ttl, time.Duration(h.Ttl)*time.Second)
					}
				case *mdns.CNAME:
					next = canonical(v.Target)
					ttl = min(ttl, time.Duration(h.Ttl)*time.Second)
				}
			}
			if len(e.addrs) > 0 || next == "" {
				break
			}
			if hops++; hops > maxChain {
				return nil, fmt.Errorf("CNAME chain of %s longer than %d", name, maxChain)
			}
			cur = next
		}
		if len(e.addrs) > 0 {
			e.setExpiry(ttl)
			return e, nil
		}
		if cur == start {
			// No data for the type (and no CNAME to follow).
			e.setExpiry(min(ttl, negTTL(r, s.cfg.MaxTTL)))
			return e, nil
		}
		// The answer stopped part-way down the chain: ask for the rest.
	}
}

// forward asks upstream for (name, qtype) and keeps the answer section.
func (s *Server) forward(ctx context.Context, name string, qtype uint16) (*entry, error) {
	r, err := s.exchange(ctx, name, qtype)
	if err != nil {
		return nil, err
	}
	e := &entry{rcode: r.Rcode}
	ttl := s.cfg.MaxTTL
	for _, rr := range r.Answer {
		if rr.Header().Rrtype == mdns.TypeOPT || rr.Header().Rrtype == mdns.TypeRRSIG {
			continue
		}
		e.rrs = append(e.rrs, mdns.Copy(rr))
		ttl = min(ttl, time.Duration(rr.Header().Ttl)*time.Second)
	}
	if len(e.rrs) == 0 {
		ttl = min(ttl, negTTL(r, s.cfg.MaxTTL))
	}
	e.setExpiry(ttl)
	return e, nil
}

// exchange sends one question to the upstreams in turn until one answers
// (NOERROR or NXDOMAIN), over UDP and, if the answer is truncated, TCP.
func (s *Server) exchange(ctx context.Context, name string, qtype uint16) (*mdns.Msg, error) {
	if len(s.cfg.Upstream) == 0 {
		return nil, errUpstream
	}
	select {
	case s.sem <- struct{}{}:
		defer func() { <-s.sem }()
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for an upstream slot: %w", ctx.Err())
	}
	m := new(mdns.Msg)
	m.SetQuestion(mdns.Fqdn(name), qtype)
	m.SetEdns0(1232, false)
	var errs []error
	for _, up := range s.cfg.Upstream {
		actx, cancel := context.WithTimeout(ctx, s.cfg.UpstreamTimeout)
		r, _, err := s.udpc.ExchangeContext(actx, m, up)
		if err == nil && r.Truncated {
			r, _, err = s.tcpc.ExchangeContext(actx, m, up)
		}
		cancel()
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", up, err))
		case len(r.Question) != 1 || !strings.EqualFold(r.Question[0].Name, m.Question[0].Name) || r.Question[0].Qtype != qtype:
			errs = append(errs, fmt.Errorf("%s: answered another question", up))
		case r.Rcode != mdns.RcodeSuccess && r.Rcode != mdns.RcodeNameError:
			errs = append(errs, fmt.Errorf("%s: %s", up, mdns.RcodeToString[r.Rcode]))
		default:
			return r, nil
		}
		if ctx.Err() != nil {
			break
		}
	}
	s.log.Warn("upstream resolution failed", "name", name, "type", typeString(qtype), "err", errors.Join(errs...))
	return nil, fmt.Errorf("%w: %w", errUpstream, errors.Join(errs...))
}

// negTTL is how long a negative answer may be cached: its SOA's minimum
// (RFC 2308), else negativeTTL; at most max.
func negTTL(r *mdns.Msg, max time.Duration) time.Duration {
	for _, rr := range r.Ns {
		if soa, ok := rr.(*mdns.SOA); ok {
			return min(max, time.Duration(min(soa.Minttl, soa.Hdr.Ttl))*time.Second)
		}
	}
	return min(max, negativeTTL)
}

func (e *entry) addAddr(owner string, ip []byte, ttl uint32, isA bool) {
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return
	}
	if isA {
		a = a.Unmap() // miekg/dns holds A data in 16-byte form
	}
	for _, have := range e.addrs {
		if have == a {
			return
		}
	}
	e.addrs = append(e.addrs, a)
	if a.Is4() {
		e.rrs = append(e.rrs, &mdns.A{Hdr: mdns.RR_Header{Name: mdns.Fqdn(owner), Rrtype: mdns.TypeA, Class: mdns.ClassINET, Ttl: ttl}, A: a.AsSlice()})
	} else {
		e.rrs = append(e.rrs, &mdns.AAAA{Hdr: mdns.RR_Header{Name: mdns.Fqdn(owner), Rrtype: mdns.TypeAAAA, Class: mdns.ClassINET, Ttl: ttl}, AAAA: a.AsSlice()})
	}
}
