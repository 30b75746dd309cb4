package main

import (
	"bufio"
	"bytes"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/clustertls"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/wire"
)

// simNode is a bench-only paddock node: it answers the part of the node
// API a gateway calls (create, get, list, exec, delete, version) as a
// node would, over the cluster's mutual TLS and behind the node token,
// with no kernel work behind it. It never ships in the product; the
// simnodes section puts 1 to 100 of them behind one real `paddock
// gateway` to measure what the gateway itself sustains.
//
// So that the measure is the gateway's, a simulated node costs as little
// CPU as HTTP/1.1 allows: one goroutine per kept connection reads a
// request into reused buffers and writes a prebuilt answer (a create's
// differs only in its id), with no allocation on the create path.
type simNode struct {
	name, tag string
	token     []byte // "Bearer …"
	trust     *tls.Config
	listeners []net.Listener

	seq     atomic.Uint64
	creates atomic.Int64
	conns   atomic.Int64 // connections the gateway opened to it

	mu      sync.Mutex
	deleted map[uint64]bool // by sequence number: every other id up to seq lives

	createHead []byte // a create's status line and headers
	createBody []byte // its body, an id of simIDLen at idAt
	idAt       int
}

// simIDLen is the length of a simulated node's sandbox ids.
const simIDLen = 12

// simCreated is every simulated sandbox's creation time.
var simCreated = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func newSimNode(name, tag, token string, trust *tls.Config) *simNode {
	n := &simNode{name: name, tag: tag, token: []byte("Bearer " + token), trust: trust, deleted: map[uint64]bool{}}
	slot := strings.Repeat("#", simIDLen)
	n.createBody, _ = json.Marshal(simSandbox(slot))
	n.createBody = append(n.createBody, '\n')
	n.idAt = bytes.Index(n.createBody, []byte(slot))
	n.createHead = fmt.Appendf(nil, "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(n.createBody))
	return n
}

// listen serves the node on a loopback port, over TLS or plain HTTP, and
// returns its address.
func (n *simNode) listen(tlsOn bool) (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	n.listeners = append(n.listeners, l)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			n.conns.Add(1)
			if tlsOn {
				c = tls.Server(c, n.trust)
			}
			go n.serveConn(c)
		}
	}()
	scheme := "http://"
	if tlsOn {
		scheme = "https://"
	}
	return scheme + l.Addr().String(), nil
}

// simRequest is one request as a simulated node reads it; its slices
// point into the connection's buffers until the next request.
type simRequest struct {
	method, path []byte
	authorized   bool
	close        bool
	body         []byte
}

// serveConn answers requests on c until the peer closes it or sends one
// the node cannot read.
func (n *simNode) serveConn(c net.Conn) {
	defer c.Close()
	br := bufio.NewReaderSize(c, 16<<10)
	bw := bufio.NewWriterSize(c, 16<<10)
	var req simRequest
	var body []byte
	for {
		var err error
		if body, err = n.read(br, &req, body); err != nil {
			if !errors.Is(err, io.EOF) {
				simAnswer(bw, http.StatusBadRequest, errdefs.Invalid("request", "%v", err), true)
				bw.Flush()
			}
			return
		}
		if !n.answer(bw, &req) || req.close {
			bw.Flush()
			return
		}
		// Requests pipelined behind this one are answered in the same write.
		if br.Buffered() == 0 && bw.Flush() != nil {
			return
		}
	}
}

