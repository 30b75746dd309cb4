package guest

// PortRequest holds the arguments of the port ops.
type PortRequest struct {
	Port int `json:"port,omitempty"`
}
