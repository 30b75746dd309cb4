package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/paddock-dev/paddock/api"
)

// Images lists the images: the built-in host image and every OCI image.
func (c *Client) Images(ctx context.Context) ([]api.Image, error) {
	var out []api.Image
	return out, c.do(ctx, http.MethodGet, "/v1/images", nil, &out)
}

// GetImage describes an image, by name, ID or digest, and who uses it.
func (c *Client) GetImage(ctx context.Context, ref string) (*api.Image, error) {
	var img api.Image
	return &img, c.do(ctx, http.MethodGet, "/v1/images/inspect?name="+url.QueryEscape(ref), nil, &img)
}

// DeleteImage removes an image; refused (ErrConflict) while a sandbox or
// snapshot was made from it. Given one of several names of an image, it
// removes only that name.
func (c *Client) DeleteImage(ctx context.Context, ref string) error {
	return c.do(ctx, http.MethodDelete, "/v1/images?name="+url.QueryEscape(ref), nil, nil)
}

// ImportImage uploads an image archive (`docker save` output or an OCI
// layout as a tar, optionally gzip-compressed), streamed from r, and
// stores it under name (or, if name is empty, the names in the archive).
func (c *Client) ImportImage(ctx context.Context, r io.Reader, name string) (*api.Image, error) {
	path := "/v1/images/import"
	if name != "" {
		path += "?name=" + url.QueryEscape(name)
	}
	req, err := c.newRequest(ctx, http.MethodPost, path, nil)
	if err != nil {
		return nil, err
	}
	req.Body = io.NopCloser(r)
	req.Header.Set("Content-Type", "application/x-tar")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return nil, readError(resp)
	}
	var img api.Image
	if err := json.NewDecoder(resp.Body).Decode(&img); err != nil {
		return nil, fmt.Errorf("decoding import answer: %w", err)
	}
	return &img, nil
}

// PullImage pulls an image from a registry. With progress set, it is
// called with each progress line while the pull runs.
func (c *Client) PullImage(ctx context.Context, pr api.PullRequest, progress func(api.PullEvent)) (*api.Image, error) {
	if progress == nil {
		var img api.Image
		return &img, c.do(ctx, http.MethodPost, "/v1/images/pull", pr, &img)
	}
	req, err := c.newRequest(ctx, http.MethodPost, "/v1/images/pull", pr)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return nil, readError(resp)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		var e api.PullEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("decoding pull progress: %w", err)
		}
		switch {
		case e.Error != nil:
			return nil, &Error{Status: resp.StatusCode, Code: e.Error.Code, Message: e.Error.Message}
		case e.Image != nil:
			progress(e)
			return e.Image, nil
		}
		progress(e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: reading pull progress: %v", ErrUnavailable, err)
	}
	return nil, errors.New("the daemon ended the pull without a result")
}