// read reads one request (its body into buf's storage) into req.
func (n *simNode) read(br *bufio.Reader, req *simRequest, buf []byte) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return buf, err
	}
	method, rest, ok1 := bytes.Cut(line, []byte(" "))
	target, _, ok2 := bytes.Cut(rest, []byte(" "))
	if !ok1 || !ok2 {
		return buf, fmt.Errorf("request line %q", line)
	}
	path, _, _ := bytes.Cut(target, []byte("?")) // a delete's force=true changes nothing here
	// The slices into br's buffer are copied: the headers' lines follow.
	buf = append(buf[:0], method...)
	buf = append(buf, path...)
	h, err := readSimHeaders(br, n.token)
	if err != nil {
		return buf, err
	}
	if h.chunked {
		return buf, errors.New("the simulated node takes no chunked bodies")
	}
	length := max(h.length, 0)
	if length > 1<<20 {
		return buf, fmt.Errorf("a body of %d bytes", length)
	}
	req.authorized, req.close = h.authorized, h.close
	head := len(buf)
	buf = append(buf, make([]byte, length)...)[:head+length]
	if _, err := io.ReadFull(br, buf[head:]); err != nil {
		return buf, err
	}
	req.method, req.path, req.body = buf[:len(method)], buf[len(method):head], buf[head:]
	return buf, nil
}

// simHeaders is what the simulated nodes and the load generator read of
// a message's headers.
type simHeaders struct {
	length     int // -1: none given
	close      bool
	chunked    bool
	authorized bool // the Authorization header was the token asked for
}

// readSimHeaders reads the header lines up to the blank one, without
// allocating.
func readSimHeaders(br *bufio.Reader, token []byte) (simHeaders, error) {
	h := simHeaders{length: -1}
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return h, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			return h, nil
		}
		k, v, _ := bytes.Cut(line, []byte(":"))
		v = bytes.TrimSpace(v)
		switch {
		case bytes.EqualFold(k, []byte("Authorization")):
			h.authorized = token != nil && subtle.ConstantTimeCompare(v, token) == 1
		case bytes.EqualFold(k, []byte("Content-Length")):
			if h.length, err = strconv.Atoi(string(v)); err != nil || h.length < 0 {
				return h, fmt.Errorf("content length %q", v)
			}
		case bytes.EqualFold(k, []byte("Transfer-Encoding")):
			h.chunked = true
		case bytes.EqualFold(k, []byte("Connection")):
			h.close = bytes.EqualFold(v, []byte("close"))
		}
	}
}

// answer writes the answer to req to bw; false: the connection ends.
func (n *simNode) answer(bw *bufio.Writer, req *simRequest) bool {
	if !req.authorized {
		simAnswer(bw, http.StatusUnauthorized, errdefs.New(errdefs.ErrDenied, "missing or wrong bearer token"), false)
		return true
	}
	if bytes.Equal(req.path, []byte("/v1/sandboxes")) && bytes.Equal(req.method, []byte(http.MethodPost)) {
		n.create(bw)
		return true
	}
	p, m := string(req.path), string(req.method)
	switch {
	case p == "/v1/version":
		simAnswer(bw, http.StatusOK, api.VersionInfo{Version: "simnode", Runtime: "sim"}, false)
	case p == "/v1/sandboxes" && m == http.MethodGet:
		n.list(bw)
	case strings.HasPrefix(p, "/v1/sandboxes/"):
		id, rest, _ := strings.Cut(strings.TrimPrefix(p, "/v1/sandboxes/"), "/")
		live := n.live(id, rest == "" && m == http.MethodDelete)
		switch {
		case !live:
			simAnswer(bw, http.StatusNotFound, errdefs.New(errdefs.ErrNotFound, "sandbox %s not found", id), false)
		case rest == "" && m == http.MethodGet:
			simAnswer(bw, http.StatusOK, simSandbox(id), false)
		case rest == "" && m == http.MethodDelete:
			bw.WriteString("HTTP/1.1 204 No Content\r\n\r\n")
		case rest == "exec" && m == http.MethodPost:
			return n.exec(bw, req.body)
		default:
			simAnswer(bw, http.StatusNotFound, errdefs.New(errdefs.ErrNotFound, "the simulated node does not serve %s %s", m, p), false)
		}
	default:
		simAnswer(bw, http.StatusNotFound, errdefs.New(errdefs.ErrNotFound, "the simulated node does not serve %s %s", m, p), false)
	}
	return true
}

