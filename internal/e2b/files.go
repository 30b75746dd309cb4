package e2b

import (
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/sandbox"
)

// envd's REST /files: GET downloads one file, POST uploads one or more
// (multipart, field "file"; or the raw body as application/octet-stream),
// either optionally gzip-encoded.

// fileUser is the user of a /files call: the signed user for a signed
// URL (see grant), else ?username=, else Basic auth, else the default.
func fileUser(r *http.Request) (string, error) {
	if g, ok := grantOf(r); ok {
		return g.user, nil
	}
	if u := r.URL.Query().Get("username"); u != "" {
		return u, validUser(u)
	}
	return userOf(r)
}

// grant is what a signed /files URL allows, and nothing more: one
// operation on one path, as one user. The access token allows everything.
type grant struct {
	op   string // "read" or "write"
	path string // as signed, never empty
	user string // as signed; DefaultUser when the signature named none
}

type grantKey struct{}

// grantOf returns the grant of a call authorised by a signature.
func grantOf(r *http.Request) (grant, bool) {
	g, ok := r.Context().Value(grantKey{}).(grant)
	return g, ok
}

// checkSignature verifies a signed /files URL and returns what it grants.
// The signature is "v1_" and the unpadded base64 of
// sha256("path:operation:user:token[:expiration]"), as envd computes it;
// an empty user stands for the default one. The user a call runs as is
// then the signed one whatever the request's Authorization says (a Basic
// header naming another user is refused), and the path is the signed
// one: a signature over no path grants nothing (envd would take the
// upload's part names as paths).
func (s *Server) checkSignature(r *http.Request, id string) (grant, error) {
	q := r.URL.Query()
	for _, k := range []string{"path", "username", "signature", "signature_expiration"} {
		if len(q[k]) > 1 {
			return grant{}, fmt.Errorf("%s is given more than once", k)
		}
	}
	g := grant{op: "read", path: q.Get("path"), user: q.Get("username")}
	if r.Method == http.MethodPost {
		g.op = "write"
	}
	exp := q.Get("signature_expiration")
	if !s.signedBy(q, g.op, s.accessToken(id)) {
		return grant{}, errors.New("invalid signature")
	}
	if exp != "" {
		n, err := strconv.ParseInt(exp, 10, 64)
		if err != nil {
			return grant{}, errors.New("signature_expiration is not a Unix time")
		}
		if time.Now().Unix() > n {
			return grant{}, errors.New("signature is already expired")
		}
	}
	if g.path == "" {
		return grant{}, errors.New("the signature names no path; sign the URL for the file it is for")
	}
	if g.user == "" {
		g.user = DefaultUser
	} else if err := validUser(g.user); err != nil {
		return grant{}, err
	}
	if r.Header.Get("Authorization") != "" {
		if u, err := userOf(r); err != nil || u != g.user {
			return grant{}, fmt.Errorf("the signature is for user %q; the Authorization header names another", g.user)
		}
	}
	return g, nil
}

// signedBy reports whether q's signature is envd's for operation op
// under access token token.
func (s *Server) signedBy(q url.Values, op, token string) bool {
	raw := q.Get("path") + ":" + op + ":" + q.Get("username") + ":" + token
	if exp := q.Get("signature_expiration"); exp != "" {
		raw += ":" + exp
	}
	sum := sha256.Sum256([]byte(raw))
	want := "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
	return subtle.ConstantTimeCompare([]byte(q.Get("signature")), []byte(want)) == 1
}

// signer finds the sandbox whose access token signed r (a /files URL
// that names no sandbox): "" when none did. A URL names its sandbox only
// by its host (49983-ID.DOMAIN, served before this); on the facade's own
// name (E2B_SANDBOX_URL) the signature is all there is, a hash over the
// token that cannot be inverted. So the first fetch of a URL tries each
// sandbox's token, a hash each, and the signature is remembered: fetching
// it again costs one hash.
func (s *Server) signer(r *http.Request) string {
	return s.signerOf(r.Context(), r.URL.Query(), signedOp(r.Method))
}

