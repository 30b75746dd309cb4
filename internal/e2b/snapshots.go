package e2b

import (
	"context"
	"errors"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// E2B's snapshots are paddock's snapshots of a whole sandbox; a name
// given to one is kept in the snapshot's labels as "NAME:TAG" (E2B's
// default tag is "default"). Forks are paddock's forks.

const (
	labelSnapshotName  = "e2b.snapshot-name"
	defaultSnapshotTag = "default"
	// defaultForkTimeout is the lifetime of forks when the request names
	// none: E2B's documented default for a fork.
	defaultForkTimeout = 15
)

var snapshotNamePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}(:[a-z0-9][a-z0-9._-]{0,62})?$`)

// parseSnapshotName splits an E2B snapshot name into name and tag (""
// when not tag-qualified); ok is false for what cannot be a name.
func parseSnapshotName(s string) (name, tag string, ok bool) {
	if !snapshotNamePattern.MatchString(s) {
		return "", "", false
	}
	name, tag, _ = strings.Cut(s, ":")
	return name, tag, true
}

// snapshotInfo is E2B's description of a snapshot.
type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func infoOf(snap api.Snapshot) snapshotInfo {
	si := snapshotInfo{SnapshotID: snap.ID, Names: []string{}}
	if n := snap.Labels[labelSnapshotName]; n != "" {
		si.Names = append(si.Names, n)
	}
	return si
}

// createSnapshot captures the sandbox's filesystem (paddock freezes its
// processes only while the disk is copied; it keeps running) and, as
// E2B's snapshots do, its processes where its runtime keeps memory
// (gvisor): sandboxes made from it start with them running.
func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name string `json:"name"`
	}
	if err := decodeBody(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	var labels map[string]string
	if req.Name != "" {
		name, tag, ok := parseSnapshotName(req.Name)
		if !ok {
			s.fail(w, r, errdefs.Invalid("name", "%q is not NAME or NAME:TAG (lowercase letters, digits, '.', '_' and '-', 1 to 63 each)", req.Name))
			return
		}
		if name == DefaultTemplate || name == "host" {
			s.fail(w, r, errdefs.Invalid("name", "%q is a built-in template's name", name))
			return
		}
		if tag == "" {
			tag = defaultSnapshotTag
		}
		labels = map[string]string{labelSnapshotName: name + ":" + tag}
	}
	id := r.PathValue("id")
	snap, err := s.mgr.Snapshots().Create(r.Context(), id, api.SnapshotRequest{Labels: labels, Memory: s.mgr.KeepsMemory(id)})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, infoOf(snap))
}

// snapshotsNamed returns the whole-sandbox snapshots that ref names: its
// id, NAME:TAG, or NAME (every tag of it), newest first.
func (s *Server) snapshotsNamed(ctx context.Context, sandbox, ref string) ([]api.Snapshot, error) {
	all, err := s.mgr.Snapshots().List(ctx, sandbox)
	if err != nil {
		return nil, err
	}
	name, tag, named := parseSnapshotName(ref)
	var out []api.Snapshot
	for _, snap := range all {
		if snap.Path != "" {
			continue // a directory snapshot starts no sandbox
		}
		if ref != "" && snap.ID != ref {
			n, t, _ := strings.Cut(snap.Labels[labelSnapshotName], ":")
			if !named || n != name || (tag != "" && t != tag) {
				continue
			}
		}
		out = append(out, snap)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.After(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// snapshotFor resolves a create's templateID that names a snapshot by
// NAME or NAME:TAG (an untagged name is its default tag) to the newest
// snapshot of it; "" when it names none, and the templateID then goes to
// paddock as it is (an image, a template or a snapshot id).
func (s *Server) snapshotFor(ctx context.Context, template string) string {
	name, tag, ok := parseSnapshotName(template)
	if !ok {
		return ""
	}
	if tag == "" {
		tag = defaultSnapshotTag
	}
	snaps, err := s.snapshotsNamed(ctx, "", name+":"+tag)
	if err != nil || len(snaps) == 0 {
		return ""
	}
	return snaps[0].ID
}

// listSnapshots pages through the snapshots, newest first: all, those of
// ?sandboxID=, or those ?name= names (an id, NAME or NAME:TAG).
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	sandbox := q.Get("sandboxID")
	name := q.Get("name")
	if len(name) > 256 || strings.ContainsRune(name, 0) {
		s.fail(w, r, errdefs.Invalid("name", "is not a snapshot name or id"))
		return
	}
	limit, err := limitParam(q.Get("limit"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	all, err := s.snapshotsNamed(r.Context(), sandbox, name)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	start, err := pageStart(q.Get("nextToken"), len(all), func(i int) (time.Time, string) { return all[i].CreatedAt, all[i].ID }, false)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	page := all[start:]
	if len(page) > limit {
		w.Header().Set("X-Next-Token", pageToken(page[limit].CreatedAt, page[limit].ID))
		page = page[:limit]
	}
	out := make([]snapshotInfo, 0, len(page))
	for _, snap := range page {
		out = append(out, infoOf(snap))
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteSnapshot is DELETE /templates/{id} for a snapshot: an id removes
// that snapshot, a name all of its tags (NAME:TAG, that tag's). Other
// templates are not the facade's to delete: 404.
func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	ref := r.PathValue("id")
	snaps, err := s.snapshotsNamed(r.Context(), "", ref)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if len(snaps) == 0 {
		s.fail(w, r, errdefs.NotFound("snapshot", ref))
		return
	}
	for _, snap := range snaps {
		if err := s.mgr.Snapshots().Remove(r.Context(), snap.ID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			s.fail(w, r, err)
			return
		}
	}
	s.sweepSoon()
	w.WriteHeader(http.StatusNoContent)
}

// fork is paddock's fork: the sandbox's filesystem is captured once (its
// processes frozen only for the copy) and count sandboxes start from it,
// each with its environment, limits, network policy and lifecycle, and
// timeout seconds to live. Where the sandbox's runtime keeps memory
// (gvisor) the forks carry copies of its running processes, as E2B's do;
// on native they start afresh from its files.
func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Count   *int64 `json:"count"`
		Timeout *int64 `json:"timeout"`
	}
	if err := decodeBody(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	count := int64(1)
	if req.Count != nil {
		count = *req.Count
	}
	if count < 1 || count > maxForks {
		s.fail(w, r, errdefs.Invalid("count", "%d is not 1 to %d", count, maxForks))
		return
	}
	timeout, err := timeoutParam(req.Timeout, defaultForkTimeout)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	res, err := s.mgr.Fork(r.Context(), r.PathValue("id"), api.ForkRequest{Count: int(count)})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	type result struct {
		Sandbox *sandboxRef `json:"sandbox,omitempty"`
		Error   *apiError   `json:"error,omitempty"`
	}
	out := make([]result, len(res.Sandboxes))
	for i, sb := range res.Sandboxes {
		if _, err := s.mgr.SetTimeout(r.Context(), sb.ID, time.Duration(timeout)*time.Second); err != nil {
			out[i].Error = &apiError{Code: errdefs.HTTPStatus(err), Message: err.Error()}
			s.mgr.Remove(context.Background(), sb.ID, true)
			continue
		}
		ref := s.ref(sb)
		out[i].Sandbox = &ref
	}
	writeJSON(w, http.StatusCreated, out)
}

// maxForks is the most forks one request makes (paddock's bound).
const maxForks = 64

// limitParam reads a page size: 1 to maxListLimit, 100 when not given.
func limitParam(v string) (int, error) {
	if v == "" {
		return 100, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxListLimit {
		return 0, errdefs.Invalid("limit", "%q is not 1 to %d", v, maxListLimit)
	}
	return n, nil
}