// create answers a running sandbox with a new id, whatever was asked.
func (n *simNode) create(bw *bufio.Writer) {
	var id [simIDLen]byte
	n.formatID(id[:], n.seq.Add(1))
	n.creates.Add(1)
	bw.Write(n.createHead)
	bw.Write(n.createBody[:n.idAt])
	bw.Write(id[:])
	bw.Write(n.createBody[n.idAt+simIDLen:])
}

// formatID writes the id of sequence number seq into id: the node's tag,
// zeros, then seq in base 36, as a node mints ids (its tag first).
func (n *simNode) formatID(id []byte, seq uint64) {
	var digits [16]byte
	s := strconv.AppendUint(digits[:0], seq, 36)
	k := copy(id, n.tag)
	for ; k < simIDLen-len(s); k++ {
		id[k] = '0'
	}
	copy(id[k:], s)
}

// live reports whether id is a sandbox of the node's, and forgets it if
// remove.
func (n *simNode) live(id string, remove bool) bool {
	if len(id) != simIDLen || !strings.HasPrefix(id, n.tag) {
		return false
	}
	seq, err := strconv.ParseUint(strings.TrimLeft(id[len(n.tag):], "0"), 36, 64)
	if err != nil || seq == 0 || seq > n.seq.Load() {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.deleted[seq] {
		return false
	}
	if remove {
		n.deleted[seq] = true
	}
	return true
}

func (n *simNode) list(bw *bufio.Writer) {
	out := []api.Sandbox{}
	var id [simIDLen]byte
	for seq := range n.seq.Load() {
		n.mu.Lock()
		gone := n.deleted[seq+1]
		n.mu.Unlock()
		if !gone {
			n.formatID(id[:], seq+1)
			out = append(out, simSandbox(string(id[:])))
		}
	}
	simAnswer(bw, http.StatusOK, out, false)
}

// exec answers any command as if it printed its arguments and exited 0,
// in the frames a node streams (chunked); `zeros N` prints N zero bytes
// instead (a stream through the gateway without a sandbox's cost behind
// it). False: the stream broke, the connection ends.
func (n *simNode) exec(bw *bufio.Writer, body []byte) bool {
	var req api.ExecRequest
	if err := json.Unmarshal(body, &req); err != nil || len(req.Cmd) == 0 {
		simAnswer(bw, http.StatusBadRequest, errdefs.Invalid("cmd", "an exec needs a command"), false)
		return true
	}
	bw.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
	cw := &chunkWriter{w: bw}
	fw := wire.NewWriter(cw)
	fw.WriteJSON(wire.Started, map[string]int{"pid": 1})
	if size, err := strconv.ParseInt(strings.Join(req.Cmd[1:], ""), 10, 64); req.Cmd[0] == "zeros" && err == nil {
		chunk := make([]byte, 256<<10)
		for size > 0 {
			k := min(size, int64(len(chunk)))
			if fw.Write(wire.Stdout, chunk[:k]) != nil {
				return false
			}
			size -= k
		}
	} else {
		fw.Write(wire.Stdout, []byte(strings.Join(req.Cmd[1:], " ")+"\n"))
	}
	fw.WriteJSON(wire.Exit, api.ExitStatus{})
	_, err := bw.WriteString("0\r\n\r\n")
	return err == nil && cw.err == nil
}

// chunkWriter writes each Write as one chunk of a chunked body.
type chunkWriter struct {
	w   *bufio.Writer
	err error
}

func (c *chunkWriter) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	var head [20]byte
	h := strconv.AppendInt(head[:0], int64(len(p)), 16)
	c.w.Write(append(h, '\r', '\n'))
	c.w.Write(p)
	_, c.err = c.w.WriteString("\r\n")
	return len(p), c.err
}

func simSandbox(id string) api.Sandbox {
	return api.Sandbox{ID: id, State: api.StateRunning, Image: "host", Workdir: "/", CreatedAt: simCreated,
		Resources: api.Resources{CPUs: 2, MemoryBytes: 1 << 30, DiskBytes: 10 << 30}}
}

