package mcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// search_files walks a sandbox's tree through the daemon's file API, which
// resolves every path under the sandbox's root: the server never joins a
// path on the host. Every dimension is bounded so that a big tree neither
// floods a model's context nor keeps the daemon reading.
const (
	defaultSearchResults = 100
	maxSearchResults     = 1000
	// maxSearchWalk caps the entries a search visits.
	maxSearchWalk = 100000
	// defaultSearchBytes and maxSearchBytes cap the bytes a content search
	// reads in all; maxSearchFileBytes what it reads of each file.
	defaultSearchBytes = 16 << 20
	maxSearchBytes     = 256 << 20
	maxSearchFileBytes = 1 << 20
	// binarySniff is how much of a file is looked at for a NUL, as grep
	// does, to skip binary files.
	binarySniff = 8000
	// maxMatchText caps the line shown with a content match.
	maxMatchText   = 200
	maxSearchDepth = 32
)

// SearchFilesIn is the search_files tool's input.
type SearchFilesIn struct {
	SandboxRef
	Path       string `json:"path,omitempty" jsonschema:"the absolute directory to search under (default /)"`
	Name       string `json:"name,omitempty" jsonschema:"a glob (*, ?, [...]) on the file's name, or with a / on its path below path (e.g. src/*.go)"`
	Content    string `json:"content,omitempty" jsonschema:"a substring that matching files contain (regular text files only); each matching line is a result"`
	IgnoreCase bool   `json:"ignore_case,omitempty" jsonschema:"match content without regard to case"`
	Depth      int    `json:"depth,omitempty" jsonschema:"how deep to descend below path (default and at most 32)"`
	MaxResults int    `json:"max_results,omitempty" jsonschema:"results to return (default 100, at most 1000)"`
	MaxBytes   int64  `json:"max_bytes,omitempty" jsonschema:"bytes of file content to read in all (default 16 MiB, at most 256 MiB); files are read up to 1 MiB each"`
}

// SearchMatch is one result: a file whose name matched, or with a content
// search one line of a file that holds the substring.
type SearchMatch struct {
	FileOut
	Line int    `json:"line,omitempty" jsonschema:"the matching line's number, from 1 (content searches)"`
	Text string `json:"text,omitempty" jsonschema:"the matching line, cut to 200 bytes (content searches)"`
}

// SearchFilesOut is the search_files tool's output.
type SearchFilesOut struct {
	Matches []SearchMatch `json:"matches"`
	// Truncated says a bound stopped the search; Stopped names it.
	Truncated bool   `json:"truncated,omitempty"`
	Stopped   string `json:"stopped,omitempty" jsonschema:"the bound that stopped the search: max_results, max_bytes or walk (100000 entries)"`
	Visited   int    `json:"visited" jsonschema:"entries the walk visited"`
	Searched  int    `json:"files_searched,omitempty" jsonschema:"files whose content was searched"`
	BytesRead int64  `json:"bytes_read,omitempty"`
	// Partial counts files searched in their first 1 MiB only.
	Partial int `json:"files_partial,omitempty"`
}

// searchQuery is a checked SearchFilesIn.
type searchQuery struct {
	root, name, content string
	nameOnPath          bool
	ignoreCase          bool
	depth, maxResults   int
	maxBytes            int64
}

func checkSearch(in SearchFilesIn) (searchQuery, error) {
	q := searchQuery{root: in.Path, name: in.Name, content: in.Content, ignoreCase: in.IgnoreCase,
		depth: in.Depth, maxResults: in.MaxResults, maxBytes: in.MaxBytes}
	if q.root == "" {
		q.root = "/"
	}
	if err := checkPath(q.root); err != nil {
		return q, err
	}
	q.root = path.Clean(q.root)
	switch {
	case q.name == "" && q.content == "":
		return q, errors.New("name or content: say what to search for")
	case len(q.name) > 1024 || len(q.content) > 1024:
		return q, errors.New("name and content: at most 1024 bytes each")
	case q.depth < 0 || q.depth > maxSearchDepth:
		return q, fmt.Errorf("depth: must be 1 to %d", maxSearchDepth)
	case q.maxResults < 0 || q.maxResults > maxSearchResults:
		return q, fmt.Errorf("max_results: must be 1 to %d", maxSearchResults)
	case q.maxBytes < 0 || q.maxBytes > maxSearchBytes:
		return q, fmt.Errorf("max_bytes: must be 1 to %d", maxSearchBytes)
	}
	if q.name != "" {
		q.name = strings.TrimPrefix(q.name, "/")
		if _, err := path.Match(q.name, ""); err != nil {
			return q, fmt.Errorf("name %q: %w", in.Name, err)
		}
		q.nameOnPath = strings.Contains(q.name, "/")
	}
	if q.depth == 0 {
		q.depth = maxSearchDepth
	}
	if q.maxResults == 0 {
		q.maxResults = defaultSearchResults
	}
	if q.maxBytes == 0 {
		q.maxBytes = defaultSearchBytes
	}
	if q.ignoreCase {
		q.content = strings.ToLower(q.content)
	}
	return q, nil
}

