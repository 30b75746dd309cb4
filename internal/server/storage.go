package server

import (
	"net/http"

	"github.com/paddock-dev/paddock/api"
)

// storageRoutes serve volumes, snapshots and forks.
func (s *Server) storageRoutes() []route {
	return []route{
		{"POST /v1/sandboxes/{id}/snapshots", s.takeSnapshot},
		{"GET /v1/sandboxes/{id}/snapshots", s.listSnapshots},
		{"POST /v1/sandboxes/{id}/fork", s.fork},
		{"GET /v1/snapshots", s.listSnapshots},
		{"GET /v1/snapshots/{snap}", s.getSnapshot},
		{"DELETE /v1/snapshots/{snap}", s.removeSnapshot},
		{"POST /v1/volumes", s.createVolume},
		{"GET /v1/volumes", s.listVolumes},
		{"GET /v1/volumes/{name}", s.getVolume},
		{"DELETE /v1/volumes/{name}", s.removeVolume},
	}
}

func (s *Server) takeSnapshot(w http.ResponseWriter, r *http.Request) {
	var req api.SnapshotRequest
	if r.ContentLength != 0 {
		if err := decode(w, r, &req); err != nil {
			writeError(w, r, s.log, err)
			return
		}
	}
	snap, err := s.mgr.Snapshots().CreateIn(r.Context(), r.PathValue("id"), containerOf(r.Context()), req)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	writeJSON(w, http.StatusCreated, snap)
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if id == "" {
		id = r.URL.Query().Get("sandbox")
	}
	snaps, err := s.mgr.Snapshots().List(r.Context(), id)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	writeJSON(w, http.StatusOK, snaps)
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) {
	snap, err := s.mgr.Snapshots().Get(r.Context(), r.PathValue("snap"))
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	writeJSON(w, http.StatusOK, snap)
}

func (s *Server) removeSnapshot(w http.ResponseWriter, r *http.Request) {
	if err := s.mgr.Snapshots().Remove(r.Context(), r.PathValue("snap")); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	var req api.ForkRequest
	if r.ContentLength != 0 {
		if err := decode(w, r, &req); err != nil {
			writeError(w, r, s.log, err)
			return
		}
	}
	res, err := s.mgr.Fork(r.Context(), r.PathValue("id"), req)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	writeJSON(w, http.StatusCreated, res)
}

func (s *Server) createVolume(w http.ResponseWriter, r *http.Request) {
	var req api.VolumeRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	v, err := s.mgr.Volumes().Create(r.Context(), req)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	writeJSON(w, http.StatusCreated, v)
}

func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request) {
	vols, err := s.mgr.Volumes().List(r.Context())
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	writeJSON(w, http.StatusOK, vols)
}

func (s *Server) getVolume(w http.ResponseWriter, r *http.Request) {
	v, err := s.mgr.Volumes().Get(r.Context(), r.PathValue("name"))
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (s *Server) removeVolume(w http.ResponseWriter, r *http.Request) {
	if err := s.mgr.Volumes().Remove(r.Context(), r.PathValue("name")); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
