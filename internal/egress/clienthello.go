package egress

import (
	"encoding/binary"
	"errors"
	"strings"
)

// clientHello is what the proxy needs of a TLS ClientHello.
type clientHello struct {
	serverName string
	alpn       []string
}

var errNotHello = errors.New("not a TLS ClientHello")

// needMore is returned while the records read so far hold only part of
// the ClientHello.
var errNeedMore = errors.New("need more bytes")

// parseClientHello parses the ClientHello at the start of b (TLS records,
// possibly several), or says it needs more bytes.
func parseClientHello(b []byte) (clientHello, error) {
	var hs []byte
	for {
		if len(b) < 5 {
			return clientHello{}, errNeedMore
		}
		if b[0] != 0x16 || b[1] != 3 {
			return clientHello{}, errNotHello
		}
		n := int(binary.BigEndian.Uint16(b[3:5]))
		if n == 0 || n > 1<<14+2048 {
			return clientHello{}, errNotHello
		}
		if len(b) < 5+n {
			return clientHello{}, errNeedMore
		}
		hs = append(hs, b[5:5+n]...)
		b = b[5+n:]
		if len(hs) >= 4 {
			if hs[0] != 1 {
				return clientHello{}, errNotHello
			}
			mlen := int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3])
			if mlen > 1<<16 {
				return clientHello{}, errNotHello
			}
			if len(hs) >= 4+mlen {
				return parseHelloBody(hs[4 : 4+mlen])
			}
		}
	}
}

func parseHelloBody(m []byte) (clientHello, error) {
	var h clientHello
	r := reader(m)
	if !r.skip(2+32) || !r.skipVec(1) || !r.skipVec(2) || !r.skipVec(1) {
		return h, errNotHello
	}
	if len(r) == 0 {
		return h, nil // no extensions
	}
	exts, ok := r.vec(2)
	if !ok {
		return h, errNotHello
	}
	for len(exts) > 0 {
		typ, ok1 := exts.u16()
		data, ok2 := exts.vec(2)
		if !ok1 || !ok2 {
			return h, errNotHello
		}
		switch typ {
		case 0: // server_name
			list, ok := data.vec(2)
			for ok && len(list) > 0 {
				var t []byte
				if t, ok = list.bytes(1); !ok {
					break
				}
				name, ok3 := list.vec(2)
				if !ok3 {
					return h, errNotHello
				}
				if t[0] == 0 {
					h.serverName = strings.ToLower(strings.TrimSuffix(string(name), "."))
				}
			}
		case 16: // application_layer_protocol_negotiation
			list, ok := data.vec(2)
			for ok && len(list) > 0 {
				p, ok3 := list.vec(1)
				if !ok3 {
					break
				}
				h.alpn = append(h.alpn, string(p))
			}
		}
	}
	return h, nil
}

type reader []byte

func (r *reader) skip(n int) bool {
	if len(*r) < n {
		return false
	}
	*r = (*r)[n:]
	return true
}

func (r *reader) bytes(n int) ([]byte, bool) {
	if len(*r) < n {
		return nil, false
	}
	b := (*r)[:n]
	*r = (*r)[n:]
	return b, true
}

func (r *reader) u16() (uint16, bool) {
	b, ok := r.bytes(2)
	if !ok {
		return 0, false
	}
	return binary.BigEndian.Uint16(b), true
}

// vec reads a vector with a length prefix of n bytes (1 or 2).
func (r *reader) vec(n int) (reader, bool) {
	lb, ok := r.bytes(n)
	if !ok {
		return nil, false
	}
	l := int(lb[0])
	if n == 2 {
		l = int(binary.BigEndian.Uint16(lb))
	}
	b, ok := r.bytes(l)
	return reader(b), ok
}

func (r *reader) skipVec(n int) bool {
	_, ok := r.vec(n)
	return ok
}
