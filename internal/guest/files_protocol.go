package guest

// FileRequest holds the arguments of the file ops.
type FileRequest struct {
	Path string `json:"path,omitempty"`
}

// FileResponse holds the answers of the file ops.
type FileResponse struct{}
