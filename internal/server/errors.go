package server

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// HTTPError keeps what the client sees apart from what is logged.
type HTTPError struct {
	Code int    // status sent to the client
	Msg  string // message sent to the client
	Err  error  // detail logged on the server
}

func (e *HTTPError) Error() string { return e.Msg }
func (e *HTTPError) Unwrap() error { return e.Err }

// status is the HTTP status an error answers with: an HTTPError's own,
// else its category's (errdefs.HTTPStatus).
func status(err error) int {
	if he := (*HTTPError)(nil); errors.As(err, &he) {
		return he.Code
	}
	return errdefs.HTTPStatus(err)
}

// writeError sends err as a JSON {code, message} body with its status.
// Internal errors are logged with their detail and reach the client as a
// generic message.
func writeError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	code, body := errorBody(r, log, err)
	if me := (*errdefs.MovedError)(nil); errors.As(err, &me) {
		w.Header().Set(errdefs.MovedHeader, me.Node)
	}
	writeJSON(w, code, body)
}

// WriteError is writeError for a cluster's gateway, whose own errors (an
// unknown node, a lost one) answer as the daemon's do.
func WriteError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	writeError(w, r, log, err)
}

// ErrorFrame is the payload of an exec lane's error frame for err, with
// the status it would have answered with.
func ErrorFrame(r *http.Request, log *slog.Logger, err error) api.Error {
	code, body := errorBody(r, log, err)
	body.Status = code
	return body
}

// errorBody is the status and body an error answers with; streams that
// already sent their status carry the body in their last frame.
func errorBody(r *http.Request, log *slog.Logger, err error) (int, api.Error) {
	code := status(err)
	body := api.Error{Code: errdefs.Code(err), Message: err.Error()}
	var he *HTTPError
	if errors.As(err, &he) {
		body.Message = he.Msg
		if he.Err != nil {
			body.Code = errdefs.Code(he.Err)
		}
		if code == http.StatusUnauthorized {
			body.Code = "unauthenticated"
		}
	}
	switch {
	case code == http.StatusInsufficientStorage && !errors.Is(err, errdefs.ErrNoSpace):
		// A bare ENOSPC names host paths: the client gets the category.
		log.Warn("request failed: out of space", "method", r.Method, "path", r.URL.Path, "err", err)
		body.Message = "no space left on the host's storage; see the daemon log"
	case code >= 500 && code != http.StatusServiceUnavailable && code != http.StatusInsufficientStorage:
		log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		body.Code = "internal"
		body.Message = "internal error; see the daemon log"
	default:
		log.Debug("request refused", "method", r.Method, "path", r.URL.Path, "status", code, "err", err)
	}
	return code, body
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	if v != nil {
		json.NewEncoder(w).Encode(v)
	}
}