// signedOp is the operation a signed /files URL fetched with method is
// for.
func signedOp(method string) string {
	if method == http.MethodPost {
		return "write"
	}
	return "read"
}

// SignerPath is where a cluster's gateway, which holds no sandbox's
// token, asks a node's facade (with the node's API key) which of its
// sandboxes signed a /files URL that names none: the URL's query, and
// method=GET or POST. The answer is {"sandboxID": ID}, or 404.
const SignerPath = "/paddock/signer"

func (s *Server) lookupSigner(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if !q.Has("signature") {
		writeAPIError(w, http.StatusBadRequest, "signature: required")
		return
	}
	id := s.signerOf(r.Context(), q, signedOp(q.Get("method")))
	if id == "" {
		writeAPIError(w, http.StatusNotFound, "invalid signature")
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"sandboxID": id})
}

func (s *Server) signerOf(ctx context.Context, q url.Values, op string) string {
	sig := q.Get("signature")
	s.mu.Lock()
	id, ok := s.signers[sig]
	s.mu.Unlock()
	if ok && s.signedBy(q, op, s.accessToken(id)) {
		return id
	}
	sbs := s.mgr.List(ctx, sandbox.Filter{})
	ids := make([]string, len(sbs))
	for i, sb := range sbs {
		ids[i] = sb.ID
	}
	if id = s.signerAmong(q, op, ids); id != "" {
		s.mu.Lock()
		if len(s.signers) >= maxSigners {
			clear(s.signers)
		}
		s.signers[sig] = id
		s.mu.Unlock()
	}
	return id
}

// maxSigners bounds the signatures remembered (about 200 bytes each).
const maxSigners = 4096

// signerAmong is the sandbox of ids whose token signed q, or "".
func (s *Server) signerAmong(q url.Values, op string, ids []string) string {
	for _, id := range ids {
		if s.signedBy(q, op, s.accessToken(id)) {
			return id
		}
	}
	return ""
}

