package client

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
)

// MetricsOptions select a metrics history. Zero fields take the daemon's
// defaults (the last 15 minutes).
type MetricsOptions struct {
	Since, Until time.Time
}

// Metrics returns a sandbox's current metrics and their history.
func (c *Client) Metrics(ctx context.Context, id string, opts MetricsOptions) (*api.Metrics, error) {
	q := url.Values{}
	if !opts.Since.IsZero() {
		q.Set("since", opts.Since.Format(time.RFC3339Nano))
	}
	if !opts.Until.IsZero() {
		q.Set("until", opts.Until.Format(time.RFC3339Nano))
	}
	var m api.Metrics
	return &m, c.do(ctx, http.MethodGet, withQuery("/v1/sandboxes/"+url.PathEscape(id)+"/metrics", q), nil, &m)
}

// AllMetrics returns the latest sample of every running sandbox.
func (c *Client) AllMetrics(ctx context.Context) ([]api.SandboxSample, error) {
	var out []api.SandboxSample
	return out, c.do(ctx, http.MethodGet, "/v1/metrics", nil, &out)
}

// Prometheus returns the daemon's Prometheus exposition, in the text
// format.
func (c *Client) Prometheus(ctx context.Context) ([]byte, error) {
	resp, err := c.get(ctx, "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// EventOptions select events.
type EventOptions struct {
	// After skips events up to this seq (resume after the last one seen).
	After uint64
	Since time.Time
	// Types keeps only these types ("exec", "oom", ...).
	Types []string
	// Limit caps the events returned (daemon default 100, at most 1000).
	Limit int
}

func (o EventOptions) query() url.Values {
	q := url.Values{}
	if o.After > 0 {
		q.Set("after", strconv.FormatUint(o.After, 10))
	}
	if !o.Since.IsZero() {
		q.Set("since", o.Since.Format(time.RFC3339Nano))
	}
	if len(o.Types) > 0 {
		q.Set("type", strings.Join(o.Types, ","))
	}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	return q
}

// Events returns a sandbox's retained events, oldest first.
func (c *Client) Events(ctx context.Context, id string, opts EventOptions) ([]api.Event, error) {
	var out api.Events
	err := c.do(ctx, http.MethodGet, withQuery("/v1/sandboxes/"+url.PathEscape(id)+"/events", opts.query()), nil, &out)
	return out.Events, err
}

// FollowEvents calls fn with each of a sandbox's events after opts.After,
// then with each new one as it happens, until ctx ends, fn fails or the
// sandbox is deleted.
func (c *Client) FollowEvents(ctx context.Context, id string, opts EventOptions, fn func(api.Event) error) error {
	q := opts.query()
	q.Set("follow", "1")
	resp, err := c.get(ctx, withQuery("/v1/sandboxes/"+url.PathEscape(id)+"/events", q))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var e api.Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return fmt.Errorf("decoding event: %w", err)
		}
		if err := fn(e); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return sc.Err()
}

// Logs lists the processes of a sandbox whose output the daemon kept.
func (c *Client) Logs(ctx context.Context, id string) ([]api.ExecLog, error) {
	var out []api.ExecLog
	return out, c.do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id)+"/logs", nil, &out)
}

// LogOptions select a process's kept output.
type LogOptions struct {
	// From is the output offset to start at.
	From int64
	// Follow waits for more output until the process ends.
	Follow bool
}

// Log opens the kept output of process pid (the newest with that pid) as
// a stream: Wait copies it out and returns the exit status, which is nil
// while the process runs and Follow is off.
func (c *Client) Log(ctx context.Context, id string, pid int, opts LogOptions) (*ExecStream, error) {
	q := url.Values{"exec": {strconv.Itoa(pid)}}
	if opts.From > 0 {
		q.Set("from", strconv.FormatInt(opts.From, 10))
	}
	if opts.Follow {
		q.Set("follow", "1")
	}
	s, err := c.openStream(ctx, http.MethodGet, withQuery("/v1/sandboxes/"+url.PathEscape(id)+"/logs", q), nil, false)
	if err != nil {
		return nil, err
	}
	s.off = opts.From
	s.eofOK = true
	return s, nil
}

func withQuery(path string, q url.Values) string {
	if len(q) == 0 {
		return path
	}
	return path + "?" + q.Encode()
}

// get sends a GET whose answer the caller reads.
func (c *Client) get(ctx context.Context, path string) (*http.Response, error) {
	req, err := c.newRequest(ctx, http.MethodGet, path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		return nil, readError(resp)
	}
	return resp, nil
}