// simAnswer writes a JSON answer (an error's as the API writes it).
func simAnswer(bw *bufio.Writer, code int, v any, closing bool) {
	if err, ok := v.(error); ok {
		v = api.Error{Code: errdefs.Code(err), Message: err.Error()}
	}
	b, _ := json.Marshal(v)
	conn := ""
	if closing {
		conn = "Connection: close\r\n"
	}
	fmt.Fprintf(bw, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s\n",
		code, http.StatusText(code), conn, len(b)+1, b)
}

// The simulated nodes run in a process of their own (this binary again,
// with simNodeEnv set), so that their CPU time is counted apart from the
// gateway's and the load generator's. The bench talks to it on its
// stdin and stdout, a JSON line each way: simNodesConfig in, the nodes'
// simNodeInfo out; then each line "stats" is answered with simNodeStats.
// It exits when its stdin closes.
const simNodeEnv = "PADDOCK_BENCH_SIMNODES"

type simNodesConfig struct {
	Dir   string // the cluster's trust files (clustertls.Generate)
	Token string // the nodes' token
	Count int
}

type simNodeInfo struct {
	Name, Tag, Addr, PlainAddr string
}

type simNodeStats struct {
	Creates, Conns []int64
}

// simNodesMain serves the simulated nodes of the config read from in.
func simNodesMain(in io.Reader, out io.Writer) error {
	dec := json.NewDecoder(in)
	var cfg simNodesConfig
	if err := dec.Decode(&cfg); err != nil {
		return err
	}
	trust, err := clustertls.LoadNode(cfg.Dir, []string{"127.0.0.1"}, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	// One configuration for every handshake: the files do not change
	// during a run.
	tc, err := trust.ServerConfig().GetConfigForClient(nil)
	if err != nil {
		return err
	}
	var nodes []*simNode
	var infos []simNodeInfo
	for i := range cfg.Count {
		n := newSimNode(fmt.Sprintf("sim%02d", i), fmt.Sprintf("s%02d", i), cfg.Token, tc)
		nodes = append(nodes, n)
		info := simNodeInfo{Name: n.name, Tag: n.tag}
		if info.Addr, err = n.listen(true); err == nil {
			info.PlainAddr, err = n.listen(false)
		}
		if err != nil {
			return err
		}
		infos = append(infos, info)
	}
	enc := json.NewEncoder(out)
	if err := enc.Encode(infos); err != nil {
		return err
	}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		var st simNodeStats
		for _, n := range nodes {
			st.Creates = append(st.Creates, n.creates.Load())
			st.Conns = append(st.Conns, n.conns.Load())
		}
		if err := enc.Encode(st); err != nil {
			return err
		}
	}
	return nil
}

// simNodesProc is the process of the simulated nodes, seen from the bench.
type simNodesProc struct {
	nodes []simNodeInfo
	cmd   interface{ Wait() error }
	pid   int
	in    io.WriteCloser
	out   *json.Decoder
}

// stats asks the nodes' process for its counters.
func (p *simNodesProc) stats() (simNodeStats, error) {
	var st simNodeStats
	if _, err := io.WriteString(p.in, "stats\n"); err != nil {
		return st, err
	}
	err := p.out.Decode(&st)
	return st, err
}

func (p *simNodesProc) stop() {
	p.in.Close()
	p.cmd.Wait()
}

// record is the node's record as the gateway's nodes file gives it:
// ready, with room for anything the bench creates.
func (i simNodeInfo) record(plain bool) api.Node {
	addr := i.Addr
	if plain {
		addr = i.PlainAddr
	}
	return api.Node{Name: i.Name, Tag: i.Tag, Address: addr, State: api.NodeReady,
		Capacity: api.NodeResources{CPUs: 1e6, MemoryBytes: 1 << 50, DiskBytes: 1 << 60, Sandboxes: 1 << 30},
		Pools:    map[string]int{"image:host": 4}}
}

// maybeSimNodes runs this process as the simulated nodes' when the bench
// started it so, and exits.
func maybeSimNodes() {
	if os.Getenv(simNodeEnv) != "1" {
		return
	}
	if err := simNodesMain(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "simulated nodes:", err)
		os.Exit(1)
	}
	os.Exit(0)
}