// nameMatches applies the name glob to an entry's base name, or to its
// path below the root when the glob has a slash.
func (q *searchQuery) nameMatches(p string) bool {
	if q.name == "" {
		return true
	}
	if !q.nameOnPath {
		ok, _ := path.Match(q.name, path.Base(p))
		return ok
	}
	rel := strings.TrimPrefix(strings.TrimPrefix(p, q.root), "/")
	ok, _ := path.Match(q.name, rel)
	return ok
}

func (t *tools) searchFiles(ctx context.Context, _ *sdk.CallToolRequest, in SearchFilesIn) (*sdk.CallToolResult, SearchFilesOut, error) {
	id, err := t.target(in.Sandbox)
	if err != nil {
		return nil, SearchFilesOut{}, err
	}
	q, err := checkSearch(in)
	if err != nil {
		return nil, SearchFilesOut{}, err
	}
	out := SearchFilesOut{Matches: []SearchMatch{}}
	stop := func(why string) error {
		out.Truncated, out.Stopped = true, why
		return errEnough
	}
	// The walk is one streamed listing; a content search reads the files
	// it names after it, so the listing is not held open meanwhile.
	var files []api.FileInfo
	err = t.c.ListFilesFunc(ctx, id, q.root, q.depth, func(fi client.FileInfo) error {
		if out.Visited == maxSearchWalk {
			return stop("walk")
		}
		out.Visited++
		if fi.Path == q.root || !q.nameMatches(fi.Path) {
			return nil
		}
		if q.content != "" {
			if fi.Type == api.TypeFile && fi.Size > 0 {
				files = append(files, fi)
			}
			return nil
		}
		if len(out.Matches) == q.maxResults {
			return stop("max_results")
		}
		out.Matches = append(out.Matches, SearchMatch{FileOut: fileOf(&fi)})
		return nil
	})
	if err != nil && !errors.Is(err, errEnough) {
		return nil, SearchFilesOut{}, fmt.Errorf("searching %s in %s: %w", q.root, id, err)
	}
	for _, fi := range files {
		if err := t.searchContent(ctx, id, &q, fi, &out); errors.Is(err, errEnough) {
			break
		} else if err != nil {
			return nil, SearchFilesOut{}, err
		}
	}
	return nil, out, nil
}

// searchContent adds fi's lines that hold q.content to out; errEnough
// says a bound is reached (out says which).
func (t *tools) searchContent(ctx context.Context, id string, q *searchQuery, fi api.FileInfo, out *SearchFilesOut) error {
	limit := min(fi.Size, maxSearchFileBytes, q.maxBytes-out.BytesRead)
	if limit <= 0 {
		out.Truncated, out.Stopped = true, "max_bytes"
		return errEnough
	}
	rc, err := t.c.ReadFileRange(ctx, id, fi.Path, 0, limit)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return nil // gone or unreadable since the walk: not a match
	}
	b, err := io.ReadAll(io.LimitReader(rc, limit))
	rc.Close()
	if err != nil {
		return nil
	}
	out.BytesRead += int64(len(b))
	if bytes.IndexByte(b[:min(len(b), binarySniff)], 0) >= 0 {
		return nil
	}
	out.Searched++
	if fi.Size > limit {
		out.Partial++
	}
	needle := []byte(q.content)
	for n := 1; len(b) > 0; n++ {
		line, rest, _ := bytes.Cut(b, []byte{'\n'})
		b = rest
		hay := line
		if q.ignoreCase {
			hay = bytes.ToLower(line)
		}
		if !bytes.Contains(hay, needle) {
			continue
		}
		if len(out.Matches) == q.maxResults {
			out.Truncated, out.Stopped = true, "max_results"
			return errEnough
		}
		text := line[:min(len(line), maxMatchText)]
		out.Matches = append(out.Matches, SearchMatch{FileOut: fileOf(&fi), Line: n,
			Text: strings.ToValidUTF8(string(bytes.TrimRight(text, "\r")), "\uFFFD")})
	}
	return nil
}