func (s *Server) download(w http.ResponseWriter, r *http.Request) {
	user, err := fileUser(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	p := r.URL.Query().Get("path")
	if p == "" || strings.ContainsRune(p, 0) {
		s.fail(w, r, errdefs.Invalid("path", "must name a file"))
		return
	}
	p = resolve(user, p)
	gc, err := s.guestOf(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	resp, data, err := gc.ReadFile(r.Context(), guestapi.FileRequest{Path: p})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer data.Close()
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": path.Base(p)}))
	var out io.Writer = w
	if acceptsGzip(r) {
		h.Set("Content-Encoding", "gzip")
		h.Add("Vary", "Accept-Encoding")
		// Large chunks: a client's gunzip pays per chunk, and the
		// compressor's own writes are small.
		bw := bufio.NewWriterSize(w, 256<<10)
		zw, _ := gzip.NewWriterLevel(bw, gzip.BestSpeed)
		defer bw.Flush()
		defer zw.Close()
		out = zw
	} else if resp.Length >= 0 {
		h.Set("Content-Length", strconv.FormatInt(resp.Length, 10))
	}
	w.WriteHeader(http.StatusOK)
	if _, err := data.WriteTo(out); err != nil {
		// The status is sent: a cut connection is all the client can
		// be told.
		s.log.Debug("download cut", "sandbox", sandboxID(r), "path", p, "err", err)
		panic(http.ErrAbortHandler)
	}
}

func acceptsGzip(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept-Encoding"), ",") {
		name, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.TrimSpace(name) == "gzip" && !strings.Contains(strings.ReplaceAll(params, " ", ""), "q=0") {
			return true
		}
	}
	return false
}

// writtenFile is one entry of an upload's answer.
type writtenFile struct {
	Path     string            `json:"path"`
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	user, err := fileUser(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	q := r.URL.Query().Get("path")
	if strings.ContainsRune(q, 0) {
		s.fail(w, r, errdefs.Invalid("path", "contains a NUL byte"))
		return
	}
	body, err := decoded(r.Header.Get("Content-Encoding"), r.Body)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	meta, err := metadataHeaders(r.Header)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	ct, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var out []writtenFile
	switch ct {
	case "multipart/form-data":
		out, err = s.uploadParts(r, user, q, meta, multipart.NewReader(body, params["boundary"]))
	case "application/octet-stream", "":
		if q == "" {
			err = errdefs.Invalid("path", "an octet-stream upload needs ?path=")
			break
		}
		var f writtenFile
		if f, err = s.writeFile(r, user, q, meta, body); err == nil {
			out = append(out, f)
		}
	default:
		err = errdefs.Invalid("content-type", "%q is neither multipart/form-data nor application/octet-stream", ct)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func decoded(encoding string, body io.Reader) (io.Reader, error) {
	switch strings.ToLower(strings.TrimSpace(encoding)) {
	case "", "identity":
		return body, nil
	case "gzip":
		zr, err := gzip.NewReader(body)
		if err != nil {
			return nil, errdefs.Invalid("body", "not gzip data: %v", err)
		}
		return zr, nil
	}
	return nil, errdefs.Invalid("content-encoding", "%q is not supported (gzip is)", encoding)
}

// uploadParts writes each "file" part: to ?path= when it is given and
// there is one part, else to the part's file name. A signed upload writes
// one part, to the signed path.
func (s *Server) uploadParts(r *http.Request, user, target string, meta map[string]string, mr *multipart.Reader) ([]writtenFile, error) {
	_, signed := grantOf(r)
	var out []writtenFile
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, errdefs.Invalid("body", "malformed multipart data: %v", err)
		}
		if part.FormName() != "file" {
			part.Close()
			continue
		}
		if signed && len(out) > 0 {
			return nil, errdefs.Invalid("file", "a signed upload writes one file, to the signed path; this one has more parts")
		}
		dest := target
		if dest == "" || len(out) > 0 {
			// The raw file name: Part.FileName keeps only its base, and
			// the SDKs send the whole path there.
			_, params, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			dest = params["filename"]
		}
		if dest == "" {
			return nil, errdefs.Invalid("path", "a part has no file name and no ?path= was given")
		}
		f, err := s.writeFile(r, user, dest, meta, part)
		part.Close()
		if err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	if len(out) == 0 {
		return nil, errdefs.Invalid("file", "no file part in the upload")
	}
	return out, nil
}

// writeFile writes src to p as user (the owner of the file and of
// missing parents), with the metadata meta (xattr names) and no other.
func (s *Server) writeFile(r *http.Request, user, p string, meta map[string]string, src io.Reader) (writtenFile, error) {
	if strings.ContainsRune(p, 0) {
		return writtenFile{}, errdefs.Invalid("path", "contains a NUL byte")
	}
	p = resolve(user, p)
	gc, err := s.guestOf(r)
	if err != nil {
		return writtenFile{}, err
	}
	end, err := gc.WriteFile(r.Context(), guestapi.FileRequest{Path: p, Owner: user, Xattrs: meta, XattrPrefix: metadataXattr}, src)
	if err != nil {
		var se *guestapi.SourceError
		if errors.As(err, &se) {
			return writtenFile{}, errdefs.Invalid("body", "reading the upload: %v", se.Err)
		}
		return writtenFile{}, fmt.Errorf("writing %s: %w", p, err)
	}
	f := writtenFile{Path: p, Name: path.Base(p), Type: "file"}
	if end != nil && end.Info != nil {
		f.Name = end.Info.Name
		if end.Info.Type == api.TypeDir {
			f.Type = "dir"
		}
		f.Metadata = fileMetadata(end.Info.Xattrs)
	}
	return f, nil
}
